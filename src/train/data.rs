//! The built-in training data: a seeded first-order Markov chain over a small vocabulary,
//! whose entropy rate — the lowest expected cross-entropy any model can reach — is known
//! exactly.
//!
//! Each row `P[i, ·]` of the transition matrix is `w_j / Σ w` with `w_j = u_j^SHARPNESS`,
//! `u_j` uniform in (0, 1) from the seed: a few likely successors per token, so the floor sits
//! well below `ln V`. The stationary distribution `π` (`π P = π`) is found by power iteration
//! in f64; the entropy rate is `H = Σ_i π_i · Σ_j −P_ij ln P_ij` nats per token.
//!
//! A training example is a window of `C + 1` consecutive tokens: the first drawn from `π`,
//! each next one from the previous one's row. The model sees the first `C` and predicts the
//! last; since the chain is first order, the best possible prediction is `P[x_{C−1}, ·]`, and
//! the expected loss of the best model is exactly `H`. Step `s`'s batch is a pure function of
//! the data seed and `s`, so every arm of a comparison sees the same tokens.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use moecheck_reference::seed::mix;

/// The exponent on the uniform draws of a transition row (larger: more peaked rows).
pub const SHARPNESS: f64 = 8.0;

/// A Markov chain and its exact entropy rate.
#[derive(Debug, Clone, PartialEq)]
pub struct MarkovChain {
    /// `P (V × V)`, row-major; every row sums to 1.
    pub transition: Vec<f64>,
    /// `π (V)`: the stationary distribution.
    pub stationary: Vec<f64>,
    /// `H`: nats per token.
    pub entropy_rate: f64,
    pub vocab: usize,
    seed: u64,
}

/// One batch: `context[b][c]` is the `c`-th most recent token before `target[b]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub context: Vec<Vec<usize>>,
    pub target: Vec<usize>,
}

impl MarkovChain {
    /// The chain of `seed` over `vocab` tokens (`vocab >= 2`).
    pub fn new(vocab: usize, seed: u64) -> MarkovChain {
        let mut rng = ChaCha8Rng::seed_from_u64(mix(seed ^ 0x6d61_726b_6f76));
        let mut transition = vec![0.0; vocab * vocab];
        for row in transition.chunks_mut(vocab) {
            for p in row.iter_mut() {
                // (0, 1]: a zero weight would make a successor impossible and the row's
                // entropy term 0·ln 0; keep every successor possible.
                let u: f64 = 1.0 - rng.random::<f64>();
                *p = u.powf(SHARPNESS);
            }
            let sum: f64 = row.iter().sum();
            row.iter_mut().for_each(|p| *p /= sum);
        }
        let stationary = stationary(&transition, vocab);
        let entropy_rate = (0..vocab)
            .map(|i| {
                let row = &transition[i * vocab..(i + 1) * vocab];
                stationary[i] * row.iter().map(|&p| -p * p.ln()).sum::<f64>()
            })
            .sum();
        MarkovChain {
            transition,
            stationary,
            entropy_rate,
            vocab,
            seed,
        }
    }

    /// The batch of step `step`: `size` windows of `context + 1` tokens.
    pub fn batch(&self, step: u64, size: usize, context: usize) -> Batch {
        let mut rng = ChaCha8Rng::seed_from_u64(mix(mix(self.seed) ^ step));
        let mut batch = Batch {
            context: Vec::with_capacity(size),
            target: Vec::with_capacity(size),
        };
        for _ in 0..size {
            let mut window = Vec::with_capacity(context + 1);
            window.push(draw(&self.stationary, rng.random()));
            for _ in 0..context {
                let prev = *window.last().expect("non-empty");
                let row = &self.transition[prev * self.vocab..(prev + 1) * self.vocab];
                window.push(draw(row, rng.random()));
            }
            let target = window.pop().expect("context + 1 tokens");
            window.reverse();
            batch.context.push(window);
            batch.target.push(target);
        }
        batch
    }
}

/// The index `i` with `Σ_{j<i} p_j <= u < Σ_{j<=i} p_j` (the last index when rounding leaves
/// `u` past the total).
fn draw(p: &[f64], u: f64) -> usize {
    let mut acc = 0.0;
    for (i, &pi) in p.iter().enumerate() {
        acc += pi;
        if u < acc {
            return i;
        }
    }
    p.len() - 1
}

/// `π` with `π P = π`, by power iteration from the uniform distribution until no entry moves
/// by more than 1e-15 (every row is strictly positive, so the chain is ergodic and aperiodic
/// and the iteration converges geometrically).
fn stationary(p: &[f64], v: usize) -> Vec<f64> {
    let mut pi = vec![1.0 / v as f64; v];
    for _ in 0..100_000 {
        let mut next = vec![0.0; v];
        for i in 0..v {
            for j in 0..v {
                next[j] += pi[i] * p[i * v + j];
            }
        }
        let sum: f64 = next.iter().sum();
        next.iter_mut().for_each(|x| *x /= sum);
        let moved = pi
            .iter()
            .zip(&next)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        pi = next;
        if moved < 1e-15 {
            break;
        }
    }
    pi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stationary_distribution_is_fixed_by_the_chain() {
        let c = MarkovChain::new(16, 3);
        for j in 0..16 {
            let next: f64 = (0..16)
                .map(|i| c.stationary[i] * c.transition[i * 16 + j])
                .sum();
            assert!(
                (next - c.stationary[j]).abs() < 1e-13,
                "{j}: {next} vs {}",
                c.stationary[j]
            );
        }
        assert!(c.entropy_rate > 0.0 && c.entropy_rate < (16f64).ln());
    }

    /// The empirical cross-entropy of the true conditional over many draws approaches the
    /// stated entropy rate (the floor is what the data really has).
    #[test]
    fn empirical_conditional_entropy_matches_the_entropy_rate() {
        let c = MarkovChain::new(8, 11);
        let b = c.batch(0, 200_000, 2);
        let nll: f64 = b
            .context
            .iter()
            .zip(&b.target)
            .map(|(ctx, &t)| -c.transition[ctx[0] * 8 + t].ln())
            .sum::<f64>()
            / b.target.len() as f64;
        // Standard error of the mean of −ln p over 200 000 draws is well under 0.01 here.
        assert!(
            (nll - c.entropy_rate).abs() < 0.02,
            "{nll} vs {}",
            c.entropy_rate
        );
    }

    #[test]
    fn batches_are_a_function_of_seed_and_step() {
        let c = MarkovChain::new(8, 1);
        assert_eq!(c.batch(5, 4, 3), c.batch(5, 4, 3));
        assert_ne!(c.batch(5, 64, 3), c.batch(6, 64, 3));
        assert_ne!(c.batch(5, 64, 3), MarkovChain::new(8, 2).batch(5, 64, 3));
        assert!(c.batch(0, 3, 3).context.iter().all(|w| w.len() == 3));
    }
}
