//! Which rows and columns of each group fast verification checks element by element: the
//! places tiled kernels get wrong (a group's edges, the first tile and the last, possibly
//! partial, tile at every usual tile size) and a few seeded ones.

use crate::seed::mix;

/// Tile sizes whose edges are sampled: `t - 1`, `t`, and the first index of the last tile and
/// the one before it.
pub const TILES: [usize; 5] = [8, 16, 32, 64, 128];

/// Seeded indices sampled per group and dimension besides the edges.
pub const RANDOM: usize = 4;

/// The seed of every vector and sample of fast verification (a fixed constant: a run is
/// reproducible; the probabilities in the [module docs](super) are over this choice, for
/// errors that do not depend on it).
pub const SEED: u64 = 0x6d6f_6563_6865_636b; // "moecheck"

/// The sampled indices in `0..len`, sorted and without repeats: `0` and `len - 1`; for every
/// `t` in [`TILES`] the indices `t - 1` and `t` (the first tile's edge), and `l - 1` and `l`
/// with `l = ⌊(len - 1)/t⌋·t` (the last tile, partial or not, and its predecessor's last
/// index); and [`RANDOM`] indices drawn from `seed`. Empty when `len = 0`.
///
/// ```
/// use moecheck_reference::gemm::fast::sampled;
/// let s = sampled(20, 1);
/// for i in [0, 7, 8, 15, 16, 19] {
///     assert!(s.contains(&i));
/// }
/// assert!(sampled(0, 1).is_empty());
/// ```
pub fn sampled(len: usize, seed: u64) -> Vec<usize> {
    if len == 0 {
        return Vec::new();
    }
    let mut v = vec![0, len - 1];
    for t in TILES {
        let last = (len - 1) / t * t;
        v.extend(
            [t - 1, t, last, last.saturating_sub(1)]
                .into_iter()
                .filter(|i| *i < len),
        );
    }
    for r in 0..RANDOM as u64 {
        v.push((mix(seed ^ mix(r)) % len as u64) as usize);
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// `±1` with equal probability for index `i` of the stream `seed` (a Rademacher variable).
pub fn sign(seed: u64, i: u64) -> f64 {
    if mix(seed ^ mix(i)) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// The seed of one pass's and one group's draws.
pub fn seed_of(pass: usize, group: usize, what: u64) -> u64 {
    mix(SEED ^ mix(pass as u64) ^ mix(mix(group as u64) ^ what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_of_every_tile_size_are_sampled() {
        let s = sampled(300, 3);
        for i in [
            0, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 295, 296, 299,
        ] {
            assert!(s.contains(&i), "{i} in {s:?}");
        }
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert!(s.len() <= 2 + 4 * TILES.len() + RANDOM);
        assert_eq!(sampled(1, 9), vec![0]);
        assert!(sampled(5, 9).iter().all(|i| *i < 5));
    }

    #[test]
    fn signs_are_balanced() {
        let plus = (0..10_000).filter(|i| sign(7, *i) > 0.0).count();
        assert!((4_800..5_200).contains(&plus), "{plus}");
    }
}
