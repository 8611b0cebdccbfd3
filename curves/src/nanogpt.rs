//! nanoGPT-style logs, as the modded-nanogpt speedrun records print them.
//!
//! `train_gpt.py` prints (and appends to its log file) one line per step,
//! `step:2/5100 train_loss:9.4594 train_time:283ms step_avg:nanms`, and every
//! `val_loss_every` steps (and at the last step) `step:125/5100 val_loss:4.9769
//! train_time:16224ms step_avg:141.08ms`; both losses are printed `:.4f` (quantum 1e-4), read
//! from their printed decimals. Later records print `train_loss` no more: their step lines
//! carry only `train_time`, and `val_loss` is their only loss.
//!
//! `train_loss:` is read as [`Metric::Loss`] (the training loss, as every other reader's
//! `loss`: dense, one value a step) and `val_loss:` as [`Metric::ValLoss`]. `train_time` (the
//! cumulative training time) and `step_avg` (its running mean) are not a step's time and are not
//! read. A record's log file starts with the source of the script that wrote it and the output of
//! `nvidia-smi`: a line is a step line only when `step:` (starting a word) is followed by
//! `N/M` in digits, so the script's own `print0(f"step:{step}/{train_steps} ...")` is skipped,
//! as is a step line with neither loss. A step beyond 2^53 or a loss that is not a number is
//! refused with its line.

use std::path::Path;

use crate::parse::{malformed, push_fields, MAX_STEP, STEP_RANGE};
use crate::{Curve, CurveError, LogFormat, Metric};

const FIELDS: [(&str, Metric); 2] = [
    ("train_loss:", Metric::Loss),
    ("val_loss:", Metric::ValLoss),
];

/// The digits `N` of a `step:N/M` in `line` (both digits; `step:` starting a word), if any.
fn step_digits(line: &str) -> Option<&str> {
    line.match_indices("step:").find_map(|(i, key)| {
        let starts_word = !line[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !starts_word {
            return None;
        }
        let rest = line[i + key.len()..].trim_start();
        let (head, tail) = rest.split_once('/')?;
        let total_digits = tail
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .count();
        (!head.is_empty() && head.chars().all(|c| c.is_ascii_digit()) && total_digits > 0)
            .then_some(head)
    })
}

/// A step line with a loss: `step:N/M` followed by `train_loss:` or `val_loss:`.
pub fn is_step_line(line: &str) -> bool {
    step_digits(line).is_some() && FIELDS.iter().any(|(key, _)| line.contains(key))
}

pub fn read(path: &Path, text: &str) -> Result<Curve, CurveError> {
    let mut curve = Curve::new(path, LogFormat::Nanogpt);
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let Some(head) = step_digits(line) else {
            continue;
        };
        let step = head
            .parse::<u64>()
            .ok()
            .filter(|s| *s <= MAX_STEP)
            .ok_or_else(|| malformed(path, n, format!("step `{head}` is not {STEP_RANGE}")))?;
        push_fields(&mut curve, (path, n), line, step, &FIELDS)?;
    }
    Ok(curve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_digit_steps_make_a_step_line() {
        assert_eq!(
            step_digits("step:125/5100 val_loss:4.9769 train_time:16224ms"),
            Some("125")
        );
        assert_eq!(step_digits("step: 7/ 10 train_loss:1.0"), Some("7"));
        assert_eq!(
            step_digits("print0(f\"step:{step}/{train_steps} val_loss:{val_loss:.4f}\")"),
            None
        );
        assert_eq!(step_digits("substep:3/4 train_loss:1.0"), None);
        assert_eq!(step_digits("step:3 train_loss:1.0"), None);
        assert!(!is_step_line(
            "step:1/1393 train_time:29360ms step_avg:nanms"
        ));
        assert!(is_step_line(
            "step:2/5100 train_loss:9.4594 train_time:283ms"
        ));
    }
}
