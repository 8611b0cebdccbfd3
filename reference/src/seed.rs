//! Deterministic hashing of seeds: every generated value in moecheck is a pure function of a
//! seed and an index, so a case is reproducible from its seed alone and shrinking one
//! parameter does not reshuffle the others.

/// splitmix64's finaliser: a bijective mix of the 64 bits of `z` (Steele, Lea and Flood,
/// "Fast splittable pseudorandom number generators", 2014).
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_is_splitmix64() {
        // The first outputs of splitmix64 seeded with 0 (its state advances by the golden
        // gamma; `mix` is the output function applied to the advanced state minus the gamma).
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
    }
}
