//! `moecheck devices`: which CUDA devices and libraries are usable, or one line on why not.

use std::process::ExitCode;

use clap::Args;

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Machine-readable report on stdout. Fields: `available` (bool: a device and libcuda,
    /// libnvrtc and libcublas are all usable), `reason` (one line when not), `driver_version`,
    /// `devices` [{ordinal, name, arch, memory_gib}], `libraries` [{name, found, location}].
    #[arg(long)]
    pub json: bool,
}

/// Exits 0 either way: the absence of a GPU is an answer, not an error. Scripts read
/// `available` from `--json`.
pub fn run(a: DevicesArgs) -> anyhow::Result<ExitCode> {
    #[cfg(feature = "cuda")]
    {
        let r = moecheck::cuda::device::probe();
        if a.json {
            moecheck::outln!("{}", serde_json::to_string_pretty(&r)?);
            return Ok(ExitCode::SUCCESS);
        }
        if !r.available && r.devices.is_empty() {
            moecheck::outln!(
                "no CUDA device: {}",
                r.reason.as_deref().unwrap_or("unknown reason")
            );
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(v) = &r.driver_version {
            moecheck::outln!("driver: CUDA {v}");
        }
        for d in &r.devices {
            moecheck::outln!(
                "device {}: {} ({}, {:.1} GiB)",
                d.ordinal,
                d.name,
                d.arch,
                d.memory_gib
            );
        }
        for l in &r.libraries {
            moecheck::outln!("{}: {}", l.name, l.location);
        }
        match (&r.available, &r.reason) {
            (true, _) => moecheck::outln!("available: yes"),
            (false, Some(why)) => moecheck::outln!("available: no ({why})"),
            (false, None) => moecheck::outln!("available: no"),
        }
        Ok(ExitCode::SUCCESS)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let why = moecheck::cuda::unavailable_reason().unwrap_or_default();
        if a.json {
            moecheck::outln!(
                "{}",
                serde_json::json!({"available": false, "reason": why, "driver_version": null,
                                   "devices": [], "libraries": []})
            );
        } else {
            moecheck::outln!("no CUDA device: {why}");
        }
        Ok(ExitCode::SUCCESS)
    }
}
