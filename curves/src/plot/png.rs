//! A minimal PNG writer (ISO/IEC 15948): 8-bit RGB, filter 1 (Sub) on every row, and a zlib
//! stream (RFC 1950) of one fixed-Huffman DEFLATE block (RFC 1951 §3.2.6) whose only matches
//! are runs (distance 1) — plots are mostly flat colour, which the Sub filter turns into runs
//! of zeros.

/// CRC-32 (ISO 3309, reflected polynomial 0xEDB88320), as PNG chunks use.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += x as u32;
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

/// Bits written least-significant first, as DEFLATE packs them.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn put(&mut self, value: u32, count: u32) {
        self.acc |= (value as u64) << self.n;
        self.n += count;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    /// A Huffman code, which DEFLATE stores most-significant bit first.
    fn code(&mut self, code: u32, len: u32) {
        self.put(code.reverse_bits() >> (32 - len), len);
    }
    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// The fixed literal/length code of symbol `sym` (RFC 1951 §3.2.6).
fn fixed(bits: &mut Bits, sym: u32) {
    match sym {
        0..=143 => bits.code(0x30 + sym, 8),
        144..=255 => bits.code(0x190 + sym - 144, 9),
        256..=279 => bits.code(sym - 256, 7),
        _ => bits.code(0xC0 + sym - 280, 8),
    }
}

const LEN_BASE: [u32; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u32; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];

/// zlib stream of `data`: one final fixed-Huffman block of literals and distance-1 runs.
pub fn zlib(data: &[u8]) -> Vec<u8> {
    let mut bits = Bits {
        out: vec![0x78, 0x01],
        acc: 0,
        n: 0,
    };
    bits.put(1, 1); // BFINAL
    bits.put(1, 2); // BTYPE = 01, fixed Huffman
    let mut i = 0;
    while i < data.len() {
        let mut run = 0;
        if i > 0 {
            while run < 258 && i + run < data.len() && data[i + run] == data[i - 1] {
                run += 1;
            }
        }
        if run >= 3 {
            let code = LEN_BASE.iter().rposition(|&b| b as usize <= run).unwrap();
            fixed(&mut bits, 257 + code as u32);
            bits.put(run as u32 - LEN_BASE[code], LEN_EXTRA[code]);
            bits.code(0, 5); // distance code 0: distance 1
            i += run;
        } else {
            fixed(&mut bits, data[i] as u32);
            i += 1;
        }
    }
    fixed(&mut bits, 256);
    let mut out = bits.finish();
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// Row `row` of RGB pixels with PNG filter 1 (Sub): each byte minus the byte one pixel to its
/// left, so that a flat stretch becomes a run of zeros.
fn sub_filtered(row: &[[u8; 3]], out: &mut Vec<u8>) {
    out.push(1);
    let mut left = [0u8; 3];
    for p in row {
        for k in 0..3 {
            out.push(p[k].wrapping_sub(left[k]));
        }
        left = *p;
    }
}

/// PNG bytes of a `w × h` RGB image (row-major, 8 bits a channel, truecolour), every row
/// Sub-filtered.
pub fn encode_rgb(w: u32, h: u32, pixels: &[[u8; 3]]) -> Vec<u8> {
    assert_eq!(
        pixels.len(),
        (w * h) as usize,
        "pixels must be w·h RGB triples"
    );
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // depth 8, RGB, deflate, filter method 0, no interlace
    chunk(&mut out, b"IHDR", &ihdr);
    let mut raw = Vec::with_capacity(((3 * w + 1) * h) as usize);
    for row in pixels.chunks(w as usize) {
        sub_filtered(row, &mut raw);
    }
    chunk(&mut out, b"IDAT", &zlib(&raw));
    chunk(&mut out, b"IEND", &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_their_check_values() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    /// Undoing the Sub filter (adding the byte one pixel to the left, as a decoder does)
    /// gives the pixels back, wrapping included.
    #[test]
    fn sub_filter_round_trips() {
        let row = [[255, 0, 7], [255, 0, 7], [0, 255, 8], [3, 2, 1]];
        let mut f = Vec::new();
        sub_filtered(&row, &mut f);
        assert_eq!(f[0], 1);
        assert_eq!(&f[4..7], &[0, 0, 0], "a repeated pixel filters to zeros");
        let mut back: Vec<u8> = Vec::new();
        for (i, &b) in f[1..].iter().enumerate() {
            let left = if i >= 3 { back[i - 3] } else { 0 };
            back.push(b.wrapping_add(left));
        }
        assert_eq!(back, row.concat());
    }

    /// Our zlib stream, inflated by Python's zlib (a reference inflater), gives the input back:
    /// long runs (several 258-byte matches), short runs (3..10, below and at the length-code
    /// boundaries), literals of both fixed-code ranges (0..143 and 144..255).
    #[test]
    fn python_zlib_inflates_our_stream() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let mut data = vec![7u8; 1000];
        for n in 1..12 {
            data.extend(std::iter::repeat_n(200u8 + n, n as usize));
        }
        data.extend((0..=255u8).cycle().take(700));
        let z = zlib(&data);
        let child = Command::new("python3")
            .args(["-c", "import sys,zlib; sys.stdout.buffer.write(zlib.decompress(sys.stdin.buffer.read()))"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            println!("SKIPPED: python3 not found; the zlib stream was not inflated by a reference");
            return;
        };
        child.stdin.take().unwrap().write_all(&z).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "python zlib refused the stream");
        assert_eq!(out.stdout, data);
        assert!(
            z.len() < data.len() / 2,
            "runs must compress: {} bytes",
            z.len()
        );
    }
}
