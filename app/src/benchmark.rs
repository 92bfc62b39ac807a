//! The machine benchmark behind a node's attestation: which adapters wgpu
//! sees (and CUDA, when a driver is there), dense matmul throughput in fp32
//! and fp16 where the adapter supports it, and memory bandwidth, measured
//! with our own compute shaders; plus the CPU's fp32 rate, since that is
//! what trains on a machine without a usable GPU.
//!
//! The figures a node registers with are the ones of the device the engine
//! will train on, signed by the wallet key ([`attest`]).

use cohort_program::state::{Backend, Benchmark};
use solana_sdk::signature::{Keypair, Signer};
use std::time::{Duration, Instant};

/// One adapter as wgpu reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterView {
    pub name: String,
    /// "discrete GPU", "integrated GPU", "software (CPU)", ...
    pub kind: String,
    pub api: String,
    pub driver: String,
    pub software: bool,
}

/// What one adapter measured.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceFigures {
    pub adapter: AdapterView,
    pub fp32_tflops: f64,
    /// None where the adapter lacks `SHADER_F16`.
    pub fp16_tflops: Option<f64>,
    pub bandwidth_gbps: f64,
    pub vram_mib: u32,
}

/// A whole benchmark run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    pub adapters: Vec<AdapterView>,
    /// CUDA device 0's name, or why there is none.
    pub cuda: Option<Result<String, String>>,
    pub cpu_threads: usize,
    pub cpu_fp32_gflops: f64,
    pub devices: Vec<DeviceFigures>,
    /// Adapters that failed to measure, with the reason.
    pub failures: Vec<String>,
    pub secs: f64,
}

/// Reference figures for the comparison bars: vendors' published peak
/// numbers (dense fp32 without tensor cores, memory bandwidth), from the
/// NVIDIA RTX 3060 / RTX 4090 and H100 SXM spec sheets.
pub const REFERENCES: &[(&str, f64, f64)] = &[
    ("RTX 3060", 12.7, 360.0),
    ("RTX 4090", 82.6, 1008.0),
    ("H100 SXM", 67.0, 3350.0),
];

impl Report {
    /// A report of this machine's CPU alone, measured at `gflops`.
    pub fn cpu(gflops: f64) -> Self {
        Self {
            cpu_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_fp32_gflops: gflops,
            ..Default::default()
        }
    }

    /// The device training will use, as (backend, name, fp32 GFLOPS, fp16
    /// GFLOPS, bandwidth GB/s, VRAM MiB): the fastest hardware GPU, else the
    /// CPU. Software adapters are shown but never trained on.
    pub fn training_device(&self) -> (Backend, String, f64, f64, f64, u32) {
        let gpu = self
            .devices
            .iter()
            .filter(|d| !d.adapter.software)
            .max_by(|a, b| a.fp32_tflops.total_cmp(&b.fp32_tflops));
        match gpu {
            Some(d) => (
                Backend::Wgpu,
                d.adapter.name.clone(),
                d.fp32_tflops * 1e3,
                d.fp16_tflops.unwrap_or(0.0) * 1e3,
                d.bandwidth_gbps,
                d.vram_mib,
            ),
            None => (
                Backend::Cpu,
                format!("cpu ({} threads)", self.cpu_threads),
                self.cpu_fp32_gflops,
                0.0,
                0.0,
                0,
            ),
        }
    }
}

/// Runs everything; each part is bounded by `budget` (a few of them in all).
pub fn run(budget: Duration) -> Report {
    let t0 = Instant::now();
    let mut r = Report {
        cuda: Some(cohort_engine::backend::cuda_probe()),
        ..Report::cpu(cohort_engine::probe::cpu_fp32_gflops(budget))
    };
    for adapter in cohort_engine::backend::wgpu_adapter_handles() {
        let view = view_of(&adapter.get_info());
        r.adapters.push(view.clone());
        match measure(&adapter, view.clone(), budget) {
            Ok(d) => r.devices.push(d),
            Err(e) => r.failures.push(format!("{}: {e}", view.name)),
        }
    }
    r.secs = t0.elapsed().as_secs_f64();
    r
}

/// The attestation `register_node` submits: the training device's figures,
/// signed by the node key over their exact bytes (signature zeroed).
pub fn attest(me: &Keypair, r: &Report) -> Benchmark {
    let (backend, name, fp32, fp16, bw, vram) = r.training_device();
    let mut b = Benchmark {
        backend: backend as u8,
        fp32_gflops: fp32.round().max(1.0) as u32,
        fp16_gflops: fp16.round() as u32,
        mem_bw_gbps: bw.round() as u32,
        vram_mib: vram,
        version: 1,
        ..Default::default()
    };
    b.set_device_name(&name);
    sign(me, &mut b);
    b
}

