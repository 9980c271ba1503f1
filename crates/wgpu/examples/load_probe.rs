//! How fast can this adapter stream bf16 weights through a matrix-vector product, by the way the
//! shader reads them? Times the same GEMV (49152 x 576 bf16, 57 MB: larger than any cache)
//! with the weights read from a storage buffer and from an rgba32uint texture.
//!
//!     cargo run --release -p tandem-wgpu --example load_probe
//!
//! On Mesa's lavapipe a storage-buffer load whose address differs across lanes runs as a loop
//! over the lanes with a branch per lane, while a texel fetch is a branch-free gather; this
//! probe is how that was measured (see shaders/README.md).


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

const STORAGE: &str = r#"
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let r = g.x + g.y * 65535u * WG;
    if (r >= p.n) { return; }
    let row = r * (p.k / 8u);
    var acc = 0.0;
    for (var j = 0u; j < p.k / 8u; j++) {
        acc += dot8(w[row + j], j);
    }
    out[r] = acc;
}
"#;

const NOLOAD: &str = r#"
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let r = g.x + g.y * 65535u * WG;
    if (r >= p.n) { return; }
    let row = r * (p.k / 8u);
    var acc = 0.0;
    for (var j = 0u; j < p.k / 8u; j++) {
        let i = row + j;
        acc += dot8(vec4<u32>(0x3f803f80u ^ (i & 0xffu), 0x3f803f80u ^ j, 0x3f803f80u + j, 0x3f803f80u), j);
    }
    out[r] = acc + f32(w[0].x);
}
"#;

const ALU: &str = r#"
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let r = g.x + g.y * 65535u * WG;
    if (r >= p.n) { return; }
    let row = r * (p.k / 8u);
    var acc = 0.0;
    let a = x[0];
    let b = x[1];
    for (var j = 0u; j < p.k / 8u; j++) {
        let q = vec4<u32>(0x3f803f80u ^ (row & 0xffu), 0x3f803f80u ^ j, 0x3f803f80u + j, 0x3f803f80u ^ (row & j));
        acc += dot(vec4<f32>(lo(q.x), hi(q.x), lo(q.y), hi(q.y)), a) + dot(vec4<f32>(lo(q.z), hi(q.z), lo(q.w), hi(q.w)), b);
    }
    out[r] = acc + f32(w[0].x);
}
"#;

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

// The decode kernel's shape: WG lanes x RT rows each; row-major weights (ROWMAJOR) or tiled so
// that one step of a workgroup reads one contiguous run of WG * RT vec4s (TILED).
const RT_COMMON: &str = r#"
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
fn up(q: vec4<u32>) -> mat2x4<f32> {
    return mat2x4<f32>(vec4<f32>(lo(q.x), hi(q.x), lo(q.y), hi(q.y)), vec4<f32>(lo(q.z), hi(q.z), lo(q.w), hi(q.w)));
}
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    var acc: array<f32, 8>;
    for (var t = 0u; t < 8u; t++) { acc[t] = 0.0; }
    let kt = p.k / 8u;
    for (var j = 0u; j < kt; j++) {
        let a = x[2u * j];
        let b = x[2u * j + 1u];
        for (var t = 0u; t < 8u; t++) {
            let m = up(w[ADDR]);
            acc[t] += dot(m[0], a) + dot(m[1], b);
        }
    }
    for (var t = 0u; t < 8u; t++) { out[g.x * WG * 8u + t * WG + li] = acc[t]; }
}
"#;

const RT_FMA: &str = r#"
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    var acc: array<f32, 8>;
    for (var t = 0u; t < 8u; t++) { acc[t] = 0.0; }
    let kt = p.k / 8u;
    for (var j = 0u; j < kt; j++) {
        let a = x[2u * j];
        let b = x[2u * j + 1u];
        for (var t = 0u; t < 8u; t++) {
            let q = w[ADDR];
            var s = acc[t];
            s = fma(a.x, lo(q.x), s);
            s = fma(a.y, hi(q.x), s);
            s = fma(a.z, lo(q.y), s);
            s = fma(a.w, hi(q.y), s);
            s = fma(b.x, lo(q.z), s);
            s = fma(b.y, hi(q.z), s);
            s = fma(b.z, lo(q.w), s);
            s = fma(b.w, hi(q.w), s);
            acc[t] = s;
        }
    }
    for (var t = 0u; t < 8u; t++) { out[g.x * WG * 8u + t * WG + li] = acc[t]; }
}
"#;

