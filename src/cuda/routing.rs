//! Host wrappers of kernels/routing.cu on plain slices (device 0): scores, group-limited
//! top-k, position-policy capacity, group sizes and the permutation ([`route`]), and the
//! row gather / weighted combine ([`permute_rows`], [`combine`]). Ties go to the lower expert
//! index everywhere. The kernels are checked on the CPU (tests/host_kernels/routing.rs); these
//! wrappers only run with a GPU.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::device::{device, CudaError};
use super::gemm::upload;
use super::kernels::KernelModule;

/// Most experts per token and most routing groups (`RT_MAX_K`, `RT_MAX_GROUPS`).
pub const MAX_K: usize = 64;
pub const MAX_GROUPS: usize = 64;
const THREADS: u32 = 128;

/// The score function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Score {
    /// softmax over all experts, then top-k.
    Softmax,
    /// sigmoid (DeepSeek-V3).
    Sigmoid,
    /// top-k on the logits, softmax over the k selected (MaxText default, Mixtral).
    TopkSoftmax,
}

/// Routing parameters (issue 3's `moecheck route` flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteParams {
    pub score: Score,
    pub topk: usize,
    /// `n_routing_groups` (1: no group limit).
    pub groups: usize,
    /// `topk_routing_group`.
    pub topk_groups: usize,
    /// Normalise the k weights by their sum (+1e-20).
    pub norm_topk: bool,
    pub scaling_factor: f32,
    /// Position-policy capacity: `(sequence length S, capacity per sequence and expert)`;
    /// `None` keeps every assignment.
    pub capacity: Option<(usize, usize)>,
}

/// The routing of `T` tokens: `(T, K)` arrays row-major, `group_sizes (E,)`, and the position
/// of each assignment `t·K + k` in the permuted order (kept ones grouped by expert, dropped
/// ones at the tail in assignment order).
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    pub indices: Vec<i32>,
    /// Combine weights; 0 for dropped assignments (no renormalisation of survivors).
    pub weights: Vec<f32>,
    pub kept: Vec<u8>,
    pub group_sizes: Vec<i32>,
    pub positions: Vec<i32>,
}

