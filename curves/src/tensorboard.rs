//! TensorBoard event files, read with a small reader of our own.
//!
//! *Framing* (TFRecord, `tensorflow/core/lib/io/record_writer.cc`): each record is
//! `u64 length (LE) | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)`
//! with `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8` (wrapping) and CRC-32C the
//! Castagnoli CRC (reflected polynomial 0x82F63B78). Both checksums are verified.
//!
//! *Payload*: each record is an `Event` protobuf (`tensorflow/core/util/event.proto`):
//! `wall_time = 1` (double), `step = 2` (int64), `summary = 5` (`Summary`). A `Summary` holds
//! repeated `value = 1`, each `Summary.Value` with `tag = 1`, and either `simple_value = 2`
//! (float: what `tf.summary.scalar` in TF1, tensorboardX and PyTorch's `SummaryWriter` write)
//! or `tensor = 8` (`TensorProto`: `dtype = 1`, `tensor_content = 4`, `float_val = 5`,
//! `double_val = 6`; what TF2's `tf.summary.scalar` writes). Only scalar tensors of dtype
//! float (1) or double (2) are read; other values (images, histograms, text) are skipped.
//!
//! Tags mapped to metrics (first listed that is present wins per event): loss — `loss`,
//! `train/loss`, `train_loss`, `learning/loss` (MaxText), `lm loss` (Megatron),
//! `loss_metrics/global_avg_loss` (torchtitan); step time (s) — `perf/step_time_seconds`,
//! `iteration-time`; tokens/s — `perf/per_device_tokens_per_sec`, `throughput(tps)`; TFLOP/s —
//! `perf/per_device_tflops_per_sec`, `throughput`, `tflops`.
//!
//! Errors name the record (1-based, as the "line") and its byte offset. A file that ends
//! inside its last record (a run still writing, or one that crashed mid-write) is read up to
//! that record, with a [`ReadWarning::TruncatedRecord`] naming its offset; a file with no
//! whole record, or a checksum mismatch anywhere, is refused.

use std::path::Path;

use crate::parse::{f32_quantum, malformed, MAX_STEP, STEP_RANGE};
use crate::{Curve, CurveError, LogFormat, Metric, ReadWarning, Sample};

const TAGS: [(Metric, &[&str]); 4] = [
    (
        Metric::Loss,
        &[
            "loss",
            "train/loss",
            "train_loss",
            "learning/loss",
            "lm loss",
            "loss_metrics/global_avg_loss",
        ],
    ),
    (
        Metric::StepTimeS,
        &["perf/step_time_seconds", "iteration-time"],
    ),
    (
        Metric::TokensPerS,
        &["perf/per_device_tokens_per_sec", "throughput(tps)"],
    ),
    (
        Metric::Tflops,
        &["perf/per_device_tflops_per_sec", "throughput", "tflops"],
    ),
];

/// CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and final xor
/// `0xFFFFFFFF`, bitwise. `crc32c(b"123456789") == 0xE3069283` (the standard check value).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// TFRecord's masked CRC: `((c >> 15) | (c << 17)) + 0xa282ead8`, wrapping.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The file starts with a well-framed record header (length and its checksum agree).
pub fn looks_like(bytes: &[u8]) -> bool {
    bytes.len() >= 12
        && masked_crc32c(&bytes[..8]) == u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

pub fn read(path: &Path, bytes: &[u8]) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::Tensorboard);
    let mut at = 0usize;
    let mut record = 0usize;
    while at < bytes.len() {
        record += 1;
        let bad =
            |reason: String| malformed(path, record, format!("record at byte {at}: {reason}"));
        // The file ends inside this record: a writer still running, or one that crashed
        // mid-write. After at least one whole record that is the end of what was written,
        // with a warning; a file with no whole record at all stays an error.
        let left = (bytes.len() - at) as u64;
        let truncated = |curve: &mut Curve, needs: Option<u64>, why: &str| {
            if record == 1 {
                return Err(bad(format!(
                    "truncated {why}; the file holds no whole record"
                )));
            }
            curve.warnings.push(ReadWarning::TruncatedRecord {
                record,
                offset: at as u64,
                bytes_left: left,
                needs,
            });
            Ok(())
        };
        if left < 12 {
            truncated(&mut curve, None, "record header")?;
            break;
        }
        let len_bytes = &bytes[at..at + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap());
        let want = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
        if masked_crc32c(len_bytes) != want {
            return Err(bad(
                "length checksum mismatch (not a TFRecord file, or corrupt)".into(),
            ));
        }
        let start = at + 12;
        let remaining = (bytes.len() - start) as u64;
        // The length's checksum held, so the length is what was written: a record longer
        // than the rest of the file was cut short.
        if len.checked_add(4).is_none_or(|need| need > remaining) {
            let needs = len.saturating_add(16);
            truncated(
                &mut curve,
                Some(needs),
                &format!("record: it says {len} bytes, the file has {remaining} left"),
            )?;
            break;
        }
        let end = start + len as usize;
        let data = &bytes[start..end];
        let want = u32::from_le_bytes(bytes[end..end + 4].try_into().unwrap());
        if masked_crc32c(data) != want {
            return Err(bad("data checksum mismatch (corrupt record)".into()));
        }
        decode_event(data, record, &mut curve)
            .map_err(|e| bad(format!("bad Event protobuf: {e}")))?;
        at = end + 4;
    }
    Ok(curve)
}