const RT_TEX: &str = r#"
@group(0) @binding(3) var w: texture_2d<u32>;
fn up(q: vec4<u32>) -> mat2x4<f32> {
    return mat2x4<f32>(vec4<f32>(lo(q.x), hi(q.x), lo(q.y), hi(q.y)), vec4<f32>(lo(q.z), hi(q.z), lo(q.w), hi(q.w)));
}
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
            let m = up(textureLoad(w, vec2<u32>(i & 4095u, i >> 12u), 0));
            acc[t] += dot(m[0], a) + dot(m[1], b);
        }
    }
    for (var t = 0u; t < 8u; t++) { out[g.x * WG * 8u + t * WG + li] = acc[t]; }
}
"#;

const TEXTURE: &str = r#"
@group(0) @binding(3) var w: texture_2d<u32>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let r = g.x + g.y * 65535u * WG;
    if (r >= p.n) { return; }
    let row = r * (p.k / 8u);
    var acc = 0.0;
    for (var j = 0u; j < p.k / 8u; j++) {
        let i = row + j;
        acc += dot8(textureLoad(w, vec2<u32>(i % TEXW, i / TEXW), 0), j);
    }
    out[r] = acc;
}
"#;

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

/// CPU time of every thread of this process (Linux): on a software Vulkan the device is this
/// process's threads, so this is the work done, whatever else the machine runs.
fn cpu_secs() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()).filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok()).sum::<f64>() * 1e-9
}

