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
