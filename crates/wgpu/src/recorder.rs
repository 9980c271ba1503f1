//! Recording work: ops append dispatches to one pending command encoder; a read (or a write
//! that must not be seen by work already recorded) submits it. Each dispatch's parameters go
//! into a per-submit arena that is uploaded just before the submit and bound with a dynamic
//! offset, so a parameter block is never rewritten while recorded work still needs it.

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tandem_core::{Error, Result};

use crate::adapter::{Gpu, NAME};
use crate::shaders::{Kernel, Pipeline, Pipelines, Prelude, PARAMS_BYTES};

/// Bind groups kept for reuse.
const BIND_CACHE_CAP: usize = 4096;

/// One binding's identity: a buffer and range, or a texture view.
#[derive(PartialEq, Eq, Hash)]
enum BoundRes {
    Buf(wgpu::Buffer, Option<(u64, u64)>),
    Texels(wgpu::TextureView),
}

/// A bind group's identity: the pipeline (its cache entry's address, stable while cached in
/// [`Pipelines`]) and each binding's resource.
type BindKey = (usize, Vec<BoundRes>);

/// Arena bytes per submit; a forward pass that needs more submits mid-way (correct, a little slower).
const ARENA_BYTES: u64 = 1 << 20;

/// One binding: a buffer and the byte range a kernel sees (`None`: all of it), or a weight
/// texture (see `buffer::Texels`).
#[derive(Clone, Copy)]
pub(crate) enum Bind<'a> {
    Buf { buf: &'a wgpu::Buffer, range: Option<(u64, u64)> },
    Texels(&'a wgpu::TextureView),
}

impl<'a> Bind<'a> {
    pub fn all(buf: &'a wgpu::Buffer) -> Self {
        Bind::Buf { buf, range: None }
    }
    pub fn range(buf: &'a wgpu::Buffer, range: Option<(u64, u64)>) -> Self {
        Bind::Buf { buf, range }
    }
}

/// Dispatch counts and times, per kernel, since the last reset.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Dispatches per kernel name.
    pub dispatches: BTreeMap<&'static str, u64>,
    pub submits: u64,
    /// Wall time spent waiting for the device in reads (includes the device's work).
    pub wait_secs: f64,
    /// Device time per kernel from timestamp queries; filled only while profiling.
    pub device_secs: BTreeMap<&'static str, f64>,
}

/// Dispatches timed per submit (two timestamps each).
const PROFILE_CAP: u32 = 2048;

/// Timestamp queries around every dispatch, read back at each submit. Synchronous and so
/// slower: for finding where time goes, not for serving.
struct Profiler {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    period_ns: f64,
}

struct Pending {
    /// Declared before the encoder: the pass must end (drop) before the encoder is used again.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    params: Vec<u8>,
    /// Kernel of each timed dispatch in this submit, in order (profiling only).
    timed: Vec<&'static str>,
}

pub(crate) struct Recorder {
    pub gpu: Gpu,
    pub pipelines: Pipelines,
    params_buf: wgpu::Buffer,
    param_align: u64,
    pending: Mutex<Pending>,
    staging: Mutex<Option<wgpu::Buffer>>,
    stats: Mutex<Stats>,
    bind_groups: Mutex<std::collections::HashMap<BindKey, wgpu::BindGroup>>,
    profiler: Option<Profiler>,
    profiling: AtomicBool,
    /// Poll and sleep rather than block while waiting (CPU adapters).
    sleepy_wait: bool,
    /// Dispatches recorded since the device opened.
    dispatched: AtomicU64,
}

fn lock<'a, T>(m: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>> {
    m.lock().map_err(|_| Error::backend(NAME, format!("{what} lock poisoned by an earlier panic")))
}

