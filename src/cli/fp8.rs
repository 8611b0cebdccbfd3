//! `moecheck fp8 quantize`: the recipe applied to one array, every intermediate written out.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand};
use ndarray::{Array1, Array2, ArrayD, IxDyn};
use serde::Serialize;

use moecheck::npy;
use moecheck_reference::format::{decode_fp8, Format, Overflow};
use moecheck_reference::fp8::{fp8_max, jax_scale_overflows, quantize_rows, Scope};

#[derive(Debug, Args)]
pub struct Fp8Args {
    #[command(subcommand)]
    pub command: Fp8Command,
}

#[derive(Debug, Subcommand)]
pub enum Fp8Command {
    /// Quantise a float32 array with Transformer Engine's current scaling (amax per scope,
    /// scale = fp8_max/amax in f32, round-to-nearest-even satfinite of the f32 product) and
    /// write q.npy (uint8 bits), scale.npy, scale_inv.npy, amax.npy (one per scope) and
    /// dequant.npy (float32, q · scale_inv).
    Quantize(QuantizeArgs),
}

#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// Input: a 1-D or 2-D float32 .npy (1-D is read as one column). NaN and ±inf are
    /// quantised per the recipe and reported.
    #[arg(long = "in")]
    pub input: PathBuf,
    /// FP8 format: e4m3 (max 448) or e5m2 (max 57344).
    #[arg(long, value_parser = super::format_in(super::FP8))]
    pub format: Format,
    /// Scaling scope: `tensor` (one scale), `rows:SIZES.npy` (int32/int64 group sizes, one
    /// scale per group of consecutive rows; rows past the sum are in no scope and written as
    /// 0), `block:RxC` (one scale per R x C tile: DeepGEMM's block:1x128 per-token and
    /// block:128x128 per-block casts) or `mx:N` (one power-of-two E8M0 scale per N elements
    /// along the last axis: OCP MXFP8, mx:32). Block scopes write q.npy, scale_inv.npy (one
    /// per block) and dequant.npy.
    #[arg(long, default_value = "tensor")]
    pub scope: String,
    /// A block scope's recipe: for block:RxC deepgemm (amax clamped at 1e-4, x · (448/amax)),
    /// deepgemm-reciprocal (x · (1/scale_inv)) or deepgemm-ue8m0 (scale_inv rounded up to a
    /// power of two); for mx:N floor (OCP: 2^(floor(log2 amax) - emax)) or rceil
    /// (2^ceil(log2(amax/max)), NVIDIA's, torchao RCEIL). Default: deepgemm, floor.
    #[arg(long)]
    pub block_recipe: Option<String>,
    /// IEEE (ml_dtypes) casts instead of saturating ones: E4M3 overflow -> NaN, E5M2 -> inf.
    #[arg(long)]
    pub no_saturate: bool,
    /// Output directory (created if missing). Refused when it holds other files, when a file
    /// to be written there is the input, or is a symbolic link.
    #[arg(long)]
    pub out: PathBuf,
    /// Write into --out although it holds other files or one of them is the input (a
    /// symbolic link there is replaced, never written through).
    #[arg(long)]
    pub force: bool,
    /// Machine-readable summary on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What happened to one scope.
#[derive(Debug, Serialize)]
pub struct ScopeSummary {
    pub rows: [usize; 2],
    pub amax: Option<f32>,
    pub scale: f32,
    pub scale_inv: f32,
    /// TE's JAX path (no overflow guard) would have used scale = inf here.
    pub jax_scale_inf: bool,
    pub nan_inputs: usize,
    pub inf_inputs: usize,
    /// Elements whose scaled value exceeded fp8_max (saturated, or NaN/inf without saturation).
    pub past_max: usize,
    /// Non-zero elements that quantised to ±0.
    pub flushed_to_zero: usize,
    /// Elements that quantised into the format's subnormal range.
    pub subnormal: usize,
}

#[derive(Debug, Serialize)]
pub struct QuantizeSummary {
    pub input: String,
    pub shape: Vec<usize>,
    pub format: Format,
    pub saturate: bool,
    pub scopes: Vec<ScopeSummary>,
    pub rows_in_no_scope: usize,
    pub out: String,
}

