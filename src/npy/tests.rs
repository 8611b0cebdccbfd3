use super::*;

/// Outputs are read as they were stored: float32 stays float32 (not widened), float64 is
/// float64, and anything else is refused naming what the file holds.
#[test]
fn floats_are_read_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    let narrow = ndarray::Array2::from_shape_fn((3, 2), |(i, j)| i as f32 - 0.1 * j as f32);
    write(&p, &narrow).unwrap();
    assert_eq!(
        read_float_stored(&p, &[3, 2]).unwrap(),
        Stored::F32(narrow.clone().into_dyn())
    );
    let wide = narrow.mapv(|v| f64::from(v) + 1e-12);
    write(&p, &wide).unwrap();
    assert_eq!(
        read_float_stored(&p, &[3, 2]).unwrap(),
        Stored::F64(wide.into_dyn())
    );
    assert!(read_float_stored(&p, &[2, 3]).is_err());
    write(&p, &ndarray::Array1::<i32>::zeros(6)).unwrap();
    let err = read_float_stored(&p, &[6]).unwrap_err();
    assert!(
        err.contains("int32") && err.contains("float32 or float64"),
        "{err}"
    );
}

/// A bf16 input written a slice at a time is the float32 file of its widened values
/// (read back by the same reader as any case file): 1-, 2- and 3-dimensional, empty, a
/// transposed view (logical order), and more elements than one slice; the header is
/// padded to 64 bytes.
#[test]
fn bf16_inputs_are_written_as_float32() {
    use half::bf16;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.npy");
    let big = WIDEN_ELEMENTS + 7;
    let cases: Vec<ndarray::ArrayD<bf16>> = vec![
        ndarray::Array1::from_shape_fn(5, |i| bf16::from_f32(i as f32 * 0.3)).into_dyn(),
        ndarray::Array2::from_shape_fn((3, 4), |(i, j)| bf16::from_f32(i as f32 - j as f32 / 7.0))
            .into_dyn(),
        ndarray::Array3::from_shape_fn((2, 0, 3), |_| bf16::ONE).into_dyn(),
        ndarray::Array1::from_shape_fn(big, |i| bf16::from_f32((i % 1000) as f32 - 500.5))
            .into_dyn(),
    ];
    for a in &cases {
        write_input(&p, Input::Bf16AsF32(a.view())).unwrap();
        let got = read_f32(&p, a.shape()).unwrap();
        assert_eq!(got, a.mapv(f32::from), "{:?}", a.shape());
        let bytes = std::fs::read(&p).unwrap();
        let header = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!(header % 64, 0);
        assert_eq!(bytes.len(), header + 4 * a.len());
    }
    let t = ndarray::Array2::from_shape_fn((3, 4), |(i, j)| bf16::from_f32((i * 4 + j) as f32));
    write_input(&p, Input::Bf16AsF32(t.t().into_dyn())).unwrap();
    assert_eq!(
        read_f32(&p, &[4, 3]).unwrap(),
        t.t().mapv(f32::from).into_dyn()
    );
    // A borrowed float32 view is written as it is.
    let f = t.mapv(f32::from);
    write_input(&p, Input::F32(f.view().into_dyn())).unwrap();
    assert_eq!(read_f32(&p, &[3, 4]).unwrap(), f.into_dyn());
}

/// `a` sliced to the indices `r` of its first axis.
fn part(a: &Stored, r: std::ops::Range<usize>) -> Stored {
    let (axis, r) = (ndarray::Axis(0), ndarray::Slice::from(r));
    match a {
        Stored::F32(a) => Stored::F32(a.slice_axis(axis, r).to_owned()),
        Stored::F64(a) => Stored::F64(a.slice_axis(axis, r).to_owned()),
        other => panic!("not a float array: {other:?}"),
    }
}

