//! GPU health for the training rule and the screens: temperature, power,
//! utilisation (this app's and other programs') and memory. NVML through
//! `nvml-wrapper` where an NVIDIA driver is installed (it loads the
//! driver's library at run time, so the app builds and runs without one);
//! on Linux without it, what the kernel's DRM driver exposes in sysfs
//! (AMD's amdgpu: `gpu_busy_percent`, hwmon temperature and power).

use std::path::{Path, PathBuf};

/// One reading of the GPU; a field the source cannot read is `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuHealth {
    pub name: String,
    /// Where the figures come from ("NVML", "sysfs").
    pub source: &'static str,
    pub temp_c: Option<u32>,
    pub power_w: Option<f64>,
    /// Utilisation by every program, this one included.
    pub util_percent: Option<u8>,
    /// Utilisation by programs other than this one.
    pub other_percent: Option<u8>,
    pub mem_used: Option<u64>,
    pub mem_total: Option<u64>,
}

impl GpuHealth {
    /// One line for the benchmark and training screens.
    pub fn words(&self) -> String {
        let mut parts = vec![self.name.clone()];
        if let Some(t) = self.temp_c {
            parts.push(format!("{t} °C"));
        }
        if let Some(p) = self.power_w {
            parts.push(format!("{p:.0} W"));
        }
        if let Some(u) = self.util_percent {
            parts.push(format!("{u}% busy"));
        }
        if let Some(o) = self.other_percent {
            parts.push(format!("{o}% by other programs"));
        }
        if let (Some(u), Some(t)) = (self.mem_used, self.mem_total) {
            parts.push(format!(
                "memory {:.1} of {:.1} GB",
                u as f64 / 1e9,
                t as f64 / 1e9
            ));
        }
        format!("{} (from {})", parts.join(" · "), self.source)
    }
}

/// The GPU sources this machine has, opened once.
pub enum Gpu {
    Nvml(Box<nvml_wrapper::Nvml>),
    Sysfs(PathBuf),
    None,
}

impl Gpu {
    pub fn open() -> Self {
        if let Ok(n) = nvml_wrapper::Nvml::init()
            && n.device_count().is_ok_and(|c| c > 0)
        {
            return Gpu::Nvml(Box::new(n));
        }
        match drm_card(Path::new("/sys/class/drm")) {
            Some(dir) => Gpu::Sysfs(dir),
            None => Gpu::None,
        }
    }

    pub fn read(&self) -> Option<GpuHealth> {
        match self {
            Gpu::Nvml(n) => nvml(n).ok(),
            Gpu::Sysfs(dir) => Some(sysfs(dir)),
            Gpu::None => None,
        }
    }
}

fn nvml(n: &nvml_wrapper::Nvml) -> Result<GpuHealth, nvml_wrapper::error::NvmlError> {
    use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
    let d = n.device_by_index(0)?;
    let util = d.utilization_rates().ok().map(|u| u.gpu.min(100) as u8);
    let me = std::process::id();
    // Per-process samples over the last few seconds: the others' share.
    let other = d.process_utilization_stats(None).ok().map(|samples| {
        samples
            .iter()
            .filter(|s| s.pid != me)
            .map(|s| s.sm_util)
            .sum::<u32>()
            .min(100) as u8
    });
    let mem = d.memory_info().ok();
    Ok(GpuHealth {
        name: d.name().unwrap_or_else(|_| "NVIDIA GPU".into()),
        source: "NVML",
        temp_c: d.temperature(TemperatureSensor::Gpu).ok(),
        power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1e3),
        util_percent: util,
        other_percent: other,
        mem_used: mem.as_ref().map(|m| m.used),
        mem_total: mem.as_ref().map(|m| m.total),
    })
}

/// The first DRM card whose driver reports a busy percentage.
fn drm_card(drm: &Path) -> Option<PathBuf> {
    let mut cards: Vec<PathBuf> = std::fs::read_dir(drm)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("card") && !n.contains('-'))
        })
        .map(|p| p.join("device"))
        .filter(|d| d.join("gpu_busy_percent").is_file())
        .collect();
    cards.sort();
    cards.into_iter().next()
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn sysfs(dev: &Path) -> GpuHealth {
    let hwmon = std::fs::read_dir(dev.join("hwmon"))
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.path());
    let hw = |f: &str| hwmon.as_ref().and_then(|h| read_u64(&h.join(f)));
    GpuHealth {
        name: "GPU".into(),
        source: "sysfs",
        temp_c: hw("temp1_input").map(|m| (m / 1000) as u32),
        power_w: hw("power1_average").map(|uw| uw as f64 / 1e6),
        util_percent: read_u64(&dev.join("gpu_busy_percent")).map(|p| p.min(100) as u8),
        // The kernel does not split the load by program.
        other_percent: None,
        mem_used: read_u64(&dev.join("mem_info_vram_used")),
        mem_total: read_u64(&dev.join("mem_info_vram_total")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_amd_card_is_read_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("card1/device");
        std::fs::create_dir_all(dev.join("hwmon/hwmon3")).unwrap();
        std::fs::create_dir_all(dir.path().join("card1-DP-1")).unwrap();
        for (f, v) in [
            ("gpu_busy_percent", "87"),
            ("mem_info_vram_used", "2000000000"),
            ("mem_info_vram_total", "8000000000"),
            ("hwmon/hwmon3/temp1_input", "71000"),
            ("hwmon/hwmon3/power1_average", "155000000"),
        ] {
            std::fs::write(dev.join(f), v).unwrap();
        }
        let card = drm_card(dir.path()).unwrap();
        let h = sysfs(&card);
        assert_eq!(h.temp_c, Some(71));
        assert_eq!(h.power_w, Some(155.0));
        assert_eq!(h.util_percent, Some(87));
        assert_eq!(h.other_percent, None);
        assert!(
            h.words().contains("71 °C · 155 W · 87% busy"),
            "{}",
            h.words()
        );
        assert!(drm_card(&dir.path().join("nothing")).is_none());
    }
}