pub fn run(a: Fp8Args) -> anyhow::Result<ExitCode> {
    match a.command {
        Fp8Command::Quantize(q) => quantize(q),
    }
}

/// `--in`: a float32 array of any shape (the header's, checked against the file size).
fn read_input(path: &Path) -> anyhow::Result<ArrayD<f32>> {
    let shape = npy::header_shape(path).map_err(|r| flag_error("--in", path, &r))?;
    npy::read_f32(path, &shape).map_err(|r| flag_error("--in", path, &r))
}

/// `--scope rows:SIZES.npy`: 1-D non-negative int32 or int64 group sizes.
fn read_sizes(path: &Path) -> anyhow::Result<Vec<usize>> {
    let flag = "--scope rows:";
    let shape = npy::header_shape(path).map_err(|r| flag_error(flag, path, &r))?;
    if shape.len() != 1 {
        return Err(flag_error(
            flag,
            path,
            &format!("has shape {shape:?}, expected 1-D group sizes"),
        ));
    }
    let raw = npy::read_int(path, &shape).map_err(|r| flag_error(flag, path, &r))?;
    raw.iter()
        .enumerate()
        .map(|(g, s)| {
            usize::try_from(*s)
                .map_err(|_| flag_error(flag, path, &format!("group {g} has negative size {s}")))
        })
        .collect()
}

fn flag_error(flag: &str, path: &Path, reason: &str) -> anyhow::Error {
    let sep = if flag.ends_with(':') { "" } else { " " };
    anyhow::anyhow!("{flag}{sep}{}: {reason}", path.display())
}

/// What `fp8 quantize` writes into `--out`.
const OUT_FILES: [&str; 5] = [
    "q.npy",
    "scale.npy",
    "scale_inv.npy",
    "amax.npy",
    "dequant.npy",
];