/// An array of `shape` whose elements are numbered in logical C order (`f` of -40, -38.75,
/// ...), laid out in Fortran order when `fortran`.
fn numbered<A>(shape: &[usize], fortran: bool, f: impl Fn(f32) -> A) -> ArrayD<A> {
    use ndarray::ShapeBuilder as _;
    let at = |ix: ndarray::IxDyn| ix.slice().iter().zip(shape).fold(0, |n, (i, d)| n * d + i);
    let value = |ix| f(at(ix) as f32 * 1.25 - 40.0);
    match fortran {
        true => ArrayD::from_shape_fn(ndarray::IxDyn(shape).f(), value),
        false => ArrayD::from_shape_fn(ndarray::IxDyn(shape), value),
    }
}

/// Every range of `0..n`, empty ones included.
fn every_range(n: usize) -> Vec<std::ops::Range<usize>> {
    (0..=n).flat_map(|s| (s..=n).map(move |e| s..e)).collect()
}

/// Checks that the float file at `p` holds `a` (read whole by `read_float_stored`) and that
/// each of `ranges` of its first axis, read alone, is that slice of the whole.
fn check_ranges(p: &Path, a: &Stored, ranges: Vec<std::ops::Range<usize>>) {
    let shape = match a {
        Stored::F32(a) => a.shape().to_vec(),
        Stored::F64(a) => a.shape().to_vec(),
        other => panic!("not a float array: {other:?}"),
    };
    let whole = read_float_stored(p, &shape).unwrap();
    assert!(whole == *a, "{shape:?}: the whole file");
    for r in ranges {
        let got = read_float_stored_range(p, &shape, r.clone());
        assert!(got.as_ref() == Ok(&part(a, r.clone())), "{shape:?} {r:?}");
    }
}

/// A `.npy` 1.0 file by hand: the header dict `dict` padded with spaces as numpy pads it
/// (to a multiple of 64 bytes, newline last), then `data`.
fn npy_v1(dict: &str, data: impl IntoIterator<Item = u8>) -> Vec<u8> {
    let pad = 64 - (10 + dict.len() + 1) % 64;
    let mut f = b"\x93NUMPY\x01\x00".to_vec();
    f.extend_from_slice(&((dict.len() + pad + 1) as u16).to_le_bytes());
    f.extend_from_slice(dict.as_bytes());
    f.resize(f.len() + pad, b' ');
    f.push(b'\n');
    f.extend(data);
    f
}

/// Writes the 5-row input `make(0..5)` with an [`Appender`] a slice at a time (`make(r)` is
/// its rows `r`: an empty slice first, one row, three rows, an empty slice, the last row) and
/// checks the file is byte for byte the one `write_input` writes for the whole input, and has
/// descriptor `descr`, the whole shape, C order, a 64-byte aligned header and data `data`.
fn check_appended<'a>(
    dir: &Path,
    descr: &str,
    make: impl Fn(std::ops::Range<usize>) -> Input<'a>,
    data: &[u8],
) {
    let (p, q) = (dir.join("parts.npy"), dir.join("whole.npy"));
    let whole = make(0..5);
    let shape = input_shape(&whole).to_vec();
    let mut w = Appender::create(&p, &whole, &shape).unwrap();
    for r in [0..0, 0..1, 1..4, 4..4, 4..5] {
        w.append(make(r)).unwrap();
    }
    w.finish().unwrap();
    write_input(&q, whole).unwrap();
    let (got, want) = (std::fs::read(&p).unwrap(), std::fs::read(&q).unwrap());
    assert!(
        got == want,
        "{descr}: {} bytes appended, {} written whole",
        got.len(),
        want.len()
    );
    let head = header(&p).unwrap();
    assert_eq!(
        (head.descr.as_str(), &head.shape, head.fortran_order),
        (descr, &shape, false)
    );
    assert_eq!(head.data_offset % 64, 0);
    assert!(
        got[head.data_offset as usize..] == *data,
        "{descr}: the data"
    );
}

