//! `app`: the desktop app's cold start and frame times, in a real window
//! (run under `xvfb-run -a` on a machine without a display).
//!
//! - Cold start: process start to the first frame presented, for `cohort
//!   app` against an empty eframe window from the same binary (`--bare`),
//!   each the median of several launches. Goal < 1 s.
//! - Frame time while training: the tour (fresh wallet → Sandbox job →
//!   training → claim), with eframe's CPU time per frame while the
//!   training view is up. Goal ≤ 16 ms.

use crate::args::Args;
use crate::report::{self, Figures};
use anyhow::{Context, Result, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;

const FLAGS: &[&str] = &["launches"];

/// The `cohort` binary built with this bench's profile, next to it.
fn cohort() -> Result<PathBuf> {
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

/// One launch; retried once, since a fresh Xvfb can refuse the very first
/// connection.
fn first_frame(bin: &Path, bare: bool, data: &Path) -> Result<f64> {
    launch(bin, bare, data).or_else(|_| launch(bin, bare, data))
}

fn launch(bin: &Path, bare: bool, data: &Path) -> Result<f64> {
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
    let s = c.output()?;
    ensure!(
        s.status.success(),
        "cohort app failed: {}",
        String::from_utf8_lossy(&s.stderr)
    );
    let text = std::fs::read_to_string(&out).context("no first-frame time written")?;
    Ok(text.trim().parse()?)
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
            "the app bench needs a display: run it as `xvfb-run -a cargo run --release -p cohort-bench -- app`"
        );
    }
    let bin = cohort()?;
    let tmp = std::env::temp_dir().join(format!("cohort-app-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    // Alternate so both see the same page cache and machine load.
    let (mut bare, mut full) = (Vec::new(), Vec::new());
    for _ in 0..launches {
        bare.push(first_frame(&bin, true, &tmp)?);
        full.push(first_frame(&bin, false, &tmp)?);
    }
    let (bare_ms, full_ms) = (median(bare), median(full));
    println!("cold start to first frame (median of {launches}):");
    println!("  empty eframe window : {bare_ms:.0} ms");
    println!(
        "  cohort app          : {full_ms:.0} ms ({:.2}× the empty window; goal < 1000 ms)",
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
        .num("first_frame_ms_bare", bare_ms)
        .num("first_frame_ms_app", full_ms)
        .num("first_frame_ratio_to_bare", full_ms / bare_ms)
        .num("training_frames", g("training_frames"))
        .num("training_frame_cpu_ms_p50", g("training_frame_cpu_ms_p50"))
        .num("training_frame_cpu_ms_p99", g("training_frame_cpu_ms_p99"))
        .num("training_frame_cpu_ms_max", g("training_frame_cpu_ms_max"))
        .num("training_ui_ms_p50", g("training_frame_ms_p50"))
        .num("training_ui_ms_p99", g("training_frame_ms_p99"))
        .text("display", &std::env::var("DISPLAY").unwrap_or_default());
    let md = format!(
        "## Desktop app: cold start and frame time\n\n\
`xvfb-run -a cargo run --release -p cohort-bench -- app` (Xvfb, Mesa llvmpipe renderer, no GPU; {launches} launches each, medians).\n\n\
| | measured | baseline | ratio | goal |\n|---|---|---|---|---|\n\
| process start → first frame presented | {full_ms:.0} ms | {bare_ms:.0} ms (empty eframe window, same binary) | {:.2}× | < 1000 ms |\n\
| frame CPU while training, p50 / p99 / max | {:.1} / {:.1} / {:.1} ms | | | ≤ 16 ms |\n\
| the app's own `ui()` while training, p50 / p99 | {:.2} / {:.2} ms | | | |\n\n\
The first frame counts everything before the window shows: the wgpu surface, fonts, and starting the worker (the Sandbox chain then starts behind the first frame). Frame CPU is eframe's `cpu_usage` (the app's `ui()`, tessellation and paint submission) over {} frames of the training view during the tour (`cohort app --tour`), with three members training on the same 2 cores.\n",
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
