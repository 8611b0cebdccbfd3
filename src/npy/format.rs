//! The `.npy` format itself: headers read and written, descriptors, and the shapes of the
//! inputs moecheck writes.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use moecheck_reference::protocol::{Input, Stored};

/// What a `.npy` header says, read without loading the data.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub shape: Vec<usize>,
    /// The dtype descriptor, e.g. `<f4`.
    pub descr: String,
    /// Where the data starts.
    pub data_offset: u64,
    /// The data is in Fortran (column-major) order.
    pub fortran_order: bool,
}

impl Header {
    /// `float32`, `int64`, `bool`, ... for the common descriptors, the descriptor otherwise.
    pub fn dtype_name(&self) -> String {
        dtype_name(&self.descr)
    }

    /// The size in bytes of one element (`None` for descriptors moecheck never reads).
    pub(super) fn element_size(&self) -> Option<u64> {
        descr_size(&self.descr)
    }
}

/// The size in bytes of one element of the descriptor `descr` (`<f4`: 4).
pub(super) fn descr_size(descr: &str) -> Option<u64> {
    descr.get(2..)?.parse().ok()
}

pub(super) fn dtype_name(descr: &str) -> String {
    let kind = descr.get(1..).unwrap_or(descr);
    match kind {
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "b1" => "bool",
        _ => return format!("'{descr}'"),
    }
    .to_string()
}

/// The header of the `.npy` file at `path` (format versions 1–3).
pub fn header(path: &Path) -> Result<Header, String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let mut pre = [0u8; 8];
    f.read_exact(&mut pre)
        .map_err(|_| "malformed .npy: too short for a header".to_string())?;
    if &pre[..6] != b"\x93NUMPY" {
        return Err("malformed .npy: bad magic".into());
    }
    let (len, start) = if pre[6] == 1 {
        let mut b = [0u8; 2];
        f.read_exact(&mut b)
            .map_err(|_| "malformed .npy: truncated header".to_string())?;
        (u16::from_le_bytes(b) as usize, 10)
    } else {
        let mut b = [0u8; 4];
        f.read_exact(&mut b)
            .map_err(|_| "malformed .npy: truncated header".to_string())?;
        (u32::from_le_bytes(b) as usize, 12)
    };
    if len > 1 << 20 {
        return Err("malformed .npy: header too long".into());
    }
    let mut h = vec![0u8; len];
    f.read_exact(&mut h)
        .map_err(|_| "malformed .npy: truncated header".to_string())?;
    let h = String::from_utf8_lossy(&h);
    let value_after = |key: &str| {
        h.find(key)
            .and_then(|i| h[i + key.len()..].find(':').map(|j| i + key.len() + j + 1))
    };
    let descr = value_after("'descr'")
        .and_then(|i| {
            let rest = h[i..].trim_start();
            let q = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
            rest[1..].find(q).map(|end| rest[1..1 + end].to_string())
        })
        .ok_or("malformed .npy header: no descr")?;
    let start_shape = h
        .find("'shape'")
        .and_then(|i| h[i..].find('(').map(|j| i + j + 1))
        .ok_or("malformed .npy header: no shape")?;
    let end = h[start_shape..]
        .find(')')
        .map(|j| start_shape + j)
        .ok_or("malformed .npy header: no shape")?;
    let shape = h[start_shape..end]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| format!("malformed .npy header: dimension '{d}'"))
        })
        .collect::<Result<_, _>>()?;
    let fortran_order =
        value_after("'fortran_order'").is_some_and(|i| h[i..].trim_start().starts_with("True"));
    Ok(Header {
        shape,
        descr,
        data_offset: (start + len) as u64,
        fortran_order,
    })
}

/// The shape in the header of the `.npy` file at `path`, read without loading the data.
pub fn header_shape(path: &Path) -> Result<Vec<usize>, String> {
    header(path).map(|h| h.shape)
}

/// The shape of an input.
pub fn input_shape<'a>(a: &'a Input<'_>) -> &'a [usize] {
    match a {
        Input::Stored(Stored::F32(v)) => v.shape(),
        Input::Stored(Stored::F64(v)) => v.shape(),
        Input::Stored(Stored::I32(v)) => v.shape(),
        Input::Stored(Stored::U8(v)) => v.shape(),
        Input::F32(v) | Input::F32AsBf16Bits(v) => v.shape(),
        Input::Bf16AsF32(v) | Input::Bf16Bits(v) => v.shape(),
    }
}

/// Elements of an input converted at once while it is written (a bf16 weight widened, a
/// compact one narrowed to its bits).
pub const WIDEN_ELEMENTS: usize = 1 << 20;

/// The `.npy` header of a little-endian C-order array of `descr` (`<f4`, `<u2`) and `shape`
/// (format 1.0: the magic, the version, the header's length, the dict padded with spaces and a
/// newline to a multiple of 64 bytes).
pub(super) fn npy_header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    let unpadded = 10 + dict.len() + 1;
    let len = dict.len() + 1 + (64 - unpadded % 64) % 64;
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    h.extend_from_slice(&(len as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.resize(10 + len - 1, b' ');
    h.push(b'\n');
    h
}

/// `s` on one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