/// Slices of the first axis appended one after another (an empty one, and one of more than
/// `WIDEN_ELEMENTS` elements among them) give exactly the file `write_input` writes for the
/// whole array, for float32 (strided slices of a Fortran-layout array: logical order),
/// bf16 widened to float32, and compact `<u2` bits of bf16 and of float32 bf16 values.
#[test]
fn appended_slices_are_the_whole_file() {
    use half::bf16;
    let dir = tempfile::tempdir().unwrap();
    let shape = [5, WIDEN_ELEMENTS / 2 + 3];
    let f = numbered(&shape, true, |x| x / 3.0);
    let b = numbered(&shape, false, |x| bf16::from_f32(x / 7.0));
    let fb = b.mapv(f32::from);
    let le = |v: &ArrayD<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>();
    let bits: Vec<u8> = b.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    let rows = |r| ndarray::Slice::from(r);
    let axis = ndarray::Axis(0);
    let d = dir.path();
    check_appended(
        d,
        "<f4",
        |r| Input::F32(f.slice_axis(axis, rows(r))),
        &le(&f),
    );
    check_appended(
        d,
        "<f4",
        |r| Input::Bf16AsF32(b.slice_axis(axis, rows(r))),
        &le(&fb),
    );
    check_appended(
        d,
        "<u2",
        |r| Input::Bf16Bits(b.slice_axis(axis, rows(r))),
        &bits,
    );
    check_appended(
        d,
        "<u2",
        |r| Input::F32AsBf16Bits(fb.slice_axis(axis, rows(r))),
        &bits,
    );
}

/// An appender refuses a file left short (`finish`), a slice past the whole shape, and a slice
/// stored otherwise than the file (float32 into compact `<u2`); a refused slice writes
/// nothing, and a slice stored alike from another input kind is accepted.
#[test]
fn appender_refuses_too_few_too_many_and_other_storage() {
    use half::bf16;
    let dir = tempfile::tempdir().unwrap();
    let (p, q) = (dir.path().join("a.npy"), dir.path().join("b.npy"));
    let a = numbered(&[3, 4], false, |x| x);
    let rows = |r| Input::F32(a.slice_axis(ndarray::Axis(0), ndarray::Slice::from(r)));
    let mut w = Appender::create(&p, &rows(0..3), &[3, 4]).unwrap();
    w.append(rows(0..2)).unwrap();
    let err = w.finish().unwrap_err();
    assert!(
        err.contains("16 bytes") && err.contains("never written"),
        "{err}"
    );
    let w = Appender::create(&p, &rows(0..3), &[3, 4]).unwrap();
    assert!(w.finish().unwrap_err().contains("48 bytes"));
    let mut w = Appender::create(&p, &rows(0..3), &[3, 4]).unwrap();
    w.append(rows(0..3)).unwrap();
    let err = w.append(rows(2..3)).unwrap_err();
    assert!(err.contains("16 bytes appended where 0 were left"), "{err}");
    let mut w = Appender::create(&p, &rows(0..3), &[2, 4]).unwrap();
    assert!(w.append(rows(0..3)).unwrap_err().contains("were left"));
    // A compact file: float32 slices (however held) are refused, bits of either kind are not.
    let b = a.mapv(bf16::from_f32);
    let fb = b.mapv(f32::from);
    let mut w = Appender::create(&p, &Input::Bf16Bits(b.view()), &[3, 4]).unwrap();
    let whole = || Stored::F32(a.clone());
    for wrong in [
        rows(0..1),
        Input::Bf16AsF32(b.view()),
        Input::Stored(whole()),
    ] {
        let err = w.append(wrong).unwrap_err();
        assert_eq!(err, "a slice of float32 appended to a file of uint16");
    }
    let wide = Input::Stored(Stored::F64(a.mapv(f64::from)));
    assert!(w.append(wide).unwrap_err().contains("float64"));
    let axis = ndarray::Axis(0);
    w.append(Input::Bf16Bits(b.slice_axis(axis, (0..1).into())))
        .unwrap();
    w.append(Input::F32AsBf16Bits(fb.slice_axis(axis, (1..3).into())))
        .unwrap();
    w.finish().unwrap();
    write_input(&q, Input::Bf16Bits(b.view())).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), std::fs::read(&q).unwrap());
}

