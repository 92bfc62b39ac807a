//! `app`: the desktop app's cold start and frame times, in a real window
//! (run under `xvfb-run -a` on a machine without a display).
//!
//! - Start: the bench's spawn of the process to the first frame presented,
//!   tray on, page cache emptied before each launch where the system allows
//!   (else labelled warm), for `cohort app` against an empty eframe window
//!   from the same binary (`--bare`), each the median of several launches.
//!   Goal < 1 s.
//! - Frame time while training: the tour (fresh wallet → Sandbox job →
//!   training → claim), with eframe's CPU time per frame while the
//!   training view is up. Goal ≤ 16 ms.

use crate::args::Args;
use crate::report::{self, Figures};
use anyhow::{Context, Result, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

const FLAGS: &[&str] = &["launches"];

/// The `cohort` binary built with this bench's profile, next to it.
pub(crate) fn cohort() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("bench binary has no folder")?;
    let release = dir.ends_with("release");
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build.args(["build", "-q", "-p", "cohort-app", "--bin", "cohort"]);
    if release {
        build.arg("--release");
    }
    ensure!(
        build.status()?.success(),
        "building the cohort binary failed"
    );
    Ok(dir.join("cohort"))
}

/// What one launch measured.
struct Launch {
    /// From the bench's spawn of the process to the first frame presented.
    from_spawn_ms: f64,
    /// From the app's `main()` to the same frame.
    from_main_ms: f64,
    /// Whether the tray icon came up (it needs a D-Bus session bus).
    tray: bool,
}

/// Empties the page cache so a launch reads the binary and its libraries
/// from disk, as the first launch after boot does; false where the system
/// does not allow it (not root, or a container), and then launches are warm.
fn drop_page_cache() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// One launch; retried once, since a fresh Xvfb can refuse the very first
/// connection.
fn first_frame(bin: &Path, bare: bool, data: &Path, cold: bool) -> Result<Launch> {
    launch(bin, bare, data, cold).or_else(|_| launch(bin, bare, data, cold))
}