impl Recorder {
    pub fn new(gpu: Gpu, pipelines: Pipelines) -> Self {
        let arena = ARENA_BYTES.min(gpu.limits.max_buffer_size);
        let params_buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tandem params arena"),
            size: arena,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let param_align = (gpu.limits.min_uniform_buffer_offset_alignment as u64).max(PARAMS_BYTES);
        let profiler = gpu.device.features().contains(wgpu::Features::TIMESTAMP_QUERY).then(|| {
            let bytes = PROFILE_CAP as u64 * 8;
            Profiler {
                queries: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("tandem profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: PROFILE_CAP,
                }),
                resolve: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tandem profile resolve"),
                    size: bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
                readback: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tandem profile readback"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                period_ns: gpu.queue.get_timestamp_period() as f64,
            }
        });
        let sleepy_wait =
            gpu.summary.device_type == wgpu::DeviceType::Cpu && std::env::var_os("TANDEM_WGPU_BLOCKING_WAIT").is_none();
        Recorder {
            pipelines,
            params_buf,
            param_align,
            pending: Mutex::new(Pending { pass: None, encoder: None, params: Vec::new(), timed: Vec::new() }),
            staging: Mutex::new(None),
            stats: Mutex::new(Stats::default()),
            bind_groups: Mutex::new(std::collections::HashMap::new()),
            gpu,
            sleepy_wait,
            dispatched: AtomicU64::new(0),
            profiler,
            profiling: AtomicBool::new(false),
        }
    }

    /// Times every dispatch with timestamp queries from now on (false when the adapter has none).
    pub fn set_profiling(&self, on: bool) -> bool {
        let ok = self.profiler.is_some();
        self.profiling.store(on && ok, Ordering::Relaxed);
        ok
    }

    pub fn stats(&self) -> Stats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn reset_stats(&self) {
        if let Ok(mut s) = self.stats.lock() {
            *s = Stats::default();
        }
    }

    /// Records one dispatch of `kernel` over `groups` workgroups (folded into 2-D when it
    /// exceeds the per-dimension limit; kernels compute `wg.y * nwg.x + wg.x`), or over an
    /// explicit `[x, y]` grid.
    pub fn dispatch(
        &self,
        kernel: Kernel,
        prelude: &Prelude,
        params: &[u32],
        binds: &[Bind<'_>],
        grid: Grid,
    ) -> Result<()> {
        let [gx, gy] = match grid {
            Grid::Linear(0) | Grid::XY(0, _) | Grid::XY(_, 0) => return Ok(()),
            Grid::Linear(n) => self.fold(kernel, n)?,
            Grid::XY(x, y) => {
                let max = self.gpu.limits.max_compute_workgroups_per_dimension as u64;
                if x > max || y > max {
                    return Err(Error::backend(
                        NAME,
                        format!("{}: grid {x}x{y} exceeds {max} workgroups per dimension", kernel.name),
                    ));
                }
                [x as u32, y as u32]
            }
        };
        debug_assert_eq!(binds.len(), kernel.bindings.len());
        if params.len() * 4 > PARAMS_BYTES as usize {
            return Err(Error::backend(
                NAME,
                format!("{}: {} parameter words exceed the block", kernel.name, params.len()),
            ));
        }
        let pipeline: Arc<Pipeline> = self.pipelines.get(&self.gpu.device, kernel, prelude)?;
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        let mut entries = Vec::with_capacity(binds.len() + 1);
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.params_buf,
                offset: 0,
                size: NonZeroU64::new(PARAMS_BYTES),
            }),
        });
        for (i, b) in binds.iter().enumerate() {
            let (buf, range) = match *b {
                Bind::Buf { buf, range } => (buf, range),
                Bind::Texels(view) => {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: wgpu::BindingResource::TextureView(view),
                    });
                    continue;
                }
            };
            // A whole buffer may end in padding past the binding limit (f32 buffers carry a
            // uniform window); its data never does, so the binding stops at the limit.
            let (offset, size) = range.unwrap_or((0, buf.size().min(max_binding / 16 * 16)));
            if size > max_binding {
                return Err(Error::backend(NAME, format!(
                    "{}: binding {} is {size} bytes, over the adapter's max_storage_buffer_binding_size of {max_binding}",
                    kernel.name,
                    i + 1
                )));
            }
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: buf,
                    offset,
                    size: NonZeroU64::new(size),
                }),
            });
        }
        // The model binds the same buffers every step: reuse bind groups (a bounded cache; a
        // cached group keeps its buffers alive, so it is emptied when it grows large).
        let key: BindKey = (
            Arc::as_ptr(&pipeline) as usize,
            binds
                .iter()
                .map(|b| match *b {
                    Bind::Buf { buf, range } => BoundRes::Buf(buf.clone(), range),
                    Bind::Texels(view) => BoundRes::Texels(view.clone()),
                })
                .collect(),
        );
        let cached = lock(&self.bind_groups, "bind group cache")?.get(&key).cloned();
        let bind_group = match cached {
            Some(g) => g,
            None => {
                let g = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(kernel.name),
                    layout: &pipeline.layout,
                    entries: &entries,
                });
                let mut cache = lock(&self.bind_groups, "bind group cache")?;
                if cache.len() >= BIND_CACHE_CAP {
                    cache.clear();
                }
                cache.insert(key, g.clone());
                g
            }
        };

        let mut p = lock(&self.pending, "recorder")?;
        let offset = (p.params.len() as u64).next_multiple_of(self.param_align);
        let profiling = self.profiling.load(Ordering::Relaxed);
        if offset + PARAMS_BYTES > self.params_buf.size() || (profiling && (p.timed.len() as u32 + 1) * 2 > PROFILE_CAP)
        {
            self.submit_locked(&mut p)?;
        }
        if profiling {
            p.pass = None;
        }
        let timestamps = match (&self.profiler, profiling) {
            (Some(pr), true) => {
                let i = p.timed.len() as u32 * 2;
                p.timed.push(kernel.name);
                Some(wgpu::ComputePassTimestampWrites {
                    query_set: &pr.queries,
                    beginning_of_pass_write_index: Some(i),
                    end_of_pass_write_index: Some(i + 1),
                })
            }
            _ => None,
        };
        let offset = (p.params.len() as u64).next_multiple_of(self.param_align);
        p.params.resize(offset as usize, 0);
        p.params.extend(params.iter().flat_map(|w| w.to_le_bytes()));
        p.params.resize((offset + PARAMS_BYTES) as usize, 0);
        let device = &self.gpu.device;
        let encoder = p.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tandem") })
        });
        if timestamps.is_some() {
            // Timed: a pass of its own, with timestamps at its start and end.
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(kernel.name),
                timestamp_writes: timestamps,
            });
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &bind_group, &[offset as u32]);
            pass.dispatch_workgroups(gx, gy, 1);
        } else {
            // Consecutive dispatches share one pass (wgpu orders their buffer accesses inside it).
            if p.pass.is_none() {
                let encoder = p.encoder.as_mut().expect("encoder was just created");
                p.pass = Some(
                    encoder
                        .begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some("tandem"),
                            timestamp_writes: None,
                        })
                        .forget_lifetime(),
                );
            }
            let pass = p.pass.as_mut().expect("pass was just begun");
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &bind_group, &[offset as u32]);
            pass.dispatch_workgroups(gx, gy, 1);
        }
        drop(p);
        self.dispatched.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.stats.lock() {
            *s.dispatches.entry(kernel.name).or_default() += 1;
        }
        Ok(())
    }

    fn fold(&self, kernel: Kernel, n: u64) -> Result<[u32; 2]> {
        let max = self.gpu.limits.max_compute_workgroups_per_dimension as u64;
        let x = n.min(max);
        let y = n.div_ceil(x);
        if y > max {
            return Err(Error::backend(NAME, format!("{}: {n} workgroups exceed a {max}x{max} grid", kernel.name)));
        }
        Ok([x as u32, y as u32])
    }

    /// Submits what is recorded (after uploading its parameter arena). Does not wait.
    fn submit_locked(&self, p: &mut Pending) -> Result<()> {
        p.pass = None; // ends the open pass, releasing the encoder
        if let Some(mut encoder) = p.encoder.take() {
            if !p.params.is_empty() {
                self.gpu.queue.write_buffer(&self.params_buf, 0, &p.params);
                p.params.clear();
            }
            let timed = std::mem::take(&mut p.timed);
            let n = timed.len() as u32 * 2;
            if let (Some(pr), true) = (&self.profiler, n > 0) {
                encoder.resolve_query_set(&pr.queries, 0..n, &pr.resolve, 0);
                encoder.copy_buffer_to_buffer(&pr.resolve, 0, &pr.readback, 0, n as u64 * 8);
            }
            self.gpu.queue.submit([encoder.finish()]);
            if let Ok(mut s) = self.stats.lock() {
                s.submits += 1;
            }
            if let (Some(pr), true) = (&self.profiler, n > 0) {
                self.collect_timestamps(pr, &timed)?;
            }
        }
        Ok(())
    }

    fn collect_timestamps(&self, pr: &Profiler, timed: &[&'static str]) -> Result<()> {
        let bytes = timed.len() as u64 * 16;
        let (tx, rx) = std::sync::mpsc::channel();
        pr.readback.map_async(wgpu::MapMode::Read, 0..bytes, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| Error::backend(NAME, "profile mapping was dropped"))?
            .map_err(|e| Error::backend(NAME, format!("mapping the profile: {e}")))?;
        {
            let view = pr
                .readback
                .get_mapped_range(0..bytes)
                .map_err(|e| Error::backend(NAME, format!("reading the profile: {e}")))?;
            let ts: &[u64] = bytemuck::cast_slice(&view);
            if let Ok(mut s) = self.stats.lock() {
                for (i, name) in timed.iter().enumerate() {
                    let d = ts[2 * i + 1].saturating_sub(ts[2 * i]) as f64 * pr.period_ns * 1e-9;
                    *s.device_secs.entry(name).or_default() += d;
                }
            }
        }
        pr.readback.unmap();
        Ok(())
    }

    /// Host data into `buf` at byte 0. Work recorded earlier must not see it (queue writes land
    /// before the next submit), so that work is submitted first.
    pub fn write(&self, buf: &wgpu::Buffer, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let mut p = lock(&self.pending, "recorder")?;
        if p.encoder.is_some() {
            self.submit_locked(&mut p)?;
        }
        if bytes.len().is_multiple_of(4) {
            self.gpu.queue.write_buffer(buf, 0, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().next_multiple_of(4), 0);
            self.gpu.queue.write_buffer(buf, 0, &padded);
        }
        Ok(())
    }

    /// Host data into a texture of 16-byte texels from texel 0, row after row (whole texels;
    /// a last partial row leaves the rest of that row as it was). Ordered like [`Recorder::write`].
    pub fn write_texels(&self, texture: &wgpu::Texture, bytes: &[u8]) -> Result<()> {
        let width = texture.size().width as usize;
        let texels = bytes.len() / 16;
        if !bytes.len().is_multiple_of(16) || texels.div_ceil(width) > texture.size().height as usize {
            return Err(Error::backend(
                NAME,
                format!(
                    "write of {} bytes into a texture of {}x{} 16-byte texels",
                    bytes.len(),
                    width,
                    texture.size().height
                ),
            ));
        }
        let mut p = lock(&self.pending, "recorder")?;
        if p.encoder.is_some() {
            self.submit_locked(&mut p)?;
        }
        let (full, rest) = (texels / width, texels % width);
        let put = |y: usize, w: usize, h: usize, data: &[u8]| {
            self.gpu.queue.write_texture(
                wgpu::TexelCopyTextureInfo {
                    texture,
                    mip_level: 0,
                    origin: wgpu::Origin3d { x: 0, y: y as u32, z: 0 },
                    aspect: wgpu::TextureAspect::All,
                },
                data,
                wgpu::TexelCopyBufferLayout {
                    offset: 0,
                    bytes_per_row: Some((w * 16) as u32),
                    rows_per_image: Some(h as u32),
                },
                wgpu::Extent3d { width: w as u32, height: h as u32, depth_or_array_layers: 1 },
            )
        };
        if full > 0 {
            put(0, width, full, &bytes[..full * width * 16]);
        }
        if rest > 0 {
            put(full, rest, 1, &bytes[full * width * 16..]);
        }
        Ok(())
    }

    /// The pending encoder with no pass open (a copy is recorded outside any pass).
    fn encoder_outside_pass<'p>(&self, p: &'p mut Pending) -> &'p mut wgpu::CommandEncoder {
        p.pass = None; // ends the open pass, releasing the encoder
        p.encoder.get_or_insert_with(|| {
            self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tandem") })
        })
    }

    /// Records a copy of a whole texture of 16-byte texels into `buf` (row after row), after
    /// the work recorded so far: a read of `buf` then sees everything recorded before it.
    pub fn copy_texture(&self, texture: &wgpu::Texture, buf: &wgpu::Buffer) -> Result<()> {
        let size = texture.size();
        let mut p = lock(&self.pending, "recorder")?;
        let encoder = self.encoder_outside_pass(&mut p);
        encoder.copy_texture_to_buffer(
            texture.as_image_copy(),
            wgpu::TexelCopyBufferInfo {
                buffer: buf,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: 0,
                    bytes_per_row: Some(size.width * 16),
                    rows_per_image: Some(size.height),
                },
            },
            size,
        );
        Ok(())
    }

    /// Records a copy of the first `rows` texture rows' worth of `buf` (16-byte texels, row
    /// after row) into `texture`, after the work recorded so far.
    pub fn copy_to_texture(&self, buf: &wgpu::Buffer, texture: &wgpu::Texture, rows: u32) -> Result<()> {
        let width = texture.size().width;
        let mut p = lock(&self.pending, "recorder")?;
        let encoder = self.encoder_outside_pass(&mut p);
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer: buf,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: 0,
                    bytes_per_row: Some(width * 16),
                    rows_per_image: Some(rows),
                },
            },
            texture.as_image_copy(),
            wgpu::Extent3d { width, height: rows, depth_or_array_layers: 1 },
        );
        Ok(())
    }

    /// Runs everything recorded and returns the first `len` bytes of `buf`.
    pub fn read(&self, buf: &wgpu::Buffer, len: u64) -> Result<Vec<u8>> {
        let size = len.next_multiple_of(4).min(buf.size());
        if size < len {
            return Err(Error::backend(NAME, format!("read of {len} bytes from a buffer of {}", buf.size())));
        }
        let t0 = Instant::now();
        let mut p = lock(&self.pending, "recorder")?;
        let mut staging = lock(&self.staging, "staging")?;
        if staging.as_ref().is_none_or(|s| s.size() < size.max(4)) {
            *staging = Some(self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tandem staging"),
                size: size.max(4).next_power_of_two(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let st = staging.as_ref().expect("staging buffer was just created");
        let encoder = self.encoder_outside_pass(&mut p);
        if size > 0 {
            encoder.copy_buffer_to_buffer(buf, 0, st, 0, size);
        }
        self.submit_locked(&mut p)?;
        drop(p);
        let mut out = Vec::new();
        if size > 0 {
            let (tx, rx) = std::sync::mpsc::channel();
            st.map_async(wgpu::MapMode::Read, 0..size, move |r| {
                let _ = tx.send(r);
            });
            self.wait()?;
            self.take_errors()?;
            let mapped = rx.recv().map_err(|_| Error::backend(NAME, "buffer mapping was dropped"))?;
            mapped.map_err(|e| Error::backend(NAME, format!("mapping the staging buffer: {e}")))?;
            {
                let view = st
                    .get_mapped_range(0..size)
                    .map_err(|e| Error::backend(NAME, format!("reading the staging buffer: {e}")))?;
                out.extend_from_slice(&view[..len as usize]);
            }
            st.unmap();
        } else {
            self.wait()?;
            self.take_errors()?;
        }
        if let Ok(mut s) = self.stats.lock() {
            s.wait_secs += t0.elapsed().as_secs_f64();
        }
        Ok(out)
    }

    /// Waits for all submitted work. On a CPU adapter the blocking wait spins on the calling
    /// thread, taking a core from the driver's own worker threads (half of a 2-core machine),
    /// so there it polls and sleeps instead.
    fn wait(&self) -> Result<()> {
        if let Some(pin) = &self.gpu.worker_pin {
            pin.maybe_pin(self.dispatched.load(Ordering::Relaxed));
        }
        let fail = |e: wgpu::PollError| Error::backend(NAME, format!("waiting for the device: {e}"));
        if !self.sleepy_wait {
            self.gpu.device.poll(wgpu::PollType::wait_indefinitely()).map_err(fail)?;
            return Ok(());
        }
        let mut nap = std::time::Duration::from_micros(20);
        loop {
            if self.gpu.device.poll(wgpu::PollType::Poll).map_err(fail)?.is_queue_empty() {
                return Ok(());
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(std::time::Duration::from_micros(500));
        }
    }

    /// Submits what is recorded and waits until the device has run all of it.
    pub fn finish(&self) -> Result<()> {
        {
            let mut p = lock(&self.pending, "recorder")?;
            self.submit_locked(&mut p)?;
        }
        self.wait()
    }

    /// Nothing recorded and unsubmitted, and nothing submitted still running.
    pub fn is_idle(&self) -> Result<bool> {
        let recorded = lock(&self.pending, "recorder")?.encoder.is_some();
        let fail = |e: wgpu::PollError| Error::backend(NAME, format!("polling the device: {e}"));
        Ok(!recorded && self.gpu.device.poll(wgpu::PollType::Poll).map_err(fail)?.is_queue_empty())
    }

    /// Errors wgpu reported outside any scope since the last check (validation of recorded work).
    pub fn take_errors(&self) -> Result<()> {
        let mut v = lock(&self.gpu.uncaptured, "error list")?;
        if v.is_empty() {
            return Ok(());
        }
        let msg = v.join("; ");
        v.clear();
        Err(Error::backend(NAME, format!("device reported: {msg}")))
    }
}

/// The workgroup grid of a dispatch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Grid {
    /// This many workgroups, folded into 2-D as needed.
    Linear(u64),
    /// An explicit grid (the kernel reads both coordinates itself).
    XY(u64, u64),
}
