//! How fast can this adapter stream bf16 weights through a matrix-vector product, by the way the
//! shader reads them? Times the same GEMV (49152 x 576 bf16, 57 MB: larger than any cache)
//! with the weights read from a storage buffer, an rgba32uint sampled texture (texel fetch) and
//! an rgba32uint read-only storage texture (image load, what the backend uses on CPU adapters),
//! and with the lanes of a subgroup splitting k instead of rows.
//!
//!     cargo run --release -p tandem-wgpu --example load_probe
//!
//! On Mesa's lavapipe a storage-buffer load whose address differs across lanes runs as a loop
//! over the lanes with a branch per lane, while texel fetches and image loads are branch-free; this
//! probe is how that was measured (see shaders/README.md and docs/bench-cpu.md). It replaces
//! the first session's tex_probe (storage against texture at one decode shape).

use wgpu::util::DeviceExt;

const N: u32 = 49152;
const K: u32 = 576;
const TEX_W: u32 = 4096;

const COMMON: &str = r#"
struct P { n: u32, k: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<uniform> x: array<vec4<f32>, 144>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
fn lo(v: u32) -> f32 { return bitcast<f32>(v << 16u); }
fn hi(v: u32) -> f32 { return bitcast<f32>(v & 0xffff0000u); }
fn dot8(q: vec4<u32>, j: u32) -> f32 {
    let a = x[2u * j];
    let b = x[2u * j + 1u];
    return dot(vec4<f32>(lo(q.x), hi(q.x), lo(q.y), hi(q.y)), a) + dot(vec4<f32>(lo(q.z), hi(q.z), lo(q.w), hi(q.w)), b);
}
"#;

// One row per lane: WDECL declares the weights, TERM is what unit i (row + j) adds to acc.
// `no-load` and `alu` replace the weights by values made from the indices (normal floats, no
// denormals); `alu` also reads x once, outside the loop.
const ROW_KERNEL: &str = r#"
WDECL
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let r = g.x + g.y * 65535u * WG;
    if (r >= p.n) { return; }
    let row = r * (p.k / 8u);
    var acc = 0.0;
    let a = x[0];
    let b = x[1];
    for (var j = 0u; j < p.k / 8u; j++) {
        let i = row + j;
        acc += TERM;
    }
    out[r] = acc + EXTRA;
}
"#;

fn row_kernel(decl: &str, term: &str, extra: &str, wg: u32) -> String {
    format!("{COMMON}{ROW_KERNEL}")
        .replace("WDECL", decl)
        .replace("TERM", term)
        .replace("EXTRA", extra)
        .replace("TEXW", &format!("{TEX_W}u"))
        .replace("WG", &format!("{wg}u"))
}

const MADE_UP: &str = "vec4<u32>(0x3f803f80u ^ (i & 0xffu), 0x3f803f80u ^ j, 0x3f803f80u + j, 0x3f803f80u)";

// Every lane of a workgroup reads the same row (the address depends on the workgroup id only),
// each with its own x; N workgroups, so N * 8 (lane, row) pairs, like `storage` at WG 8.
const SAME_ROW: &str = r#"
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = g.x + g.y * 65535u;
    if (r >= p.n) { return; }
    let row = r * (p.k / 8u);
    var acc = 0.0;
    let a = x[0] * f32(li);
    for (var j = 0u; j < p.k / 8u; j++) {
        let q = w[row + j];
        acc += dot(vec4<f32>(lo(q.x), hi(q.x), lo(q.y), hi(q.y)), a) + dot(vec4<f32>(lo(q.z), hi(q.z), lo(q.w), hi(q.w)), a);
    }
    out[r] = acc;
}
"#;

// The decode kernel's shape: WG lanes x 8 rows each; row-major weights or tiled so that one
// step of a workgroup reads one contiguous run of WG * 8 vec4s (the ADDR given). WDECL declares
// the weights, LOAD(i) reads unit i, STEP folds the unit q into acc[t] (dot, or fma).
const RT_KERNEL: &str = r#"
WDECL
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    var acc: array<f32, 8>;
    for (var t = 0u; t < 8u; t++) { acc[t] = 0.0; }
    let kt = p.k / 8u;
    for (var j = 0u; j < kt; j++) {
        let a = x[2u * j];
        let b = x[2u * j + 1u];
        for (var t = 0u; t < 8u; t++) {
            let i = ADDR;
            let q = LOAD;
            STEP
        }
    }
    for (var t = 0u; t < 8u; t++) { out[g.x * WG * 8u + t * WG + li] = acc[t]; }
}
"#;

