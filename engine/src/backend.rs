//! Where gradients are computed: CUDA when a device and driver are present,
//! else wgpu (Vulkan/Metal/DX12), else the CPU. One forward pass
//! ([`crate::model::loss`]) serves all three; the choice is made at run time
//! and explained in one line.

use crate::error::EngineError;
use crate::model::{self, ModelConfig};
use crate::params::ParamSet;
use burn::backend::{Autodiff, Cuda, NdArray, Wgpu};
use burn::prelude::*;
use burn::tensor::Transaction;
use burn::tensor::backend::AutodiffBackend;

/// Computes loss and gradients for the CPU master weights on some device.
pub trait GradientEngine: Send {
    fn kind(&self) -> BackendKind;
    /// Mean loss and one gradient per parameter, in [`ModelConfig::shapes`] order.
    fn loss_and_grads(
        &mut self,
        cfg: &ModelConfig,
        params: &ParamSet,
        inputs: &[u8],
        targets: &[u8],
        batch: usize,
    ) -> Result<(f32, Vec<Vec<f32>>), EngineError>;
    /// Mean loss only (no autodiff graph).
    fn loss(
        &mut self,
        cfg: &ModelConfig,
        params: &ParamSet,
        inputs: &[u8],
        targets: &[u8],
        batch: usize,
    ) -> Result<f32, EngineError>;
    /// Hands the device memory the backend keeps pooled between steps back
    /// to the driver (a paused member whose owner wants the VRAM). The
    /// weights live on the CPU, so the next step only allocates again.
    fn release_memory(&mut self) {}
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Wgpu,
    Cuda,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Cpu,
    Wgpu,
    Cuda,
}

impl std::str::FromStr for BackendChoice {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "wgpu" => Ok(Self::Wgpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(EngineError::Backend(format!(
                "unknown backend `{other}` (auto, cpu, wgpu, cuda)"
            ))),
        }
    }
}

struct BurnEngine<B: AutodiffBackend> {
    device: B::Device,
    kind: BackendKind,
}

fn upload<B: Backend>(params: &ParamSet, device: &B::Device) -> Vec<Tensor<B, 1>> {
    params
        .values
        .iter()
        .map(|v| Tensor::<B, 1>::from_data(TensorData::new(v.clone(), [v.len()]), device))
        .collect()
}

fn scalar<B: Backend>(t: Tensor<B, 1>) -> Result<f32, EngineError> {
    let data = t
        .try_into_data()
        .map_err(|e| EngineError::Backend(format!("{e:?}")))?;
    let v: Vec<f32> = data.iter::<f32>().collect();
    v.first()
        .copied()
        .ok_or_else(|| EngineError::Backend("empty loss".into()))
}

impl<B: AutodiffBackend> GradientEngine for BurnEngine<B>
where
    B::Device: Send,
{
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn release_memory(&mut self) {
        B::memory_cleanup(&self.device);
    }

    fn loss_and_grads(
        &mut self,
        cfg: &ModelConfig,
        params: &ParamSet,
        inputs: &[u8],
        targets: &[u8],
        batch: usize,
    ) -> Result<(f32, Vec<Vec<f32>>), EngineError> {
        let leaves: Vec<Tensor<B, 1>> = upload::<B>(params, &self.device)
            .into_iter()
            .map(|t| t.require_grad())
            .collect();
        let loss = model::loss(cfg, &leaves, inputs, targets, batch, &self.device);
        let grads = loss.backward();
        let mut tx = Transaction::<B::InnerBackend>::default();
        tx = tx.register(loss.inner());
        for (i, leaf) in leaves.iter().enumerate() {
            let g = leaf.grad(&grads).ok_or_else(|| {
                EngineError::Backend(format!("no gradient for parameter {}", params.names[i]))
            })?;
            tx = tx.register(g);
        }
        let mut data = tx
            .try_execute()
            .map_err(|e| EngineError::Backend(format!("{e:?}")))?
            .into_iter();
        let loss_value = data
            .next()
            .and_then(|d| d.iter::<f32>().next())
            .ok_or_else(|| EngineError::Backend("empty loss".into()))?;
        let out = data.map(|d| d.iter::<f32>().collect()).collect();
        Ok((loss_value, out))
    }

    fn loss(
        &mut self,
        cfg: &ModelConfig,
        params: &ParamSet,
        inputs: &[u8],
        targets: &[u8],
        batch: usize,
    ) -> Result<f32, EngineError> {
        let leaves = upload::<B::InnerBackend>(params, &self.device);
        scalar(model::loss(
            cfg,
            &leaves,
            inputs,
            targets,
            batch,
            &self.device,
        ))
    }
}