fn cfg(grid: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Checks the parameters against `t` tokens and `e` experts (the kernels' limits included).
pub fn check_params(t: usize, e: usize, p: &RouteParams) -> Result<(), String> {
    if e == 0 || p.topk == 0 || p.topk > e || p.topk > MAX_K {
        return Err(format!(
            "topk {} with {e} experts (1..=min(E, {MAX_K}))",
            p.topk
        ));
    }
    if p.groups == 0 || p.groups > MAX_GROUPS || !e.is_multiple_of(p.groups) {
        return Err(format!(
            "{} groups must divide {e} experts (at most {MAX_GROUPS})",
            p.groups
        ));
    }
    if p.topk_groups == 0 || p.topk_groups > p.groups {
        return Err(format!(
            "topk-groups {} with {} groups",
            p.topk_groups, p.groups
        ));
    }
    if p.topk_groups * (e / p.groups) < p.topk {
        return Err(format!(
            "the {} kept groups hold {} experts, fewer than topk {}",
            p.topk_groups,
            p.topk_groups * (e / p.groups),
            p.topk
        ));
    }
    if let Some((s, _)) = p.capacity {
        if s == 0 || t.div_ceil(s) > super::plan::MAX_GRID_Y {
            return Err(format!("sequence length {s} for {t} tokens"));
        }
    }
    if i32::try_from(t.saturating_mul(p.topk)).is_err() || i32::try_from(e).is_err() {
        return Err("sizes exceed i32".into());
    }
    Ok(())
}

/// Routes `logits (T, E)` (finite; the caller rejects NaN) with an optional selection bias.
pub fn route(
    logits: &[f32],
    bias: Option<&[f32]>,
    t: usize,
    e: usize,
    p: &RouteParams,
) -> Result<Routed, CudaError> {
    check_params(t, e, p).map_err(CudaError::Driver)?;
    if logits.len() != t * e || bias.is_some_and(|b| b.len() != e) {
        return Err(CudaError::Driver(format!(
            "logits have {} values for ({t}, {e}); bias must have {e}",
            logits.len()
        )));
    }
    let tk = t * p.topk;
    if t == 0 {
        return Ok(Routed {
            indices: vec![],
            weights: vec![],
            kept: vec![],
            group_sizes: vec![0; e],
            positions: vec![],
        });
    }
    let dev = device()?;
    let (ti, ei, ki) = (t as i32, e as i32, p.topk as i32);
    let x = upload(&dev, logits)?;
    let mut scores = dev.stream.alloc_zeros::<f32>(t * e)?;
    let kind: i32 = match p.score {
        Score::Softmax => 0,
        Score::Sigmoid => 1,
        Score::TopkSoftmax => 2,
    };
    let tb = (t as u32).div_ceil(THREADS);
    let f = dev.function(KernelModule::Routing, "routing_scores")?;
    let mut b = dev.stream.launch_builder(&f);
    // routing_scores(logits [device f32, T*E], T, E, kind, scores [device f32, T*E])
    b.arg(&x).arg(&ti).arg(&ei).arg(&kind).arg(&mut scores);
    // SAFETY: thread t < T reads and writes row t of (T, E) arrays of that size.
    unsafe { b.launch(cfg((tb, 1), THREADS)) }?;

    let bias_dev = bias.map(|b| upload(&dev, b)).transpose()?;
    let bias_ptr: u64 = match &bias_dev {
        Some(s) => {
            use cudarc::driver::DevicePtr;
            s.device_ptr(&dev.stream).0
        }
        None => 0, // the kernel reads no bias through a null pointer
    };
    let mut indices = dev.stream.alloc_zeros::<i32>(tk)?;
    let mut weights = dev.stream.alloc_zeros::<f32>(tk)?;
    let (gi, tgi) = (p.groups as i32, p.topk_groups as i32);
    let softmax_sel = (p.score == Score::TopkSoftmax) as i32;
    let norm = p.norm_topk as i32;
    let f = dev.function(KernelModule::Routing, "routing_topk")?;
    let mut b = dev.stream.launch_builder(&f);
    // routing_topk(scores [device, T*E], bias [device, E] or null, T, E, K, groups,
    //              topk_groups, softmax_selected, norm, scaling, indices [device i32, T*K],
    //              weights [device f32, T*K])
    b.arg(&scores)
        .arg(&bias_ptr)
        .arg(&ti)
        .arg(&ei)
        .arg(&ki)
        .arg(&gi)
        .arg(&tgi);
    b.arg(&softmax_sel).arg(&norm).arg(&p.scaling_factor);
    b.arg(&mut indices).arg(&mut weights);
    // SAFETY: thread t < T reads row t of scores and bias[0..E), writes row t of the (T, K)
    // outputs; K and groups are within the kernel's local-array limits (check_params).
    unsafe { b.launch(cfg((tb, 1), THREADS)) }?;

    let eb = (e as u32).div_ceil(THREADS);
    let mut kept = match p.capacity {
        None => upload(&dev, &vec![1u8; tk])?,
        Some((s, cap)) => {
            let mut kept = dev.stream.alloc_zeros::<u8>(tk)?;
            let (si, ci) = (s as i32, cap.min(i32::MAX as usize) as i32);
            let f = dev.function(KernelModule::Routing, "routing_capacity_position")?;
            let mut b = dev.stream.launch_builder(&f);
            // routing_capacity_position(indices [device i32, T*K], T, K, E, S, capacity,
            //                           kept [device u8, T*K])
            b.arg(&indices)
                .arg(&ti)
                .arg(&ki)
                .arg(&ei)
                .arg(&si)
                .arg(&ci)
                .arg(&mut kept);
            // SAFETY: thread (q, e) walks sequence q's assignments and writes kept[a] only
            // where indices[a] == e; every index is in 0..E (routing_topk, check_params).
            unsafe { b.launch(cfg((eb, t.div_ceil(s) as u32), THREADS)) }?;
            kept
        }
    };
    let mut sizes = dev.stream.alloc_zeros::<i32>(e)?;
    let tk64 = tk as i64;
    let f = dev.function(KernelModule::Routing, "routing_group_sizes")?;
    let mut b = dev.stream.launch_builder(&f);
    // routing_group_sizes(indices [device, T*K], kept [device, T*K], T*K, E, sizes [device, E])
    b.arg(&indices)
        .arg(&kept)
        .arg(&tk64)
        .arg(&ei)
        .arg(&mut sizes);
    // SAFETY: thread e < E reads the T*K assignments and writes sizes[e].
    unsafe { b.launch(cfg((eb, 1), THREADS)) }?;
    let group_sizes = dev.stream.clone_dtoh(&sizes)?;
    let mut offs = vec![0i32; e + 1];
    for i in 0..e {
        offs[i + 1] = offs[i] + group_sizes[i];
    }
    let offs_dev = upload(&dev, &offs)?;
    let mut positions = dev.stream.alloc_zeros::<i32>(tk)?;
    let f = dev.function(KernelModule::Routing, "routing_permute_index")?;
    let mut b = dev.stream.launch_builder(&f);
    // routing_permute_index(indices, kept [device, T*K], T*K, E, offsets [device, E+1],
    //                       positions [device i32, T*K])
    b.arg(&indices)
        .arg(&mut kept)
        .arg(&tk64)
        .arg(&ei)
        .arg(&offs_dev)
        .arg(&mut positions);
    // SAFETY: threads 0..=E each write the positions of their own assignments, all < T*K.
    unsafe { b.launch(cfg(((e as u32 + 1).div_ceil(THREADS), 1), THREADS)) }?;

    let kept_h = dev.stream.clone_dtoh(&kept)?;
    let mut weights_h = dev.stream.clone_dtoh(&weights)?;
    for (w, k) in weights_h.iter_mut().zip(&kept_h) {
        if *k == 0 {
            *w = 0.0;
        }
    }
    Ok(Routed {
        indices: dev.stream.clone_dtoh(&indices)?,
        weights: weights_h,
        kept: kept_h,
        group_sizes,
        positions: dev.stream.clone_dtoh(&positions)?,
    })
}

/// `xp[positions[t·K + k], :] = x[t, :]`: `x (T, H)` to `xp (T·K, H)`.
pub fn permute_rows(
    x: &[f32],
    positions: &[i32],
    t: usize,
    k: usize,
    h: usize,
) -> Result<Vec<f32>, CudaError> {
    if x.len() != t * h || positions.len() != t * k {
        return Err(CudaError::Driver("permute_rows: shapes".into()));
    }
    let mut sorted: Vec<i32> = positions.to_vec();
    sorted.sort_unstable();
    if sorted.iter().enumerate().any(|(i, &p)| p != i as i32) {
        return Err(CudaError::Driver(
            "permute_rows: positions are not a permutation".into(),
        ));
    }
    let Some((blocks, threads)) = super::plan::grid_1d(t * k * h, 256, 1 << 16) else {
        return Ok(vec![0.0; t * k * h]);
    };
    let dev = device()?;
    let (xd, pd) = (upload(&dev, x)?, upload(&dev, positions)?);
    let mut xp = dev.stream.alloc_zeros::<f32>(t * k * h)?;
    let (ti, ki, hi) = (t as i32, k as i32, h as i64);
    let f = dev.function(KernelModule::Routing, "routing_gather_rows_f32")?;
    let mut b = dev.stream.launch_builder(&f);
    // routing_gather_rows_f32(x [device, T*H], positions [device, T*K], T, K, H, xp [device, T*K*H])
    b.arg(&xd).arg(&pd).arg(&ti).arg(&ki).arg(&hi).arg(&mut xp);
    // SAFETY: positions is a permutation of 0..T*K (checked), so every write is in xp.
    unsafe { b.launch(cfg((blocks, 1), threads)) }?;
    Ok(dev.stream.clone_dtoh(&xp)?)
}

/// `out[t, :] = Σ_{k kept} weights[t, k] · y[positions[t·K + k], :]` in f32, k ascending.
pub fn combine(
    y: &[f32],
    positions: &[i32],
    weights: &[f32],
    kept: &[u8],
    t: usize,
    k: usize,
    h: usize,
) -> Result<Vec<f32>, CudaError> {
    if y.len() != t * k * h
        || positions.len() != t * k
        || weights.len() != t * k
        || kept.len() != t * k
    {
        return Err(CudaError::Driver("combine: shapes".into()));
    }
    if positions.iter().any(|&p| p < 0 || p as usize >= t * k) {
        return Err(CudaError::Driver(
            "combine: a position is out of range".into(),
        ));
    }
    let Some((blocks, threads)) = super::plan::grid_1d(t * h, 256, 1 << 16) else {
        return Ok(vec![0.0; t * h]);
    };
    let dev = device()?;
    let (yd, pd, wd, kd) = (
        upload(&dev, y)?,
        upload(&dev, positions)?,
        upload(&dev, weights)?,
        upload(&dev, kept)?,
    );
    let mut out = dev.stream.alloc_zeros::<f32>(t * h)?;
    let (ti, ki, hi) = (t as i32, k as i32, h as i64);
    let f = dev.function(KernelModule::Routing, "routing_combine_f32")?;
    let mut b = dev.stream.launch_builder(&f);
    // routing_combine_f32(y [device, T*K*H], positions, weights [device f32, T*K],
    //                     kept [device u8, T*K], T, K, H, out [device f32, T*H])
    b.arg(&yd)
        .arg(&pd)
        .arg(&wd)
        .arg(&kd)
        .arg(&ti)
        .arg(&ki)
        .arg(&hi)
        .arg(&mut out);
    // SAFETY: positions are in 0..T*K (checked), so every y row read is inside y; each
    // thread writes out[i] for i < T*H.
    unsafe { b.launch(cfg((blocks, 1), threads)) }?;
    Ok(dev.stream.clone_dtoh(&out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> RouteParams {
        RouteParams {
            score: Score::Sigmoid,
            topk: 8,
            groups: 8,
            topk_groups: 4,
            norm_topk: true,
            scaling_factor: 2.5,
            capacity: None,
        }
    }

    #[test]
    fn parameters_are_checked_before_any_launch() {
        assert!(check_params(4096, 256, &p()).is_ok());
        assert!(
            check_params(4, 6, &RouteParams { groups: 4, ..p() }).is_err(),
            "4 does not divide 6"
        );
        assert!(check_params(4, 256, &RouteParams { topk: 65, ..p() }).is_err());
        assert!(check_params(
            4,
            256,
            &RouteParams {
                topk_groups: 9,
                ..p()
            }
        )
        .is_err());
        assert!(
            check_params(
                4,
                16,
                &RouteParams {
                    topk_groups: 1,
                    ..p()
                }
            )
            .is_err(),
            "2 experts < topk 8"
        );
        assert!(check_params(
            4,
            256,
            &RouteParams {
                capacity: Some((0, 1)),
                ..p()
            }
        )
        .is_err());
    }
}