/// The bytes a benchmark attestation signs.
pub fn signed_message(b: &Benchmark) -> Vec<u8> {
    let mut msg = b"cohort-benchmark-v1".to_vec();
    msg.extend_from_slice(&b.device);
    msg.push(b.backend);
    for v in [b.fp32_gflops, b.fp16_gflops, b.mem_bw_gbps, b.vram_mib] {
        msg.extend_from_slice(&v.to_le_bytes());
    }
    msg
}

fn sign(me: &Keypair, b: &mut Benchmark) {
    b.signature = me.sign_message(&signed_message(b)).into();
}

fn view_of(i: &wgpu::AdapterInfo) -> AdapterView {
    let kind = match i.device_type {
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Cpu => "software (CPU)",
        wgpu::DeviceType::Other => "other",
    };
    AdapterView {
        name: i.name.clone(),
        kind: kind.into(),
        api: format!("{:?}", i.backend),
        driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
        software: i.device_type == wgpu::DeviceType::Cpu,
    }
}

const MATMUL: &str = r#"
ENABLE
struct Dims { n: u32 }
@group(0) @binding(0) var<storage, read> a: array<T>;
@group(0) @binding(1) var<storage, read> b: array<T>;
@group(0) @binding(2) var<storage, read_write> c: array<T>;
@group(0) @binding(3) var<uniform> dims: Dims;
var<workgroup> ta: array<array<T, 16>, 16>;
var<workgroup> tb: array<array<T, 16>, 16>;

// 16x16 tiles staged in workgroup memory; one output element per thread.
@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let n = dims.n;
    var acc: T = T(0.0);
    for (var t: u32 = 0u; t < n; t = t + 16u) {
        ta[l.y][l.x] = a[g.y * n + t + l.x];
        tb[l.y][l.x] = b[(t + l.y) * n + g.x];
        workgroupBarrier();
        for (var k: u32 = 0u; k < 16u; k = k + 1u) {
            acc = acc + ta[l.y][k] * tb[k][l.x];
        }
        workgroupBarrier();
    }
    c[g.y * n + g.x] = acc;
}
"#;

const COPY: &str = r#"
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {
    let i = g.x + g.y * w.x * 256u;
    if (i < arrayLength(&src)) {
        dst[i] = src[i];
    }
}
"#;

struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
}

impl Gpu {
    fn storage(&self, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    fn pipeline(&self, src: &str) -> wgpu::ComputePipeline {
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: None,
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        self.device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: None,
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
    }

    fn bind(&self, p: &wgpu::ComputePipeline, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let entries: Vec<_> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &p.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    /// Seconds for `reps` dispatches of `groups`, submitted at once and
    /// waited for.
    fn time(
        &self,
        p: &wgpu::ComputePipeline,
        bg: &wgpu::BindGroup,
        groups: (u32, u32),
        reps: u32,
    ) -> Result<f64, String> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(p);
            pass.set_bind_group(0, bg, &[]);
            for _ in 0..reps {
                pass.dispatch_workgroups(groups.0, groups.1, 1);
            }
        }
        let t = Instant::now();
        self.queue.submit([enc.finish()]);
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("waiting for the GPU: {e}"))?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Repeats until one batch takes at least `budget / 4`, then reports
    /// the best rate over the rest of the budget (warm clocks, no setup).
    fn rate(
        &self,
        p: &wgpu::ComputePipeline,
        bg: &wgpu::BindGroup,
        groups: (u32, u32),
        work: f64,
        budget: Duration,
    ) -> Result<f64, String> {
        let deadline = Instant::now() + budget;
        let mut reps = 1u32;
        let mut best = 0.0f64;
        self.time(p, bg, groups, 1)?;
        loop {
            let secs = self.time(p, bg, groups, reps)?.max(1e-9);
            best = best.max(work * reps as f64 / secs);
            if Instant::now() >= deadline {
                return Ok(best);
            }
            if secs < budget.as_secs_f64() / 8.0 && reps < 1 << 16 {
                reps *= 2;
            }
        }
    }
}