fn main() {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default())).expect("adapter");
    println!("adapter: {:?}", adapter.get_info().name);
    let limits = adapter.limits();
    println!("max_texture_dimension_2d {} max_uniform_buffer_binding_size {} max_uniform_buffers_per_shader_stage {}", limits.max_texture_dimension_2d, limits.max_uniform_buffer_binding_size, limits.max_uniform_buffers_per_shader_stage);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() })).expect("device");

    // Weights: bf16 of a small deterministic pattern; x = 1/(j+1).
    let words = (N * K / 2) as usize;
    let w: Vec<u32> = (0..words as u32).map(|i| {
        let a = half::bf16::from_f32(((i % 13) as f32 - 6.0) / 8.0).to_bits() as u32;
        let b = half::bf16::from_f32(((i % 7) as f32 - 3.0) / 4.0).to_bits() as u32;
        a | (b << 16)
    }).collect();
    let x: Vec<f32> = (0..K).map(|j| 1.0 / (j as f32 + 1.0)).collect();
    let want: Vec<f32> = (0..N as usize).map(|r| {
        (0..K as usize).map(|j| {
            let e = r * K as usize + j;
            let word = w[e / 2];
            let bits = if e % 2 == 0 { word << 16 } else { word & 0xffff0000 };
            f32::from_bits(bits) * x[j]
        }).sum()
    }).collect();

    use wgpu::util::DeviceExt;
    let params = device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(&[N, K, 0, 0]), usage: wgpu::BufferUsages::UNIFORM });
    let xbuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(&x), usage: wgpu::BufferUsages::UNIFORM });
    let out = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: N as u64 * 4, usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC, mapped_at_creation: false });
    let read = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: N as u64 * 4, usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false });
    let wbuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(&w), usage: wgpu::BufferUsages::STORAGE });
    let texels = words / 4;
    let h = (texels as u32).div_ceil(TEX_W);
    let mut padded = w.clone();
    padded.resize((TEX_W * h * 4) as usize, 0);
    let tex = device.create_texture_with_data(&queue, &wgpu::TextureDescriptor {
        label: None,
        size: wgpu::Extent3d { width: TEX_W, height: h, depth_or_array_layers: 1 },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Uint,
        usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    }, wgpu::util::TextureDataOrder::LayerMajor, bytemuck::cast_slice(&padded));
    let view = tex.create_view(&Default::default());

    // Uniform windows: dispatch d covers rows [d * WINS * WIN_ROWS, ...), WINS windows of WIN_ROWS rows.
    let per = WINS * WIN_ROWS;
    let dispatches = N / per;
    for wg in [8u32, 16] {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(ubo_shader(wg).into()) });
        let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor { label: None, layout: None, module: &module, entry_point: Some("main"), compilation_options: Default::default(), cache: None });
        let win_bytes = (WIN_ROWS * K * 2) as u64;
        let pbufs: Vec<wgpu::Buffer> = (0..dispatches).map(|d| device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(&[d * per, K, 0, 0]), usage: wgpu::BufferUsages::UNIFORM })).collect();
        let ubo = device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(&w), usage: wgpu::BufferUsages::UNIFORM });
        let bgs: Vec<wgpu::BindGroup> = (0..dispatches).map(|d| {
            let mut entries = vec![
                wgpu::BindGroupEntry { binding: 0, resource: pbufs[d as usize].as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: xbuf.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: out.as_entire_binding() },
            ];
            for b in 0..WINS {
                let off = (d * WINS + b) as u64 * win_bytes;
                entries.push(wgpu::BindGroupEntry { binding: b + 3, resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &ubo, offset: off, size: std::num::NonZeroU64::new(win_bytes) }) });
            }
            device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &pipe.get_bind_group_layout(0), entries: &entries })
        }).collect();
        let mut best = f64::MAX;
        for _ in 0..4 {
            let t = cpu_secs();
            let mut enc = device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipe);
                for bg in &bgs {
                    pass.set_bind_group(0, bg, &[]);
                    pass.dispatch_workgroups(WIN_ROWS.div_ceil(wg), WINS, 1);
                }
            }
            enc.copy_buffer_to_buffer(&out, 0, &read, 0, N as u64 * 4);
            queue.submit([enc.finish()]);
            read.slice(..).map_async(wgpu::MapMode::Read, |_| {});
            device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
            let got: Vec<f32> = bytemuck::cast_slice(&read.slice(..).get_mapped_range().expect("mapped")).to_vec();
            read.unmap();
            best = best.min(cpu_secs() - t);
            let rows = (dispatches * per) as usize;
            let err = got[..rows].iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-3, "ubo: max error {err}");
        }
        let gb = (dispatches * per * K * 2) as f64 / 1e9;
        println!("WG {wg:3} uniform : {:7.2} ms  {:5.2} GB/s of bf16 weights per CPU-second ({dispatches} dispatches)", best * 1e3, gb / best);
    }

    // Tiled copy of w: tile of T = wg * 8 rows, [tile][j][row in tile].
    for wg in [8u32, 16, 32] {
        let t = (wg * 8) as usize;
        let kt = (K / 8) as usize;
        let mut tiled = vec![0u32; words];
        for r in 0..N as usize {
            let (tile, q) = (r / t, r % t);
            for j in 0..kt {
                let src = (r * kt + j) * 4;
                let dst = ((tile * kt + j) * t + q) * 4;
                tiled[dst..dst + 4].copy_from_slice(&w[src..src + 4]);
            }
        }
        let mut tpad = tiled.clone();
        tpad.resize((TEX_W * h * 4) as usize, 0);
        let ttex = device.create_texture_with_data(&queue, &wgpu::TextureDescriptor {
            label: None,
            size: wgpu::Extent3d { width: TEX_W, height: h, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        }, wgpu::util::TextureDataOrder::LayerMajor, bytemuck::cast_slice(&tpad));
        let tview = ttex.create_view(&Default::default());
        let tbuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(&tiled), usage: wgpu::BufferUsages::STORAGE });
        for (name, addr, res) in [
            ("rowmajor", "(g.x * WG * 8u + t * WG + li) * kt + j", wgpu::BindingResource::Buffer(wbuf.as_entire_buffer_binding())),
            ("tiled", "(g.x * kt + j) * WG * 8u + t * WG + li", wgpu::BindingResource::Buffer(tbuf.as_entire_buffer_binding())),
            ("tiledfma", "(g.x * kt + j) * WG * 8u + t * WG + li", wgpu::BindingResource::Buffer(tbuf.as_entire_buffer_binding())),
            ("tex-rowm", "(g.x * WG * 8u + t * WG + li) * kt + j", wgpu::BindingResource::TextureView(&view)),
            ("tex-tile", "(g.x * kt + j) * WG * 8u + t * WG + li", wgpu::BindingResource::TextureView(&tview)),
        ] {
            let body = if name.starts_with("tex") { RT_TEX } else if name == "tiledfma" { RT_FMA } else { RT_COMMON };
            let src = format!("{COMMON}{body}").replace("ADDR", addr).replace("WG", &format!("{wg}u"));
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(src.into()) });
            let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor { label: None, layout: None, module: &module, entry_point: Some("main"), compilation_options: Default::default(), cache: None });
            let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: params.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: xbuf.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 2, resource: out.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 3, resource: res.clone() },
                ],
            });
            let mut best = f64::MAX;
            for _ in 0..4 {
                let t0 = cpu_secs();
                let mut enc = device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    pass.set_pipeline(&pipe);
                    pass.set_bind_group(0, &bg, &[]);
                    pass.dispatch_workgroups(N / (wg * 8), 1, 1);
                }
                enc.copy_buffer_to_buffer(&out, 0, &read, 0, N as u64 * 4);
                queue.submit([enc.finish()]);
                read.slice(..).map_async(wgpu::MapMode::Read, |_| {});
                device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
                let got: Vec<f32> = bytemuck::cast_slice(&read.slice(..).get_mapped_range().expect("mapped")).to_vec();
                read.unmap();
                best = best.min(cpu_secs() - t0);
                let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(err < 1e-3, "{name}: max error {err}");
            }
            let gb = (words * 4) as f64 / 1e9;
            println!("WG {wg:3} RT 8 {name:8}: {:7.2} ms  {:5.2} GB/s of bf16 weights per CPU-second", best * 1e3, gb / best);
        }
    }

    for wg in [8u32, 16, 64] {
        for (name, body, res) in [("storage", STORAGE, wgpu::BindingResource::Buffer(wbuf.as_entire_buffer_binding())), ("texture", TEXTURE, wgpu::BindingResource::TextureView(&view)), ("no-load", NOLOAD, wgpu::BindingResource::Buffer(wbuf.as_entire_buffer_binding())), ("alu", ALU, wgpu::BindingResource::Buffer(wbuf.as_entire_buffer_binding())), ("same-row", SAME_ROW, wgpu::BindingResource::Buffer(wbuf.as_entire_buffer_binding()))] {
            let src = format!("{COMMON}{body}").replace("TEXW", &format!("{TEX_W}u")).replace("WG", &format!("{wg}u"));
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(src.into()) });
            let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor { label: None, layout: None, module: &module, entry_point: Some("main"), compilation_options: Default::default(), cache: None });
            let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: params.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: xbuf.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 2, resource: out.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 3, resource: res.clone() },
                ],
            });
            let mut best = f64::MAX;
            for _ in 0..4 {
                let t = cpu_secs();
                let mut enc = device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    pass.set_pipeline(&pipe);
                    pass.set_bind_group(0, &bg, &[]);
                    pass.dispatch_workgroups(if name == "same-row" { N } else { N.div_ceil(wg) }, 1, 1);
                }
                enc.copy_buffer_to_buffer(&out, 0, &read, 0, N as u64 * 4);
                queue.submit([enc.finish()]);
                read.slice(..).map_async(wgpu::MapMode::Read, |_| {});
                device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
                let got: Vec<f32> = bytemuck::cast_slice(&read.slice(..).get_mapped_range().expect("mapped")).to_vec();
                read.unmap();
                best = best.min(cpu_secs() - t);
                let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(err < 1e-3 || name == "no-load" || name == "alu" || name == "same-row", "{name}: max error {err}");
            }
            let gb = (words * 4) as f64 / 1e9;
            println!("WG {wg:3} {name:8}: {:7.2} ms  {:5.2} GB/s of bf16 weights per CPU-second", best * 1e3, gb / best);
        }
    }
}