/// A float32 value that is not a bf16 value (low 16 bits not 0) cannot be stored compact:
/// appending it (or writing it whole) fails naming the value.
#[test]
fn compact_float32_refuses_a_non_bf16_value() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    let v = ArrayD::from_shape_vec(vec![2, 2], vec![1.0, 0.5, 1.0 + f32::EPSILON, -2.0]).unwrap();
    let mut w = Appender::create(&p, &Input::F32AsBf16Bits(v.view()), &[2, 2]).unwrap();
    let err = w.append(Input::F32AsBf16Bits(v.view())).unwrap_err();
    assert!(err.contains("1.0000001 is not a bf16 value"), "{err}");
    let err = write_input(&p, Input::F32AsBf16Bits(v.view())).unwrap_err();
    assert!(err.contains("not a bf16 value"), "{err}");
}

/// In C order, every range of the first axis (empty ones and the whole included) read alone
/// is that slice of the whole array, as stored: 1-, 2- and 3-dimensional, float32 and
/// float64, and arrays with no elements.
#[test]
fn ranges_of_c_order_files_are_slices_of_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    let arrays = [
        Stored::F32(numbered(&[5, 3], false, |x| x)),
        Stored::F64(numbered(&[4, 2, 3], false, |x| f64::from(x) / 3.0)),
        Stored::F64(numbered(&[6], false, f64::from)),
        Stored::F32(numbered(&[3, 0, 2], false, |x| x)),
        Stored::F64(numbered(&[0, 4], false, f64::from)),
    ];
    for a in &arrays {
        write_stored(&p, a).unwrap();
        assert!(!header(&p).unwrap().fortran_order);
        check_ranges(&p, a, every_range(header(&p).unwrap().shape[0]));
    }
}

/// In Fortran order (written as numpy writes a column-major array: `'fortran_order': True`),
/// every range of the first axis read alone is that slice of the whole: runs of at most 64
/// (read one by one) and of more than 64 (read through a map), 2- and 3-dimensional.
#[test]
fn ranges_of_fortran_order_files_are_slices_of_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    let arrays = [
        (Stored::F32(numbered(&[5, 3], true, |x| x)), 3),
        (Stored::F64(numbered(&[4, 3, 5], true, f64::from)), 15),
        (Stored::F32(numbered(&[3, 5, 14], true, |x| x / 3.0)), 70),
        (
            Stored::F64(numbered(&[6, 70], true, |x| f64::from(x) / 3.0)),
            70,
        ),
    ];
    for (a, runs) in &arrays {
        write_stored(&p, a).unwrap();
        let head = header(&p).unwrap();
        assert!(head.fortran_order, "{:?}", head.shape);
        assert_eq!(head.shape[1..].iter().product::<usize>(), *runs);
        check_ranges(&p, a, every_range(head.shape[0]));
    }
}

/// Files made by hand (headers as numpy writes them, data bytes laid out explicitly):
/// big-endian `>f4` in C order and `>f8` in Fortran order (more than 64 runs), a
/// little-endian Fortran float64 one (few runs), and an empty Fortran one of 70 runs: each
/// range is read by value.
#[test]
fn ranges_of_hand_made_files_are_read_by_value() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    let dict = |descr: &str, fortran: &str, shape: &str| {
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}")
    };
    let a = numbered(&[3, 4], false, |x| x / 3.0);
    let data = a.iter().flat_map(|x| x.to_be_bytes());
    std::fs::write(&p, npy_v1(&dict(">f4", "False", "(3, 4)"), data)).unwrap();
    check_ranges(&p, &Stored::F32(a), every_range(3));
    let a = numbered(&[4, 66], true, |x| f64::from(x) / 3.0);
    let data = a
        .t()
        .iter()
        .flat_map(|x| x.to_be_bytes())
        .collect::<Vec<_>>();
    std::fs::write(&p, npy_v1(&dict(">f8", "True", "(4, 66)"), data)).unwrap();
    check_ranges(&p, &Stored::F64(a), every_range(4));
    let a = numbered(&[3, 2], true, |x| f64::from(x) / 3.0);
    let data = a
        .t()
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect::<Vec<_>>();
    std::fs::write(&p, npy_v1(&dict("<f8", "True", "(3, 2)"), data)).unwrap();
    check_ranges(&p, &Stored::F64(a), every_range(3));
    std::fs::write(&p, npy_v1(&dict("<f4", "True", "(0, 70)"), [])).unwrap();
    let got = read_float_stored_range(&p, &[0, 70], 0..0).unwrap();
    assert_eq!(got, Stored::F32(ArrayD::zeros(vec![0, 70])));
}