/// One protobuf field: number, and its payload by wire type.
enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// Iterates the fields of a protobuf message (wire types 0, 1, 2, 5; groups are refused).
fn fields(mut buf: &[u8]) -> impl Iterator<Item = Result<(u64, Field<'_>), String>> {
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        let r = (|| {
            let key = varint(&mut buf)?;
            let (number, wire) = (key >> 3, key & 7);
            let field = match wire {
                0 => Field::Varint(varint(&mut buf)?),
                1 => Field::Fixed64(take(&mut buf, 8)?.try_into().unwrap()),
                2 => {
                    let n = varint(&mut buf)?;
                    let n = usize::try_from(n).map_err(|_| "length too large".to_string())?;
                    Field::Bytes(take(&mut buf, n)?)
                }
                5 => Field::Fixed32(take(&mut buf, 4)?.try_into().unwrap()),
                w => return Err(format!("field {number} has unsupported wire type {w}")),
            };
            Ok((number, field))
        })();
        if r.is_err() {
            buf = &[];
        }
        Some(r)
    })
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first().ok_or("truncated varint")?;
        *buf = rest;
        v |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes".into())
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if buf.len() < n {
        return Err(format!("field needs {n} bytes, {} left", buf.len()));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

fn decode_event(data: &[u8], record: usize, curve: &mut Curve) -> Result<(), String> {
    let mut step: i64 = 0;
    let mut summaries = Vec::new();
    for f in fields(data) {
        match f? {
            (2, Field::Varint(v)) => step = v as i64,
            (5, Field::Bytes(b)) => summaries.push(b),
            _ => {}
        }
    }
    if summaries.is_empty() {
        return Ok(());
    }
    if step < 0 || step as u64 > MAX_STEP {
        return Err(format!("step {step} is not {STEP_RANGE}"));
    }
    let mut found: Vec<(Metric, usize, f64, f64)> = Vec::new();
    for summary in summaries {
        for f in fields(summary) {
            if let (1, Field::Bytes(value)) = f? {
                if let Some((tag, v, q)) = decode_value(value)? {
                    for (metric, tags) in TAGS {
                        if let Some(rank) = tags.iter().position(|t| *t == tag) {
                            found.push((metric, rank, v, q));
                        }
                    }
                }
            }
        }
    }
    for (metric, _) in TAGS {
        if let Some(&(_, _, value, quantum)) =
            found.iter().filter(|x| x.0 == metric).min_by_key(|x| x.1)
        {
            curve.push(
                metric,
                Sample {
                    step: step as u64,
                    value,
                    line: record,
                    quantum,
                },
            );
        }
    }
    Ok(())
}

/// A `Summary.Value`: its tag and scalar (with quantum), or `None` when it holds no scalar.
fn decode_value(buf: &[u8]) -> Result<Option<(String, f64, f64)>, String> {
    let mut tag = String::new();
    let mut scalar = None;
    for f in fields(buf) {
        match f? {
            (1, Field::Bytes(b)) => {
                tag = String::from_utf8(b.to_vec()).map_err(|_| "tag is not UTF-8".to_string())?
            }
            (2, Field::Fixed32(b)) => {
                let v = f32::from_le_bytes(b) as f64;
                scalar = Some((v, f32_quantum(v)));
            }
            (8, Field::Bytes(t)) => scalar = decode_scalar_tensor(t)?,
            _ => {}
        }
    }
    Ok(scalar.map(|(v, q)| (tag, v, q)))
}

/// A `TensorProto` holding exactly one float or double, or `None`.
fn decode_scalar_tensor(buf: &[u8]) -> Result<Option<(f64, f64)>, String> {
    let mut dtype = 0u64;
    let mut floats: Vec<f64> = Vec::new();
    let mut doubles: Vec<f64> = Vec::new();
    let mut content: &[u8] = &[];
    for f in fields(buf) {
        match f? {
            (1, Field::Varint(d)) => dtype = d,
            (4, Field::Bytes(b)) => content = b,
            (5, Field::Fixed32(b)) => floats.push(f32::from_le_bytes(b) as f64),
            (5, Field::Bytes(packed)) => {
                if packed.len() % 4 != 0 {
                    return Err("packed float_val length is not a multiple of 4".into());
                }
                floats.extend(
                    packed
                        .chunks(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64),
                );
            }
            (6, Field::Fixed64(b)) => doubles.push(f64::from_le_bytes(b)),
            (6, Field::Bytes(packed)) => {
                if packed.len() % 8 != 0 {
                    return Err("packed double_val length is not a multiple of 8".into());
                }
                doubles.extend(
                    packed
                        .chunks(8)
                        .map(|c| f64::from_le_bytes(c.try_into().unwrap())),
                );
            }
            _ => {}
        }
    }
    let f64_quantum = |v: f64| v.abs() * f64::EPSILON;
    Ok(
        match (dtype, floats.as_slice(), doubles.as_slice(), content.len()) {
            (_, [v], [], _) => Some((*v, f32_quantum(*v))),
            (_, [], [v], _) => Some((*v, f64_quantum(*v))),
            (1, [], [], 4) => {
                let v = f32::from_le_bytes(content.try_into().unwrap()) as f64;
                Some((v, f32_quantum(v)))
            }
            (2, [], [], 8) => {
                let v = f64::from_le_bytes(content.try_into().unwrap());
                Some((v, f64_quantum(v)))
            }
            _ => None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn varints_decode_and_overlong_ones_are_refused() {
        let mut b: &[u8] = &[0xac, 0x02];
        assert_eq!(varint(&mut b), Ok(300));
        let mut long: &[u8] = &[0xff; 11];
        assert!(varint(&mut long).is_err());
        let mut short: &[u8] = &[0x80];
        assert!(varint(&mut short).is_err());
    }
}