const STORAGE_DECL: &str = "@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;";
const TEXTURE_DECL: &str = "@group(0) @binding(3) var w: texture_2d<u32>;";
const STORAGE_TEXTURE_DECL: &str = "@group(0) @binding(3) var w: texture_storage_2d<rgba32uint, read>;";
const STORAGE_LOAD: &str = "w[i]";
const TEXTURE_LOAD: &str = "textureLoad(w, vec2<u32>(i & 4095u, i >> 12u), 0)";
const STORAGE_TEXTURE_LOAD: &str = "textureLoad(w, vec2<u32>(i & 4095u, i >> 12u))";
const DOT_STEP: &str = "acc[t] += dot(vec4<f32>(lo(q.x), hi(q.x), lo(q.y), hi(q.y)), a) + dot(vec4<f32>(lo(q.z), hi(q.z), lo(q.w), hi(q.w)), b);";
const FMA_STEP: &str = "var s = acc[t]; s = fma(a.x, lo(q.x), s); s = fma(a.y, hi(q.x), s); s = fma(a.z, lo(q.y), s); s = fma(a.w, hi(q.y), s); \
    s = fma(b.x, lo(q.z), s); s = fma(b.y, hi(q.z), s); s = fma(b.z, lo(q.w), s); s = fma(b.w, hi(q.w), s); acc[t] = s;";

fn rt_kernel(decl: &str, load: &str, step: &str, addr: &str, wg: u32) -> String {
    format!("{COMMON}{RT_KERNEL}")
        .replace("WDECL", decl)
        .replace("LOAD", load)
        .replace("STEP", step)
        .replace("ADDR", addr)
        .replace("WG", &format!("{wg}u"))
}

/// Rows of 576 bf16 (72 texels) in one 64 KiB uniform window, and windows per dispatch.
const WIN_ROWS: u32 = 56;
const WINS: u32 = 12;

fn ubo_shader(wg: u32) -> String {
    let mut s = String::from(COMMON);
    for b in 0..WINS {
        s += &format!("@group(0) @binding({}) var<uniform> w{b}: array<vec4<u32>, 4032>;\n", b + 3);
    }
    s += &format!("@compute @workgroup_size({wg})\nfn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32) {{\n");
    s += &format!("    let r = g.x * {wg}u + li;\n    if (r >= {WIN_ROWS}u) {{ return; }}\n    let row = r * 72u;\n    var acc = 0.0;\n    switch (g.y) {{\n");
    for b in 0..WINS {
        s += &format!("        case {b}u: {{ for (var j = 0u; j < 72u; j++) {{ acc += dot8(w{b}[row + j], j); }} }}\n");
    }
    s += &format!("        default: {{}}\n    }}\n    out[p.n + g.y * {WIN_ROWS}u + r] = acc;\n}}\n");
    s
}

/// Lanes split k: lane l of a subgroup of 8 holds x units l, l + 8, ... (9 for K = 576) and
/// reads the same units of each row; subgroupAdd sums the row. Row-major texels.
fn ksplit_shader(wg: u32, rps: u32) -> String {
    let upl = K / 64;
    let mut s = format!("{COMMON}\n{STORAGE_TEXTURE_DECL}\n");
    s += &format!("@compute @workgroup_size({wg})\nfn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {{\n");
    for u in 0..upl {
        s += &format!(
            "    let xa{u} = x[2u * (lane + {}u)];\n    let xb{u} = x[2u * (lane + {}u) + 1u];\n",
            u * 8,
            u * 8
        );
    }
    s += &format!("    let r0 = (g.x * {}u + li / 8u) * {rps}u;\n    for (var rr = 0u; rr < {rps}u; rr++) {{\n        let r = r0 + rr;\n        let base = r * {}u + lane;\n        var acc = 0.0;\n", wg / 8, K / 8);
    for u in 0..upl {
        s += &format!("        {{ let i = base + {}u; let q = textureLoad(w, vec2<u32>(i & 4095u, i >> 12u)); acc += dot(vec4<f32>(lo(q.x), hi(q.x), lo(q.y), hi(q.y)), xa{u}) + dot(vec4<f32>(lo(q.z), hi(q.z), lo(q.w), hi(q.w)), xb{u}); }}\n", u * 8);
    }
    s += "        let sum = subgroupAdd(acc);\n        if (lane == 0u && r < p.n) { out[r] = sum; }\n    }\n}\n";
    s
}