/// A range longer than one read (8 MiB) is read whole, in C order (one run) and in Fortran
/// order (two runs each longer than a read).
#[test]
fn ranges_longer_than_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    let a = Stored::F32(numbered(&[3, (1 << 20) + 1], false, |x| x));
    write_stored(&p, &a).unwrap();
    check_ranges(&p, &a, every_range(3));
    let n = (1 << 21) + 5;
    let a = Stored::F32(numbered(&[n, 2], true, |x| x));
    write_stored(&p, &a).unwrap();
    assert!(header(&p).unwrap().fortran_order);
    check_ranges(&p, &a, vec![0..n, 3..n - 1, 7..7, n..n, n - 3..n]);
}

/// A range read refuses, with a one-line reason and no panic, a file of another dtype (int32,
/// compact uint16, float16), of another shape, or shorter than its header says (C order, or
/// Fortran order of more than 64 runs), whatever the range.
#[test]
fn range_reads_refuse_other_dtypes_shapes_and_truncated_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    let refused = |shape: &[usize], r: std::ops::Range<usize>| {
        let err = read_float_stored_range(&p, shape, r).unwrap_err();
        assert!(!err.contains('\n'), "{err}");
        err
    };
    write(&p, &ndarray::Array2::<i32>::zeros((3, 4))).unwrap();
    let err = refused(&[3, 4], 0..1);
    assert!(
        err.contains("int32") && err.contains("float32 or float64"),
        "{err}"
    );
    let b = ArrayD::from_elem(vec![3, 4], half::bf16::ONE);
    write_input(&p, Input::Bf16Bits(b.view())).unwrap();
    assert!(refused(&[3, 4], 0..3).contains("holds uint16 elements"));
    let f16 = "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }";
    std::fs::write(&p, npy_v1(f16, [0; 4])).unwrap();
    assert!(refused(&[2], 0..2).contains("holds float16 elements"));
    write(&p, &numbered(&[3, 4], false, |x| x)).unwrap();
    for shape in [&[4, 3][..], &[3, 4, 1], &[12]] {
        let err = refused(shape, 0..1);
        assert!(err.starts_with("has shape [3, 4], expected"), "{err}");
    }
    let cut = |by: u64| {
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(f.metadata().unwrap().len() - by).unwrap();
    };
    cut(1);
    for r in [0..0, 0..1, 2..3, 0..3] {
        assert!(refused(&[3, 4], r).contains("truncated"));
    }
    write(&p, &numbered(&[3, 70], true, f64::from)).unwrap();
    cut(8);
    assert!(refused(&[3, 70], 0..3).contains("truncated"));
    // Bytes past the data: refused, as the whole file's reader refuses them.
    write(&p, &numbered(&[3, 4], false, f64::from)).unwrap();
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.extend([0u8; 64]);
    std::fs::write(&p, &bytes).unwrap();
    assert!(read_float_stored(&p, &[3, 4]).is_err());
    for r in [0..0, 1..2] {
        assert!(refused(&[3, 4], r).contains("64 extra bytes"));
    }
    std::fs::write(&p, b"not a .npy file").unwrap();
    assert!(refused(&[3, 4], 0..1).contains("malformed"));
}