fn measure(
    adapter: &wgpu::Adapter,
    view: AdapterView,
    budget: Duration,
) -> Result<DeviceFigures, String> {
    let f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
    let required_features = if f16 {
        wgpu::Features::SHADER_F16
    } else {
        wgpu::Features::empty()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("cohort benchmark"),
        required_features,
        required_limits: wgpu::Limits::default(),
        ..Default::default()
    }))
    .map_err(|e| format!("no device: {e}"))?;
    let gpu = Gpu { device, queue };
    let fp32 = matmul(&gpu, "f32", 4, budget)?;
    let fp16 = if f16 {
        Some(matmul(&gpu, "f16", 2, budget)?)
    } else {
        None
    };
    // Bandwidth: read and write 64 MiB each pass.
    let bytes = 64u64 << 20;
    let src = gpu.storage(bytes);
    let dst = gpu.storage(bytes);
    let p = gpu.pipeline(COPY);
    let bg = gpu.bind(&p, &[&src, &dst]);
    let groups = (bytes / 16).div_ceil(256) as u32;
    let (x, y) = if groups > 65535 {
        (65535, groups.div_ceil(65535))
    } else {
        (groups, 1)
    };
    let bw = gpu.rate(&p, &bg, (x, y), 2.0 * bytes as f64, budget)? / 1e9;
    let vram = match view.software {
        true => 0,
        false => (adapter.limits().max_buffer_size >> 20).min(u32::MAX as u64) as u32,
    };
    Ok(DeviceFigures {
        adapter: view,
        fp32_tflops: fp32 / 1e12,
        fp16_tflops: fp16.map(|v| v / 1e12),
        bandwidth_gbps: bw,
        vram_mib: vram,
    })
}

/// FLOP/s of an n×n matmul in `ty`, n grown until one dispatch is long
/// enough to time well (software adapters stay small).
fn matmul(gpu: &Gpu, ty: &str, elem: u64, budget: Duration) -> Result<f64, String> {
    let src = MATMUL
        .replace("ENABLE", if ty == "f16" { "enable f16;" } else { "" })
        .replace("array<T", &format!("array<{ty}"))
        .replace("T, 16>", &format!("{ty}, 16>"))
        .replace("var acc: T = T(0.0)", &format!("var acc: {ty} = {ty}(0.0)"));
    let p = gpu.pipeline(&src);
    let mut n = 256u32;
    loop {
        let bytes = n as u64 * n as u64 * elem;
        let (a, b, c) = (gpu.storage(bytes), gpu.storage(bytes), gpu.storage(bytes));
        let dims = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 16,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut d = [0u8; 16];
        d[..4].copy_from_slice(&n.to_le_bytes());
        gpu.queue.write_buffer(&dims, 0, &d);
        let bg = gpu.bind(&p, &[&a, &b, &c, &dims]);
        let groups = (n / 16, n / 16);
        let one = gpu.time(&p, &bg, groups, 1)?;
        if one > 0.02 || n >= 4096 {
            let flops = 2.0 * (n as f64).powi(3);
            return gpu.rate(&p, &bg, groups, flops, budget);
        }
        n *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attestation_is_signed_by_the_wallet_over_the_training_device() {
        let me = Keypair::new();
        let r = Report {
            cpu_threads: 2,
            cpu_fp32_gflops: 41.6,
            ..Default::default()
        };
        let b = attest(&me, &r);
        assert_eq!(b.backend, Backend::Cpu as u8);
        assert_eq!(b.fp32_gflops, 42);
        assert_eq!(b.device_name(), "cpu (2 threads)");
        let sig = solana_sdk::signature::Signature::from(b.signature);
        assert!(sig.verify(me.pubkey().as_ref(), &signed_message(&b)));
        // Any change to a signed figure breaks the signature.
        let mut forged = b;
        forged.fp32_gflops += 1;
        assert!(!sig.verify(me.pubkey().as_ref(), &signed_message(&forged)));
    }

    #[test]
    fn a_hardware_gpu_is_preferred_and_software_adapters_never_are() {
        let dev = |name: &str, software, tflops| DeviceFigures {
            adapter: AdapterView {
                name: name.into(),
                kind: String::new(),
                api: String::new(),
                driver: String::new(),
                software,
            },
            fp32_tflops: tflops,
            fp16_tflops: None,
            bandwidth_gbps: 100.0,
            vram_mib: 8192,
        };
        let mut r = Report {
            cpu_threads: 2,
            cpu_fp32_gflops: 40.0,
            devices: vec![dev("llvmpipe", true, 0.2)],
            ..Default::default()
        };
        assert_eq!(r.training_device().0, Backend::Cpu);
        r.devices.push(dev("RTX", false, 20.0));
        let (b, name, gflops, ..) = r.training_device();
        assert_eq!((b, name.as_str(), gflops), (Backend::Wgpu, "RTX", 20_000.0));
    }
}
