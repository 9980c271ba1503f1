//! Probe (kept as a record of why matmul binds what it binds): time one decode-shape matmul
//! (1536x576 bf16, m = 1) with the weights read from a storage buffer versus an rgba32uint
//! texture, and x from a storage versus a uniform buffer. CPU time of the process's threads.
//!
//!     cargo run -p tandem-wgpu --example tex_probe

use std::time::Instant;

use wgpu::util::DeviceExt;

const N: u32 = 1536;
const K: u32 = 576;

const COMMON: &str = r#"
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
fn unpack(v: vec4<u32>) -> mat2x4<f32> {
    let lo = vec4<u32>(v.x << 16u, v.x & 0xffff0000u, v.y << 16u, v.y & 0xffff0000u);
    let hi = vec4<u32>(v.z << 16u, v.z & 0xffff0000u, v.w << 16u, v.w & 0xffff0000u);
    return mat2x4<f32>(bitcast<vec4<f32>>(lo), bitcast<vec4<f32>>(hi));
}
"#;

/// w: 0 storage, 1 texture, 2 a 64 KiB uniform window (rows wrap inside it: same access cost).
fn kernel(w_kind: u32, x_uniform: bool) -> String {
    let wdecl = match w_kind {
        0 => "@group(0) @binding(0) var<storage, read> ws: array<vec4<u32>>;",
        1 => "@group(0) @binding(0) var wt: texture_2d<u32>;",
        _ => "@group(0) @binding(0) var<uniform> wu: array<vec4<u32>, 4096>;",
    };
    let xdecl = if x_uniform { "@group(0) @binding(1) var<uniform> x: array<vec4<f32>, 144>;" } else { "@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;" };
    let wload = match w_kind {
        0 => "ws[r * 72u + j]",
        1 => "textureLoad(wt, vec2<u32>(j, r), 0)",
        _ => "wu[(r % 56u) * 72u + j]",
    };
    format!(
        "{wdecl}\n{xdecl}\n{COMMON}\n@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let r = gid.x;
    if (r >= {N}u) {{ return; }}
    var acc = 0.0;
    for (var j = 0u; j < 72u; j++) {{
        let w = unpack({wload});
        acc += dot(x[2u * j], w[0]) + dot(x[2u * j + 1u], w[1]);
    }}
    out[r] = acc;
}}"
    )
}

fn cpu_secs() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()).filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok()).sum::<f64>() * 1e-9
}

fn main() {
    let instance = wgpu::Instance::new({
        let mut d = wgpu::InstanceDescriptor::new_without_display_handle();
        d.backends = wgpu::Backends::VULKAN;
        d
    });
    let adapter = pollster::block_on(instance.request_adapter(&Default::default())).expect("adapter");
    println!("{:?}", adapter.get_info().name);
    let l = adapter.limits();
    println!("max_uniform_buffer_binding_size {} max_uniform_buffers_per_shader_stage {} max_storage_buffer_binding_size {} max_texture_dimension_2d {} min_uniform_buffer_offset_alignment {} min_storage_buffer_offset_alignment {} max_immediate_size {}", l.max_uniform_buffer_binding_size, l.max_uniform_buffers_per_shader_stage, l.max_storage_buffer_binding_size, l.max_texture_dimension_2d, l.min_uniform_buffer_offset_alignment, l.min_storage_buffer_offset_alignment, l.max_immediate_size);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor { required_limits: adapter.limits(), ..Default::default() })).expect("device");
    let words: Vec<u32> = (0..N * K / 2).map(|i| i.wrapping_mul(2654435761) & 0x3f803f80).collect();
    let ws = device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(&words), usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM });
    let tex = device.create_texture(&wgpu::TextureDescriptor {
        label: None,
        size: wgpu::Extent3d { width: K / 8, height: N, depth_or_array_layers: 1 },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Uint,
        usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    });
    queue.write_texture(
        wgpu::TexelCopyTextureInfo { texture: &tex, mip_level: 0, origin: wgpu::Origin3d::ZERO, aspect: wgpu::TextureAspect::All },
        bytemuck::cast_slice(&words),
        wgpu::TexelCopyBufferLayout { offset: 0, bytes_per_row: Some(K / 8 * 16), rows_per_image: Some(N) },
        wgpu::Extent3d { width: K / 8, height: N, depth_or_array_layers: 1 },
    );
    let view = tex.create_view(&Default::default());
    let xs: Vec<f32> = (0..K).map(|i| (i % 7) as f32 * 0.1).collect();
    let xb = device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(&xs), usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM });
    let out = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: N as u64 * 4, usage: wgpu::BufferUsages::STORAGE, mapped_at_creation: false });
    for (w_kind, x_uniform) in [(0, false), (0, true), (1, true), (2, true), (0, true), (2, true)] {
        let desc = wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(kernel(w_kind, x_uniform).into()) };
        // SAFETY: the probe's indices stay inside the buffers and the texture by construction.
        let module = unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) };
        let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor { label: None, layout: None, module: &module, entry_point: Some("main"), compilation_options: Default::default(), cache: None });
        let wres = match w_kind {
            0 => ws.as_entire_binding(),
            1 => wgpu::BindingResource::TextureView(&view),
            _ => wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &ws, offset: 0, size: std::num::NonZeroU64::new(65536) }),
        };
        let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: wres },
                wgpu::BindGroupEntry { binding: 1, resource: xb.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: out.as_entire_binding() },
            ],
        });
        let run = |reps: usize| {
            let mut enc = device.create_command_encoder(&Default::default());
            for _ in 0..reps {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(N / 64, 1, 1);
            }
            queue.submit([enc.finish()]);
            device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        };
        run(2);
        let reps = 40;
        let (t0, c0) = (Instant::now(), cpu_secs());
        run(reps);
        let (wall, cpu) = (t0.elapsed().as_secs_f64() / reps as f64, (cpu_secs() - c0) / reps as f64);
        println!("w {:<8} x {:<8}: {:>8.1} us wall {:>8.1} us cpu", ["storage", "texture", "uniform"][w_kind as usize], if x_uniform { "uniform" } else { "storage" }, wall * 1e6, cpu * 1e6);
    }
}