/// The CPU engine: always available, deterministic.
pub fn cpu() -> Box<dyn GradientEngine> {
    Box::new(BurnEngine::<Autodiff<NdArray>> {
        device: Default::default(),
        kind: BackendKind::Cpu,
    })
}

/// Hardware adapters wgpu can see (software rasterizers such as lavapipe
/// included, reported with their device type).
pub fn wgpu_adapters() -> Vec<wgpu::AdapterInfo> {
    wgpu_adapter_handles()
        .into_iter()
        .map(|a| a.get_info())
        .collect()
}

/// The same adapters, opened: what a benchmark measures is what training
/// may pick.
pub fn wgpu_adapter_handles() -> Vec<wgpu::Adapter> {
    let backends = if cfg!(target_os = "macos") {
        wgpu::Backends::METAL
    } else {
        wgpu::Backends::VULKAN
    };
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    burn::tensor::read_sync(instance.enumerate_adapters(backends))
}

/// The CUDA device 0's name, or why there is none. Never panics: the driver
/// and NVRTC are looked up before burn would touch them.
pub fn cuda_probe() -> Result<String, String> {
    use cudarc::driver::result;
    // SAFETY: these only try to dlopen the libraries by name.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda) found".into());
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("CUDA driver found but no NVRTC (libnvrtc) to compile kernels".into());
    }
    result::init().map_err(|e| format!("CUDA driver failed to start: {e}"))?;
    let n = result::device::get_count().map_err(|e| format!("CUDA: {e}"))?;
    if n < 1 {
        return Err("CUDA driver found but no CUDA device".into());
    }
    let dev = result::device::get(0).map_err(|e| format!("CUDA: {e}"))?;
    result::device::get_name(dev).map_err(|e| format!("CUDA: {e}"))
}

/// The engine picked, and a one-line reason a user can act on.
pub struct Selected {
    pub engine: Box<dyn GradientEngine>,
    pub reason: String,
}

/// wgpu on a hardware adapter only: what a test that wants "another
/// backend" means. A software rasterizer (lavapipe, llvmpipe) is the CPU
/// again, hundreds of times slower, and installing Mesa's Vulkan drivers
/// made the P2P attackers test run a member on it and time out.
pub fn hardware_wgpu() -> Option<Selected> {
    wgpu_engine().ok()
}

/// wgpu on the first hardware adapter. A software rasterizer is refused even
/// when wgpu is asked for by name: it is the CPU again, hundreds of times
/// slower, and a benchmark or GPU check run on it would report a GPU figure
/// that is not one.
fn wgpu_engine() -> Result<Selected, String> {
    let adapters = wgpu_adapters();
    let pick = adapters
        .iter()
        .find(|a| a.device_type != wgpu::DeviceType::Cpu);
    match pick {
        Some(a) => Ok(Selected {
            engine: Box::new(BurnEngine::<Autodiff<Wgpu>> {
                device: Default::default(),
                kind: BackendKind::Wgpu,
            }),
            reason: format!("wgpu: {} ({:?}, {:?})", a.name, a.device_type, a.backend),
        }),
        None if adapters.is_empty() => Err("no wgpu adapter found".into()),
        None => Err(format!(
            "only software wgpu adapters found ({})",
            adapters
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

pub fn select(choice: BackendChoice) -> Result<Selected, EngineError> {
    let cuda = || -> Result<Selected, String> {
        let name = cuda_probe()?;
        Ok(Selected {
            engine: Box::new(BurnEngine::<Autodiff<Cuda>> {
                device: Default::default(),
                kind: BackendKind::Cuda,
            }),
            reason: format!("cuda: {name}"),
        })
    };
    match choice {
        BackendChoice::Cpu => Ok(Selected {
            engine: cpu(),
            reason: "cpu: chosen explicitly".into(),
        }),
        BackendChoice::Cuda => cuda().map_err(EngineError::Backend),
        BackendChoice::Wgpu => wgpu_engine().map_err(|why| {
            EngineError::Backend(format!(
                "{why}: a software rasterizer is the CPU again, choose the CPU backend"
            ))
        }),
        BackendChoice::Auto => match cuda() {
            Ok(s) => Ok(s),
            Err(why_not_cuda) => match wgpu_engine() {
                Ok(mut s) => {
                    s.reason = format!("{} ({why_not_cuda})", s.reason);
                    Ok(s)
                }
                Err(why_not_wgpu) => Ok(Selected {
                    engine: cpu(),
                    reason: format!("cpu: {why_not_cuda}; {why_not_wgpu}"),
                }),
            },
        },
    }
}
