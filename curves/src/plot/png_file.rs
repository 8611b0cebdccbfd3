//! The plot as a PNG file: 8-bit RGB, encoded by the `png` crate (its adaptive filtering and
//! zlib compression; plots are mostly flat colour and compress well).

/// PNG bytes of a `w × h` RGB image (row-major, 8 bits a channel, truecolour).
///
/// # Panics
/// If `pixels` does not hold `w·h` triples (a bug of the caller: the canvas has its size).
pub fn encode_rgb(w: u32, h: u32, pixels: &[[u8; 3]]) -> Vec<u8> {
    assert_eq!(
        pixels.len(),
        (w as usize) * (h as usize),
        "pixels must be w·h RGB triples"
    );
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // Writing into memory fails only on an image the format cannot hold (a zero or huge
    // dimension), which a canvas never is.
    let mut writer = encoder
        .write_header()
        .expect("a PNG header for a canvas's size");
    writer
        .write_image_data(pixels.as_flattened())
        .expect("the canvas's pixels are its size");
    writer.finish().expect("an in-memory PNG");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoded by the same crate's decoder (which checks every chunk's CRC), the pixels come
    /// back exactly: flat runs, single pixels, every byte value.
    #[test]
    fn encoded_pixels_decode_back() {
        let (w, h) = (37u32, 11u32);
        let pixels: Vec<[u8; 3]> = (0..w * h)
            .map(|i| match i % 7 {
                0..=3 => [255, 255, 255],
                4 => [(i % 256) as u8, 0, 7],
                _ => [0, (i * 31 % 256) as u8, 200],
            })
            .collect();
        let bytes = encode_rgb(w, h, &pixels);
        let mut reader = png::Decoder::new(std::io::Cursor::new(&bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (w, h));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(&buf[..info.buffer_size()], pixels.as_flattened());
        // A flat image compresses to a small fraction of its pixels.
        let flat = encode_rgb(400, 300, &vec![[250, 250, 250]; 400 * 300]);
        assert!(flat.len() < 400 * 300 * 3 / 50, "{} bytes", flat.len());
    }
}
