//! Reads the machine for the "when to train" rule ([`crate::when`]): the
//! power source, input idle time and full-screen windows (Linux: sysfs and
//! X11; Windows and macOS: [`super::desktop`]), and the time of day. A source this platform or session cannot read stays
//! `None`, and the rule that needs it never pauses; the settings screen says
//! which those are ([`Sensors::missing`]).

use super::gpu::{Gpu, GpuHealth};
use crate::when::Sample;
#[cfg(target_os = "linux")]
use std::path::Path;
use std::time::Instant;

/// The machine's sources, opened once.
pub struct Sensors {
    started: Instant,
    /// Linux: `/sys/class/power_supply`, read each sample (a few files).
    #[cfg(target_os = "linux")]
    power: Option<&'static Path>,
    #[cfg(target_os = "linux")]
    x11: Option<super::x11::X11>,
    gpu: Gpu,
}

impl Default for Sensors {
    fn default() -> Self {
        Self::new()
    }
}

impl Sensors {
    pub fn new() -> Self {
        #[cfg(target_os = "linux")]
        let sys = Path::new("/sys/class/power_supply");
        Sensors {
            started: Instant::now(),
            #[cfg(target_os = "linux")]
            power: sys.is_dir().then_some(sys),
            #[cfg(target_os = "linux")]
            x11: super::x11::X11::open(),
            gpu: Gpu::open(),
        }
    }

    /// One reading now.
    pub fn sample(&self) -> Sample {
        self.read().0
    }

    /// One reading now, with the GPU's health for the screens.
    pub fn read(&self) -> (Sample, Option<GpuHealth>) {
        use chrono::Timelike;
        let local = chrono::Local::now();
        #[cfg(target_os = "linux")]
        let (input_idle, fullscreen) = self
            .x11
            .as_ref()
            .map_or((None, None), |x| (x.input_idle(), x.fullscreen()));
        #[cfg(not(target_os = "linux"))]
        let (input_idle, fullscreen) = (super::desktop::input_idle(), super::desktop::fullscreen());
        let gpu = self.gpu.read();
        let sample = Sample {
            at: self.started.elapsed(),
            minute_of_day: (local.hour() * 60 + local.minute()) as u16,
            input_idle,
            fullscreen,
            on_battery: self.battery(),
            gpu_temp_c: gpu.as_ref().and_then(|g| g.temp_c),
            other_gpu_percent: gpu.as_ref().and_then(|g| g.other_percent),
        };
        (sample, gpu)
    }

    #[cfg(target_os = "linux")]
    fn battery(&self) -> Option<bool> {
        self.power.and_then(on_battery)
    }

    #[cfg(not(target_os = "linux"))]
    fn battery(&self) -> Option<bool> {
        super::desktop::on_battery()
    }

    /// The rules that cannot act on this machine yet, in words.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let s = self.sample();
        if s.other_gpu_percent.is_none() {
            out.push("other programs' GPU load");
        }
        if s.gpu_temp_c.is_none() {
            out.push("GPU temperature");
        }
        if s.input_idle.is_none() {
            out.push("keyboard and mouse idle time");
        }
        if s.fullscreen.is_none() {
            out.push("full-screen windows");
        }
        if s.on_battery.is_none() {
            out.push("battery");
        }
        out
    }
}

/// Seconds since local midnight: where "today" starts for the tray.
pub fn secs_since_midnight() -> f64 {
    use chrono::Timelike;
    f64::from(chrono::Local::now().num_seconds_from_midnight())
}

/// Linux: on battery when no mains supply is online and a battery is
/// discharging; `None` on a machine with neither (a desktop or a VM
/// reports no supplies at all, and is treated as on the mains).
#[cfg(target_os = "linux")]
fn on_battery(dir: &Path) -> Option<bool> {
    let read = |p: &Path, f: &str| {
        std::fs::read_to_string(p.join(f))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut mains = None;
    let mut discharging = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        match read(&p, "type").as_deref() {
            Some("Mains") => {
                let online = read(&p, "online").as_deref() == Some("1");
                mains = Some(mains.unwrap_or(false) || online);
            }
            Some("Battery") => {
                let d = read(&p, "status").as_deref() == Some("Discharging");
                discharging = Some(discharging.unwrap_or(false) || d);
            }
            _ => {}
        }
    }
    match (mains, discharging) {
        (Some(true), _) => Some(false),
        (_, Some(d)) => Some(d),
        (Some(false), None) => Some(false),
        (None, None) => None,
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn supply(dir: &Path, name: &str, files: &[(&str, &str)]) {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in files {
            std::fs::write(d.join(f), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn a_laptop_unplugged_is_on_battery_and_plugged_in_is_not() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(on_battery(t.path()), None);
        supply(t.path(), "AC", &[("type", "Mains"), ("online", "0")]);
        supply(
            t.path(),
            "BAT0",
            &[("type", "Battery"), ("status", "Discharging")],
        );
        assert_eq!(on_battery(t.path()), Some(true));
        supply(t.path(), "AC", &[("type", "Mains"), ("online", "1")]);
        supply(
            t.path(),
            "BAT0",
            &[("type", "Battery"), ("status", "Charging")],
        );
        assert_eq!(on_battery(t.path()), Some(false));
        // A desktop with a UPS reported as a mains supply only.
        let d = tempfile::tempdir().unwrap();
        supply(d.path(), "ups", &[("type", "Mains"), ("online", "1")]);
        assert_eq!(on_battery(d.path()), Some(false));
    }
}