/// CPU time of every thread of this process (Linux): on a software Vulkan the device is this
/// process's threads, so this is the work done, whatever else the machine runs.
fn cpu_secs() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        * 1e-9
}

/// The device, the shared buffers and the expected result; runs and times one variant.
struct Probe {
    device: wgpu::Device,
    queue: wgpu::Queue,
    params: wgpu::Buffer,
    xbuf: wgpu::Buffer,
    out: wgpu::Buffer,
    read: wgpu::Buffer,
    want: Vec<f32>,
}

impl Probe {
    fn pipeline(&self, src: &str) -> wgpu::ComputePipeline {
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        })
    }

    /// Params, x, out, and the weights at binding 3.
    fn bind(&self, pipe: &wgpu::ComputePipeline, w: wgpu::BindingResource) -> wgpu::BindGroup {
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: self.params.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: self.xbuf.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: self.out.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: w },
            ],
        })
    }

    /// Best of four runs of `dispatches` (bind group, workgroups in x and y), in CPU-seconds;
    /// checks the first `check_rows` outputs against the host result.
    fn time(
        &self,
        name: &str,
        pipe: &wgpu::ComputePipeline,
        dispatches: &[(&wgpu::BindGroup, u32, u32)],
        check_rows: usize,
    ) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..4 {
            let t = cpu_secs();
            let mut enc = self.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(pipe);
                for (bg, x, y) in dispatches {
                    pass.set_bind_group(0, *bg, &[]);
                    pass.dispatch_workgroups(*x, *y, 1);
                }
            }
            enc.copy_buffer_to_buffer(&self.out, 0, &self.read, 0, N as u64 * 4);
            self.queue.submit([enc.finish()]);
            self.read.slice(..).map_async(wgpu::MapMode::Read, |_| {});
            self.device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
            let got: Vec<f32> = bytemuck::cast_slice(&self.read.slice(..).get_mapped_range().expect("mapped")).to_vec();
            self.read.unmap();
            best = best.min(cpu_secs() - t);
            let err = got[..check_rows].iter().zip(&self.want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-3, "{name}: max error {err}");
        }
        best
    }

    /// `words` as an rgba32uint texture TEX_W texels wide, zero-padded to whole rows.
    fn texture(&self, words: &[u32]) -> wgpu::TextureView {
        let h = (words.len() as u32 / 4).div_ceil(TEX_W);
        let mut padded = words.to_vec();
        padded.resize((TEX_W * h * 4) as usize, 0);
        let desc = wgpu::TextureDescriptor {
            label: None,
            size: wgpu::Extent3d { width: TEX_W, height: h, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING
                | wgpu::TextureUsages::STORAGE_BINDING
                | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        };
        let tex = self.device.create_texture_with_data(
            &self.queue,
            &desc,
            wgpu::util::TextureDataOrder::LayerMajor,
            bytemuck::cast_slice(&padded),
        );
        tex.create_view(&Default::default())
    }

    fn buffer(&self, contents: &[u8], usage: wgpu::BufferUsages) -> wgpu::Buffer {
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents, usage })
    }
}

fn report(label: &str, secs: f64, weight_bytes: usize) {
    println!(
        "{label:<34}: {:7.2} ms  {:5.2} GB/s of bf16 weights per CPU-second",
        secs * 1e3,
        weight_bytes as f64 / 1e9 / secs
    );
}

