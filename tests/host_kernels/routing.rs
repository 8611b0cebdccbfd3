//! The routing kernels of kernels/routing.cu on the CPU: group-limited top-k, the capacity
//! rule, group sizes and the stable permutation, on scores chosen so that ties are frequent.

use crate::harness::{skip, sym};

/// `mc_routing` (driver.cpp): scores (host f32, T x E), bias (host f32, E), T, E, K, expert
/// groups, top-k groups, sequence length S, capacity, then outputs (host, overwritten):
/// indices (T x K), weights (T x K), kept (T x K), group sizes (E), offsets (E+1), positions
/// (T x K).
type RoutingFn = unsafe extern "C" fn(
    *const f32,
    *const f32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    *mut i32,
    *mut f32,
    *mut u8,
    *mut i32,
    *mut i32,
    *mut i32,
);

/// Group-limited top-k (lower index wins ties), position-policy capacity, group sizes and
/// the stable permutation, against a direct statement of each rule.
#[test]
fn routing_kernels_follow_the_rules() {
    if skip() {
        return;
    }
    let routing = sym!("mc_routing", RoutingFn);
    let (t, e, k, groups, topk_groups, seq, cap) =
        (37usize, 16usize, 3usize, 4usize, 2usize, 10usize, 2usize);
    // Scores on a coarse grid so that ties are frequent.
    let scores: Vec<f32> = (0..t * e)
        .map(|i| (((i * 2654435761usize) >> 5) % 7) as f32 * 0.125)
        .collect();
    let bias: Vec<f32> = (0..e)
        .map(|i| if i % 5 == 0 { 0.25 } else { 0.0 })
        .collect();
    let mut idx = vec![0i32; t * k];
    let mut w = vec![0f32; t * k];
    let mut kept = vec![0u8; t * k];
    let mut sizes = vec![0i32; e];
    let mut offs = vec![0i32; e + 1];
    let mut pos = vec![-1i32; t * k];
    // SAFETY: arrays sized T*K, E, E+1 as the kernels expect.
    unsafe {
        routing(
            scores.as_ptr(),
            bias.as_ptr(),
            t as i32,
            e as i32,
            k as i32,
            groups as i32,
            topk_groups as i32,
            seq as i32,
            cap as i32,
            idx.as_mut_ptr(),
            w.as_mut_ptr(),
            kept.as_mut_ptr(),
            sizes.as_mut_ptr(),
            offs.as_mut_ptr(),
            pos.as_mut_ptr(),
        )
    };
    let per = e / groups;
    for tok in 0..t {
        let sel = |x: usize| scores[tok * e + x] + bias[x];
        // Group scores: sum of the top two; best groups by (score desc, index asc).
        let mut gs: Vec<(f32, usize)> = (0..groups)
            .map(|g| {
                let mut v: Vec<f32> = (g * per..(g + 1) * per).map(sel).collect();
                v.sort_by(|a, b| b.partial_cmp(a).unwrap());
                (v[0] + v[1], g)
            })
            .collect();
        gs.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
        let allowed: Vec<usize> = gs[..topk_groups].iter().map(|x| x.1).collect();
        let mut cand: Vec<usize> = (0..e).filter(|x| allowed.contains(&(x / per))).collect();
        cand.sort_by(|&a, &b| sel(b).partial_cmp(&sel(a)).unwrap().then(a.cmp(&b)));
        for j in 0..k {
            assert_eq!(idx[tok * k + j], cand[j] as i32, "token {tok} slot {j}");
            assert_eq!(
                w[tok * k + j],
                scores[tok * e + cand[j]],
                "weights are pre-bias scores"
            );
        }
    }
    // Capacity: per sequence and expert, the first `cap` assignments (token-major) survive.
    let mut count = vec![0usize; e * t.div_ceil(seq)];
    for a in 0..t * k {
        let c = &mut count[(a / k / seq) * e + idx[a] as usize];
        assert_eq!(kept[a], (*c < cap) as u8, "assignment {a}");
        *c += 1;
    }
    // Sizes, then a stable sort by expert with the dropped ones at the tail in order.
    for (x, &size) in sizes.iter().enumerate() {
        let want = (0..t * k)
            .filter(|&a| kept[a] == 1 && idx[a] == x as i32)
            .count();
        assert_eq!(size as usize, want, "expert {x}");
    }
    let mut order: Vec<usize> = (0..t * k).collect();
    order.sort_by_key(|&a| {
        if kept[a] == 1 {
            (0, idx[a], a)
        } else {
            (1, 0, a)
        }
    });
    for (p, &a) in order.iter().enumerate() {
        assert_eq!(pos[a], p as i32, "assignment {a}");
    }
}