fn quantize(a: QuantizeArgs) -> anyhow::Result<ExitCode> {
    if !matches!(a.format, Format::E4m3 | Format::E5m2) {
        bail!("--format {}: expected e4m3 or e5m2", a.format);
    }
    let x = read_input(&a.input)?;
    let shape = x.shape().to_vec();
    let x2: Array2<f32> = match x.ndim() {
        1 => x
            .into_shape_with_order((shape[0], 1))
            .expect("1-D to column"),
        2 => x.into_dimensionality().expect("2-D"),
        d => bail!(
            "--in {}: expected a 1-D or 2-D array, got {d} dimensions",
            a.input.display()
        ),
    };
    if let Some(block) = super::fp8_block::parse(&a.scope, a.block_recipe.as_deref())? {
        let job = super::fp8_block::BlockJob {
            input: &a.input,
            out: &a.out,
            format: a.format,
            scope: &a.scope,
            no_saturate: a.no_saturate,
            force: a.force,
            json: a.json,
        };
        return super::fp8_block::run(&job, x2, shape, block);
    }
    let scope = match a.scope.as_str() {
        "tensor" => Scope::Tensor,
        s => match s.strip_prefix("rows:") {
            Some(p) if !p.is_empty() => {
                let sizes = read_sizes(Path::new(p))?;
                let sum: usize = sizes.iter().sum();
                if sum > x2.nrows() {
                    bail!(
                        "--scope rows:{p}: group sizes sum to {sum}, more than the {} rows of {}",
                        x2.nrows(),
                        a.input.display()
                    );
                }
                Scope::Rows(sizes)
            }
            _ => bail!("--scope {s}: expected tensor, rows:SIZES.npy, block:RxC or mx:N"),
        },
    };
    let overflow = if a.no_saturate {
        Overflow::Ieee
    } else {
        Overflow::Saturate
    };
    let q = quantize_rows(x2.view(), &scope, a.format, overflow);
    let mut inputs = vec![a.input.as_path()];
    if let Some(p) = a.scope.strip_prefix("rows:") {
        inputs.push(Path::new(p));
    }
    moecheck::pipeline::prepare_out_dir(&a.out, &OUT_FILES, &inputs, a.force, "--out")?;
    let dyn_shape = IxDyn(&shape);
    let bytes = q.q.clone().into_shape_with_order(dyn_shape.clone())?;
    let deq = q.dequantize_f32().into_shape_with_order(dyn_shape)?;
    npy::write_in(&a.out, "q.npy", &bytes, "--out")?;
    npy::write_in(&a.out, "scale.npy", &Array1::from(q.scale.clone()), "--out")?;
    npy::write_in(
        &a.out,
        "scale_inv.npy",
        &Array1::from(q.scale_inv.clone()),
        "--out",
    )?;
    npy::write_in(&a.out, "amax.npy", &Array1::from(q.amax.clone()), "--out")?;
    npy::write_in(&a.out, "dequant.npy", &deq, "--out")?;

    let max = fp8_max(a.format) as f64;
    let min_normal = a.format.info().min_normal();
    let scopes = (0..q.scopes())
        .map(|i| {
            let (lo, hi) = (q.offsets[i], q.offsets[i + 1]);
            let mut s = ScopeSummary {
                rows: [lo, hi],
                amax: (hi > lo && x2.ncols() > 0).then_some(q.amax[i]),
                scale: q.scale[i],
                scale_inv: q.scale_inv[i],
                jax_scale_inf: jax_scale_overflows(q.amax[i], a.format),
                nan_inputs: 0,
                inf_inputs: 0,
                past_max: 0,
                flushed_to_zero: 0,
                subnormal: 0,
            };
            for r in lo..hi {
                for c in 0..x2.ncols() {
                    let v = x2[(r, c)];
                    s.nan_inputs += usize::from(v.is_nan());
                    s.inf_inputs += usize::from(v.is_infinite());
                    let scaled = (v * q.scale[i]) as f64;
                    s.past_max += usize::from(scaled.abs() > max);
                    let d = decode_fp8(q.q[(r, c)], a.format);
                    s.flushed_to_zero += usize::from(d == 0.0 && v != 0.0 && !v.is_nan());
                    s.subnormal += usize::from(d != 0.0 && d.abs() < min_normal);
                }
            }
            s
        })
        .collect::<Vec<_>>();
    let summary = QuantizeSummary {
        input: a.input.display().to_string(),
        shape,
        format: a.format,
        saturate: !a.no_saturate,
        rows_in_no_scope: x2.nrows() - q.offsets.last().copied().unwrap_or(0),
        scopes,
        out: a.out.display().to_string(),
    };
    if a.json {
        moecheck::outln!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        moecheck::out!("{}", render(&summary));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(s: &QuantizeSummary) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} {:?} -> {} ({}), {} scope(s), written to {}",
        s.input,
        s.shape,
        s.format,
        if s.saturate {
            "saturating"
        } else {
            "IEEE, not saturating"
        },
        s.scopes.len(),
        s.out
    );
    let _ = writeln!(
        o,
        "{:<5} {:>11} {:>13} {:>13} {:>12} {:>9} {:>9} {:>9} {:>9}",
        "scope", "rows", "amax", "scale", "scale_inv", "nan/inf", "past max", "to zero", "subnorm"
    );
    for (i, sc) in s.scopes.iter().enumerate() {
        let _ = writeln!(
            o,
            "{:<5} {:>11} {:>13} {:>13.6e} {:>12.6e} {:>9} {:>9} {:>9} {:>9}",
            i,
            format!("{}..{}", sc.rows[0], sc.rows[1]),
            sc.amax.map_or("(empty)".into(), |a| format!("{a:.6e}")),
            sc.scale,
            sc.scale_inv,
            format!("{}/{}", sc.nan_inputs, sc.inf_inputs),
            sc.past_max,
            sc.flushed_to_zero,
            sc.subnormal
        );
        if sc.nan_inputs > 0 {
            let _ = writeln!(
                o,
                "      NaN in the scope: amax is NaN, so scale = 1; NaN inputs stay NaN"
            );
        } else if sc.inf_inputs > 0 {
            let _ = writeln!(o, "      inf in the scope: amax is inf, so scale = 1");
        }
        if sc.jax_scale_inf {
            let _ = writeln!(
                o,
                "      amax is so small that fp8_max/amax overflows: scale clamped to f32::MAX (TE C++); TE's JAX path would use inf"
            );
        }
    }
    if s.rows_in_no_scope > 0 {
        let _ = writeln!(
            o,
            "{} row(s) past the groups: not quantised (0)",
            s.rows_in_no_scope
        );
    }
    o
}
