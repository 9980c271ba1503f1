//! Choosing the device: which wgpu backends to ask for, the adapter, the device with the
//! adapter's own limits, and an error (never a silent fallback) when nothing suitable exists.

use std::sync::{Arc, Mutex};

use tandem_core::{Error, Result};

pub(crate) const NAME: &str = "wgpu";

/// Environment variable naming the wgpu backends to try ("vulkan" when unset; "metal", "dx12",
/// "gl", a comma list of those, or "all").
pub const BACKENDS_ENV: &str = "TANDEM_WGPU_BACKENDS";

/// What was found, for logs and reports.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: wgpu::Backend,
    pub device_type: wgpu::DeviceType,
    pub driver: String,
}

impl AdapterSummary {
    /// A software adapter running on the CPU (Mesa's lavapipe or llvmpipe).
    pub fn is_cpu(&self) -> bool {
        self.device_type == wgpu::DeviceType::Cpu
    }
}

impl std::fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?}, {:?}", self.name, self.backend, self.device_type)?;
        if !self.driver.is_empty() {
            write!(f, ", {}", self.driver)?;
        }
        write!(f, ")")
    }
}

pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub limits: wgpu::Limits,
    pub summary: AdapterSummary,
    /// The adapter can read rgba32uint storage textures (weights stored as texels).
    pub texel_weights: bool,
    /// Errors wgpu could not hand back through a scope (they surface at the next read).
    pub uncaptured: Arc<Mutex<Vec<String>>>,
    /// A CPU adapter's worker threads, to pin once they have run (see `affinity`).
    pub worker_pin: Option<crate::affinity::WorkerPin>,
}

/// The backends to request: `TANDEM_WGPU_BACKENDS`, else Vulkan alone.
pub(crate) fn requested_backends() -> Result<(wgpu::Backends, String)> {
    let spec = std::env::var(BACKENDS_ENV).unwrap_or_else(|_| "vulkan".into());
    let lower = spec.trim().to_ascii_lowercase();
    let backends = if lower == "all" { wgpu::Backends::all() } else { wgpu::Backends::from_comma_list(&lower) };
    if backends.is_empty() {
        return Err(Error::backend(
            NAME,
            format!("{BACKENDS_ENV}={spec:?} names no wgpu backend (try vulkan, metal, dx12, gl or all)"),
        ));
    }
    Ok((backends, lower))
}

/// Mesa's Vulkan drivers want XDG_RUNTIME_DIR; without it they print a warning on every start.
/// A private directory is enough. Called before the instance exists, on the constructing
/// thread, which is as early as a library can do it.
fn ensure_xdg_runtime_dir() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tandem-xdg-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_ok() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}

pub(crate) fn open() -> Result<Gpu> {
    let (backends, spec) = requested_backends()?;
    ensure_xdg_runtime_dir();
    // The driver's threads are those that appear from here to the open device (affinity.rs).
    let threads_before = crate::affinity::threads();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    // No validation layers or debug labels unless WGPU_DEBUG / WGPU_VALIDATION ask for them.
    desc.flags = wgpu::InstanceFlags::empty().with_env();
    let instance = wgpu::Instance::new(desc);
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
        ..Default::default()
    };
    let adapter = pollster::block_on(instance.request_adapter(&options)).map_err(|e| {
        let hint = if spec == "vulkan" {
            " (on Linux: install libvulkan1 and a Vulkan driver, e.g. mesa-vulkan-drivers for lavapipe; \
             TANDEM_WGPU_BACKENDS=gl would use OpenGL instead)"
        } else {
            ""
        };
        Error::backend(NAME, format!("no {spec} adapter found: {e}{hint}"))
    })?;
    let info = adapter.get_info();
    if !backends.contains(info.backend.into()) {
        return Err(Error::backend(
            NAME,
            format!("asked for {spec} but wgpu offered {} on {:?}", info.name, info.backend),
        ));
    }
    let summary = AdapterSummary {
        name: info.name.clone(),
        backend: info.backend,
        device_type: info.device_type,
        driver: info.driver.clone(),
    };
    let limits = adapter.limits();
    let texel_weights = adapter
        .get_texture_format_features(wgpu::TextureFormat::Rgba32Uint)
        .flags
        .contains(wgpu::TextureFormatFeatureFlags::STORAGE_READ_ONLY);
    // Timestamps only feed the optional profile; ask for them when they are free to have.
    let features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("tandem"),
        required_features: features,
        required_limits: limits.clone(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| Error::backend(NAME, format!("adapter {summary}: could not open a device: {e}")))?;
    let uncaptured = Arc::new(Mutex::new(Vec::new()));
    let sink = uncaptured.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        if let Ok(mut v) = sink.lock() {
            v.push(e.to_string());
        }
    }));
    tracing::info!(adapter = %summary, "wgpu device opened");
    let worker_pin = (summary.device_type == wgpu::DeviceType::Cpu)
        .then(|| crate::affinity::WorkerPin::new(&threads_before))
        .flatten();
    Ok(Gpu { device, queue, limits, summary, texel_weights, uncaptured, worker_pin })
}
