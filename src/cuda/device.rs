//! The device: availability probe, the CUDA context, and the per-device module cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use serde::Serialize;

use super::kernels::{compile_cubin, compile_ptx, KernelModule};
use super::libs::{ensure, Found, Lib};

/// Why the CUDA backend cannot run (an ordinary result, never a panic).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No driver library, no device, or the driver refused.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A library other than the driver is missing (NVRTC, cuBLAS).
    #[error("{lib} not found: {why}")]
    MissingLibrary { lib: &'static str, why: String },
    /// NVRTC rejected a kernel module.
    #[error("NVRTC: {0}")]
    Compile(String),
    /// A module lacks an entry point.
    #[error("kernel {name} not found in the compiled module")]
    MissingKernel { name: String },
    /// A driver or cuBLAS call failed.
    #[error("{0}")]
    Driver(String),
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(format!("CUDA driver: {e:?}"))
    }
}

/// What `moecheck devices` reports (the `--json` schema).
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// Whether a CUDA device can run the `cuda`, `cublas` and `cublas-grouped` implementations.
    pub available: bool,
    /// One line on why not, when `available` is false.
    pub reason: Option<String>,
    /// The driver's CUDA version, e.g. `13.0`.
    pub driver_version: Option<String>,
    /// Devices: ordinal, name, arch (`sm_90`), memory in GiB.
    pub devices: Vec<DeviceEntry>,
    /// Where each library was found, or `not found`.
    pub libraries: Vec<LibraryEntry>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceEntry {
    pub ordinal: usize,
    pub name: String,
    pub arch: String,
    pub memory_gib: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LibraryEntry {
    pub name: &'static str,
    pub found: bool,
    pub location: String,
}

/// Probes libraries and devices without panicking.
pub fn probe() -> DeviceReport {
    let libraries: Vec<LibraryEntry> = Lib::ALL
        .iter()
        .map(|&l| {
            let f = ensure(l);
            LibraryEntry {
                name: l.name(),
                found: f.is_present(),
                location: f.describe(),
            }
        })
        .collect();
    let mut report = DeviceReport {
        available: false,
        reason: None,
        driver_version: None,
        devices: Vec::new(),
        libraries,
    };
    match driver_devices() {
        Ok((version, devices)) => {
            report.driver_version = Some(version);
            report.devices = devices;
            if report.devices.is_empty() {
                report.reason = Some("the CUDA driver reports no device".into());
            } else if let Some(l) = report.libraries.iter().find(|l| !l.found) {
                report.reason = Some(format!("{} not found", l.name));
            } else {
                report.available = true;
            }
        }
        Err(why) => report.reason = Some(why),
    }
    report
}

fn driver_devices() -> Result<(String, Vec<DeviceEntry>), String> {
    if let Found::Missing(_) = ensure(Lib::Cuda) {
        return Err(
            "no CUDA driver (libcuda.so.1 not found): no NVIDIA GPU or driver on this machine"
                .into(),
        );
    }
    // SAFETY: only checks that the library loads (ensured above, so cudarc cannot panic).
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("libcuda found but not loadable by cudarc".into());
    }
    let count = CudaContext::device_count().map_err(|e| format!("CUDA driver: {e:?}"))?;
    let mut version: i32 = 0;
    // SAFETY: `version` is a valid host out-pointer; the driver library is loaded.
    let rc = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    let version = if rc == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        format!("{}.{}", version / 1000, (version % 1000) / 10)
    } else {
        "unknown".into()
    };
    let mut devices = Vec::new();
    for ordinal in 0..count.max(0) as usize {
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("device {ordinal}: {e:?}"))?;
        let (maj, min) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
        devices.push(DeviceEntry {
            ordinal,
            name: ctx.name().unwrap_or_else(|_| "unknown".into()),
            arch: format!("sm_{maj}{min}"),
            memory_gib: ctx.total_mem().unwrap_or(0) as f64 / (1u64 << 30) as f64,
        });
    }
    Ok((version, devices))
}

/// Device 0 with its stream and compiled modules. Created once per process.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// `sm_XY` of the device; modules are compiled for it.
    pub arch: String,
    /// (major, minor) compute capability.
    pub cc: (i32, i32),
    modules: Mutex<HashMap<KernelModule, Arc<CudaModule>>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("arch", &self.arch).finish()
    }
}

/// The shared device, or why there is none. Needs libcuda and NVRTC.
pub fn device() -> Result<Arc<Device>, CudaError> {
    static DEV: OnceLock<Result<Arc<Device>, CudaError>> = OnceLock::new();
    DEV.get_or_init(|| {
        let report = probe();
        if report.devices.is_empty() {
            return Err(CudaError::NoDevice(
                report.reason.unwrap_or_else(|| "none found".into()),
            ));
        }
        if let Found::Missing(why) = ensure(Lib::Nvrtc) {
            return Err(CudaError::MissingLibrary {
                lib: "libnvrtc",
                why,
            });
        }
        let ctx = CudaContext::new(0)?;
        let cc = ctx.compute_capability()?;
        let stream = ctx.default_stream();
        Ok(Arc::new(Device {
            arch: format!("sm_{}{}", cc.0, cc.1),
            cc,
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
        }))
    })
    .clone()
}

impl Device {
    /// The function `name` of `module`, compiling the module on first use.
    pub fn function(&self, module: KernelModule, name: &str) -> Result<CudaFunction, CudaError> {
        let m = {
            let mut cache = self
                .modules
                .lock()
                .map_err(|_| CudaError::Driver("module cache poisoned".into()))?;
            match cache.get(&module) {
                Some(m) => m.clone(),
                None => {
                    // The CUBIN for this exact arch; PTX (driver JIT) if NVRTC cannot make one.
                    let image = match compile_cubin(module, &self.arch) {
                        Ok(cubin) => cudarc::nvrtc::Ptx::from_binary(cubin),
                        Err(_) => cudarc::nvrtc::Ptx::from_src(
                            compile_ptx(module, &self.arch).map_err(CudaError::Compile)?,
                        ),
                    };
                    let m = self.ctx.load_module(image)?;
                    cache.insert(module, m.clone());
                    m
                }
            }
        };
        m.load_function(name).map_err(|_| CudaError::MissingKernel {
            name: name.to_string(),
        })
    }

    /// Whether `mma.sync` bf16/f16 tensor-core kernels can run (sm_80+).
    pub fn has_mma(&self) -> bool {
        self.cc.0 >= 8
    }
}

/// Device time of the last timed region (the compute of the last pass run by `cuda`, `cublas`
/// or `cublas-grouped`, without uploads, poisoning and downloads), in milliseconds.
static LAST_COMPUTE_MS: Mutex<Option<f64>> = Mutex::new(None);

/// The device time of the compute of the last pass any GPU implementation ran, if timed.
pub fn last_compute_ms() -> Option<f64> {
    LAST_COMPUTE_MS.lock().ok().and_then(|g| *g)
}

/// Times the work `f` enqueues on the device's stream with CUDA events.
pub fn timed<T>(dev: &Device, f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = dev.stream.record_event(flags)?;
    let r = f()?;
    let end = dev.stream.record_event(flags)?;
    end.synchronize()?;
    let ms = start.elapsed_ms(&end)? as f64;
    if let Ok(mut g) = LAST_COMPUTE_MS.lock() {
        *g = Some(ms);
    }
    Ok(r)
}