fn launch(bin: &Path, bare: bool, data: &Path, cold: bool) -> Result<Launch> {
    let out = data.join("first-frame.txt");
    let _ = std::fs::remove_file(&out);
    let mut c = Command::new(bin);
    c.args(["app", "--data"])
        .arg(data)
        .arg("--first-frame")
        .arg(&out);
    if bare {
        c.arg("--bare");
    }
    if cold {
        drop_page_cache();
    }
    let spawned = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64() * 1e3;
    let s = c.output()?;
    let stderr = String::from_utf8_lossy(&s.stderr);
    ensure!(s.status.success(), "cohort app failed: {stderr}");
    let text = std::fs::read_to_string(&out).context("no first-frame time written")?;
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    let (Some(Ok(from_main_ms)), Some(Ok(frame_unix_ms))) = (fields.next(), fields.next()) else {
        bail!(
            "first-frame file `{}` is not `<ms since main> <unix ms>`",
            text.trim()
        );
    };
    Ok(Launch {
        from_spawn_ms: frame_unix_ms - spawned,
        from_main_ms,
        tray: !bare && !stderr.contains("tray: not shown"),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(raw: &[String]) -> Result<()> {
    let a = Args::parse(raw, FLAGS)?;
    let launches: usize = a.get("launches", 5)?;
    if std::env::var_os("DISPLAY").is_none() && std::env::var_os("WAYLAND_DISPLAY").is_none() {
        bail!(
            "the app bench needs a display: run it as `dbus-run-session -- sh -c 'scripts/sni-watcher.py & xvfb-run -a cargo run --release -p cohort-bench -- app'` (the watcher, which needs `pip install dbus-next`, stands in for a desktop panel so the tray icon registers)"
        );
    }
    let bin = cohort()?;
    let tmp = std::env::temp_dir().join(format!("cohort-app-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    // Cold where the system lets the bench empty the page cache before each
    // launch; warm (and labelled so) where it does not.
    let cold = drop_page_cache();
    let cache = if cold { "cold" } else { "warm" };
    // Alternate so both see the same page cache and machine load.
    let (mut bare, mut full) = (Vec::new(), Vec::new());
    for _ in 0..launches {
        bare.push(first_frame(&bin, true, &tmp, cold)?);
        full.push(first_frame(&bin, false, &tmp, cold)?);
    }
    let tray = full.iter().filter(|l| l.tray).count();
    let stat = |v: &[Launch], g: fn(&Launch) -> f64| {
        let xs: Vec<f64> = v.iter().map(g).collect();
        let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (median(xs), min, max)
    };
    let (bare_ms, bare_min, bare_max) = stat(&bare, |l| l.from_spawn_ms);
    let (full_ms, full_min, full_max) = stat(&full, |l| l.from_spawn_ms);
    let (full_main_ms, _, _) = stat(&full, |l| l.from_main_ms);
    println!("{cache} start, spawn to first frame (median of {launches}, min–max):");
    println!("  empty eframe window : {bare_ms:.0} ms ({bare_min:.0}–{bare_max:.0})");
    println!(
        "  cohort app          : {full_ms:.0} ms ({full_min:.0}–{full_max:.0}); {:.2}× the empty window; goal < 1000 ms; tray shown in {tray} of {launches}",
        full_ms / bare_ms
    );

    let shots = tmp.join("tour");
    let s = Command::new(&bin)
        .args(["app", "--tour"])
        .arg(&shots)
        .output()?;
    ensure!(
        s.status.success(),
        "the tour failed: {}",
        String::from_utf8_lossy(&s.stderr)
    );
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shots.join("frames.json"))?)?;
    ensure!(stats["ok"] == true, "the tour did not finish: {stats}");
    let g = |k: &str| stats[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "frame time while training ({} frames):",
        g("training_frames")
    );
    println!(
        "  eframe CPU per frame: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (goal ≤ 16 ms)",
        g("training_frame_cpu_ms_p50"),
        g("training_frame_cpu_ms_p99"),
        g("training_frame_cpu_ms_max")
    );
    println!(
        "  app ui() per frame  : p50 {:.2} ms, p99 {:.2} ms",
        g("training_frame_ms_p50"),
        g("training_frame_ms_p99")
    );
    let _ = std::fs::remove_dir_all(&tmp);

    let mut f = Figures::default();
    f.num("launches", launches as f64)
        .num("cold_page_cache", if cold { 1.0 } else { 0.0 })
        .num("first_frame_ms_bare", bare_ms)
        .num("first_frame_ms_bare_min", bare_min)
        .num("first_frame_ms_bare_max", bare_max)
        .num("first_frame_ms_app", full_ms)
        .num("first_frame_ms_app_min", full_min)
        .num("first_frame_ms_app_max", full_max)
        .num("first_frame_ms_app_from_main", full_main_ms)
        .num("first_frame_ratio_to_bare", full_ms / bare_ms)
        .num("tray_shown_launches", tray as f64)
        .num("training_frames", g("training_frames"))
        .num("training_frame_cpu_ms_p50", g("training_frame_cpu_ms_p50"))
        .num("training_frame_cpu_ms_p99", g("training_frame_cpu_ms_p99"))
        .num("training_frame_cpu_ms_max", g("training_frame_cpu_ms_max"))
        .num("training_ui_ms_p50", g("training_frame_ms_p50"))
        .num("training_ui_ms_p99", g("training_frame_ms_p99"))
        .text("display", &std::env::var("DISPLAY").unwrap_or_default());
    let md = format!(
        "## Desktop app: cold start and frame time\n\n\
`dbus-run-session -- sh -c 'scripts/sni-watcher.py & xvfb-run -a cargo run --release -p cohort-bench -- app'` (Xvfb, a stand-in StatusNotifierWatcher for the tray, Mesa llvmpipe renderer, no GPU; {launches} launches each, alternating, medians with min–max; {cache} page cache{}; tray on, shown in {tray} of {launches} launches).\n\n\
| | measured | baseline | ratio | goal |\n|---|---|---|---|---|\n\
| spawn by the parent → first frame presented | {full_ms:.0} ms ({full_min:.0}–{full_max:.0}) | {bare_ms:.0} ms ({bare_min:.0}–{bare_max:.0}) (empty eframe window, same binary) | {:.2}× | < 1000 ms |\n\
| the app's `main()` → first frame | {full_main_ms:.0} ms | | | |\n\
| frame CPU while training, p50 / p99 / max | {:.1} / {:.1} / {:.1} ms | | | ≤ 16 ms |\n\
| the app's own `ui()` while training, p50 / p99 | {:.2} / {:.2} ms | | | |\n\n\
The first frame counts everything before the window shows: loading the binary, the wgpu surface, fonts, the tray, and starting the worker (the Sandbox chain then starts behind the first frame). Frame CPU is eframe's `cpu_usage` (the app's `ui()`, tessellation and paint submission) over {} frames of the training view during the tour (`cohort app --tour`), with three members training on the same 2 cores.\n",
        if cold {
            ": emptied before every launch"
        } else {
            ": the system refused to empty it, so launches are warm"
        },
        full_ms / bare_ms,
        g("training_frame_cpu_ms_p50"),
        g("training_frame_cpu_ms_p99"),
        g("training_frame_cpu_ms_max"),
        g("training_frame_ms_p50"),
        g("training_frame_ms_p99"),
        g("training_frames"),
    );
    report::publish("app", &f, &md)
}