fn main() {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc);
    let adapter =
        pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default())).expect("adapter");
    println!("adapter: {:?}", adapter.get_info().name);
    let limits = adapter.limits();
    let required_features = adapter.features() & wgpu::Features::SUBGROUP;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_limits: limits,
        required_features,
        ..Default::default()
    }))
    .expect("device");

    // Weights: bf16 of a small deterministic pattern; x = 1/(j+1).
    let words = (N * K / 2) as usize;
    let w: Vec<u32> = (0..words as u32)
        .map(|i| {
            let a = half::bf16::from_f32(((i % 13) as f32 - 6.0) / 8.0).to_bits() as u32;
            let b = half::bf16::from_f32(((i % 7) as f32 - 3.0) / 4.0).to_bits() as u32;
            a | (b << 16)
        })
        .collect();
    let x: Vec<f32> = (0..K).map(|j| 1.0 / (j as f32 + 1.0)).collect();
    let want: Vec<f32> = (0..N as usize)
        .map(|r| {
            (0..K as usize)
                .map(|j| {
                    let e = r * K as usize + j;
                    let word = w[e / 2];
                    f32::from_bits(if e.is_multiple_of(2) { word << 16 } else { word & 0xffff0000 }) * x[j]
                })
                .sum()
        })
        .collect();
    let new_buf = |size: u64, u: wgpu::BufferUsages| {
        device.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage: u, mapped_at_creation: false })
    };
    let out = new_buf(N as u64 * 4, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC);
    let read = new_buf(N as u64 * 4, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
    let params = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&[N, K, 0, 0]),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let xbuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&x),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let pr = Probe { device, queue, params, xbuf, out, read, want };
    let wbuf = pr.buffer(bytemuck::cast_slice(&w), wgpu::BufferUsages::STORAGE);
    let view = pr.texture(&w);
    let whole = words * 4;

    // Lanes split k instead of rows (needs subgroups): measured at the storage texture's speed
    // (12.8-16.3 ms against 13.0-16.7, four interleaved rounds), so the image loads, not the
    // x loads they save, are what costs.
    if pr.device.features().contains(wgpu::Features::SUBGROUP) {
        let pipe = pr.pipeline(&ksplit_shader(8, 64));
        let bg = pr.bind(&pipe, wgpu::BindingResource::TextureView(&view));
        report("WG   8 k-split subgroup texture", pr.time("ksplit", &pipe, &[(&bg, N / 64, 1)], N as usize), whole);
    }

    // Uniform windows: dispatch d covers rows [d * WINS * WIN_ROWS, ...), WINS windows of WIN_ROWS rows.
    let per = WINS * WIN_ROWS;
    let dispatches = N / per;
    let ubo = pr.buffer(bytemuck::cast_slice(&w), wgpu::BufferUsages::UNIFORM);
    let win_bytes = (WIN_ROWS * K * 2) as u64;
    let pbufs: Vec<wgpu::Buffer> = (0..dispatches)
        .map(|d| pr.buffer(bytemuck::cast_slice(&[d * per, K, 0, 0]), wgpu::BufferUsages::UNIFORM))
        .collect();
    for wg in [8u32, 16] {
        let pipe = pr.pipeline(&ubo_shader(wg));
        let bgs: Vec<wgpu::BindGroup> = (0..dispatches)
            .map(|d| {
                let mut entries = vec![
                    wgpu::BindGroupEntry { binding: 0, resource: pbufs[d as usize].as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: pr.xbuf.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 2, resource: pr.out.as_entire_binding() },
                ];
                for b in 0..WINS {
                    let off = (d * WINS + b) as u64 * win_bytes;
                    entries.push(wgpu::BindGroupEntry {
                        binding: b + 3,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &ubo,
                            offset: off,
                            size: std::num::NonZeroU64::new(win_bytes),
                        }),
                    });
                }
                pr.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &pipe.get_bind_group_layout(0),
                    entries: &entries,
                })
            })
            .collect();
        let list: Vec<_> = bgs.iter().map(|bg| (bg, WIN_ROWS.div_ceil(wg), WINS)).collect();
        let rows = (dispatches * per) as usize;
        report(&format!("WG {wg:3} uniform windows"), pr.time("uniform", &pipe, &list, rows), rows * K as usize * 2);
    }

    // The decode kernel's shape, row-major and tiled (tile of T = wg * 8 rows, [tile][j][row in tile]).
    for wg in [8u32, 16, 32] {
        let t = (wg * 8) as usize;
        let kt = (K / 8) as usize;
        let mut tiled = vec![0u32; words];
        for r in 0..N as usize {
            let (tile, q) = (r / t, r % t);
            for j in 0..kt {
                let (src, dst) = ((r * kt + j) * 4, ((tile * kt + j) * t + q) * 4);
                tiled[dst..dst + 4].copy_from_slice(&w[src..src + 4]);
            }
        }
        let tview = pr.texture(&tiled);
        let tbuf = pr.buffer(bytemuck::cast_slice(&tiled), wgpu::BufferUsages::STORAGE);
        let (rowmajor, tiled_addr) =
            ("(g.x * WG * 8u + t * WG + li) * kt + j", "(g.x * kt + j) * WG * 8u + t * WG + li");
        let (stor, texd, stexd) =
            ((STORAGE_DECL, STORAGE_LOAD), (TEXTURE_DECL, TEXTURE_LOAD), (STORAGE_TEXTURE_DECL, STORAGE_TEXTURE_LOAD));
        for (name, (decl, load), step, addr, res) in [
            ("rowmajor", stor, DOT_STEP, rowmajor, wgpu::BindingResource::Buffer(wbuf.as_entire_buffer_binding())),
            ("tiled", stor, DOT_STEP, tiled_addr, wgpu::BindingResource::Buffer(tbuf.as_entire_buffer_binding())),
            ("tiled fma", stor, FMA_STEP, tiled_addr, wgpu::BindingResource::Buffer(tbuf.as_entire_buffer_binding())),
            ("texture rowmajor", texd, DOT_STEP, rowmajor, wgpu::BindingResource::TextureView(&view)),
            ("texture tiled", texd, DOT_STEP, tiled_addr, wgpu::BindingResource::TextureView(&tview)),
            // What the backend does on CPU adapters (buffer::Texels): an image load, not a texel fetch.
            ("storage texture tiled", stexd, DOT_STEP, tiled_addr, wgpu::BindingResource::TextureView(&tview)),
        ] {
            let pipe = pr.pipeline(&rt_kernel(decl, load, step, addr, wg));
            let bg = pr.bind(&pipe, res);
            report(
                &format!("WG {wg:3} RT 8 {name}"),
                pr.time(name, &pipe, &[(&bg, N / (wg * 8), 1)], N as usize),
                whole,
            );
        }
    }

    // One row per lane; `no-load`, `alu` and `same-row` compute something else (no check).
    let alu_term = format!("dot(vec4<f32>(lo({MADE_UP}.x), hi({MADE_UP}.x), lo({MADE_UP}.y), hi({MADE_UP}.y)), a) + dot(vec4<f32>(lo({MADE_UP}.z), hi({MADE_UP}.z), lo({MADE_UP}.w), hi({MADE_UP}.w)), b)");
    for wg in [8u32, 16, 64] {
        let storage = wgpu::BindingResource::Buffer(wbuf.as_entire_buffer_binding());
        for (name, src, res, check) in [
            ("storage", row_kernel(STORAGE_DECL, "dot8(w[i], j)", "0.0", wg), storage.clone(), true),
            (
                "texture",
                row_kernel(TEXTURE_DECL, "dot8(textureLoad(w, vec2<u32>(i % TEXW, i / TEXW), 0), j)", "0.0", wg),
                wgpu::BindingResource::TextureView(&view),
                true,
            ),
            (
                "no-load",
                row_kernel(STORAGE_DECL, &format!("dot8({MADE_UP}, j)"), "f32(w[0].x)", wg),
                storage.clone(),
                false,
            ),
            ("alu", row_kernel(STORAGE_DECL, &alu_term, "f32(w[0].x)", wg), storage.clone(), false),
            ("same-row", format!("{COMMON}{SAME_ROW}"), storage, false),
        ] {
            let pipe = pr.pipeline(&src);
            let bg = pr.bind(&pipe, res);
            let groups = if name == "same-row" { N } else { N.div_ceil(wg) };
            report(
                &format!("WG {wg:3} {name}"),
                pr.time(name, &pipe, &[(&bg, groups, 1)], if check { N as usize } else { 0 }),
                whole,
            );
        }
    }
}
