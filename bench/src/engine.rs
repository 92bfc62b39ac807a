//! `cohort-bench engine`: training tokens/s of one member's step in our
//! engine against the same architecture in PyTorch, same machine, batch,
//! sequence length and CPU threads, in one run. Without the reference it
//! fails and writes nothing, unless asked (`--reference none`).

use crate::args::Args;
use crate::report::{self, Figures};
use anyhow::{Context, Result};
use cohort_engine::backend::{self, BackendChoice};
use cohort_engine::compress::CompressConfig;
use cohort_engine::data::Corpus;
use cohort_engine::model::ModelConfig;
use cohort_engine::optim::LrSchedule;
use cohort_engine::trainer::{Identity, TrainConfig, Trainer};
use std::process::Command;
use std::time::Instant;

struct Torch {
    full: f64,
    grad: f64,
    version: String,
    threads: f64,
    /// `cpu`, or the GPU's name.
    device: String,
}

/// PyTorch's step on `device` (`cpu` or `cuda`), the one the engine runs on.
fn torch(
    model: &ModelConfig,
    batch: usize,
    steps: u32,
    threads: usize,
    device: &str,
) -> Result<Torch, String> {
    let script = report::repo_root().join("bench/torch_ref.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([
            "--layers",
            &model.layers.to_string(),
            "--d-model",
            &model.d_model.to_string(),
            "--heads",
            &model.heads.to_string(),
        ])
        .args([
            "--seq",
            &model.seq_len.to_string(),
            "--batch",
            &batch.to_string(),
            "--steps",
            &steps.to_string(),
            "--threads",
            &threads.to_string(),
            "--device",
            device,
        ])
        .output()
        .map_err(|e| format!("could not run python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "PyTorch reference failed ({}); install it with `pip install torch`",
            err.lines().last().unwrap_or("no output")
        ));
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| -> Option<String> {
        let at = line.find(&format!("\"{k}\": "))? + k.len() + 4;
        let rest = &line[at..];
        let end = rest.find([',', '}'])?;
        Some(rest[..end].trim().trim_matches('"').to_string())
    };
    let num = |k: &str| {
        field(k)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no {k} in PyTorch output: {line}"))
    };
    Ok(Torch {
        full: num("tokens_per_sec_full")?,
        grad: num("tokens_per_sec_grad")?,
        version: field("torch_version").unwrap_or_default(),
        threads: num("threads")?,
        device: field("device").unwrap_or_else(|| "cpu".into()),
    })
}

pub fn run(raw: &[String]) -> Result<()> {
    let args = Args::parse(
        raw,
        &[
            "arch",
            "batch",
            "steps",
            "backend",
            "threads",
            "reference",
            "repeats",
        ],
    )?;
    let want_reference = match args.get("reference", "torch".to_string())?.as_str() {
        "torch" => true,
        "none" => false,
        other => anyhow::bail!("--reference {other}: expected `torch` or `none`"),
    };
    let model = ModelConfig::parse(&args.get("arch", "gpt l4 d256 h4 s128".to_string())?)?;
    let batch: usize = args.get("batch", 8)?;
    let steps: u32 = args.get("steps", 10)?;
    let repeats: u32 = args.get("repeats", 3)?;
    anyhow::ensure!(
        steps >= 1 && repeats >= 1,
        "--steps and --repeats: at least 1"
    );
    let choice: BackendChoice = args.get("backend", BackendChoice::Auto)?;
    let threads: usize = args.get(
        "threads",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    )?;
    // The engine's CPU work runs on rayon's global pool, and its matrix
    // products on matrixmultiply's own threads (sized by MATMUL_NUM_THREADS,
    // else every physical core): give both the threads PyTorch gets, before
    // anything has started either.
    // SAFETY: no other thread exists yet; the bench reads its flags first.
    unsafe { std::env::set_var("MATMUL_NUM_THREADS", threads.to_string()) };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .context("setting the engine's thread count")?;
    let selected = backend::select(choice)?;
    println!(
        "engine: {} ({} params), batch {batch} x seq {}; backend {}",
        model.arch(),
        model.num_params(),
        model.seq_len,
        selected.reason
    );
    let backend_name = selected.engine.kind().name();
    // The reference runs where the engine does: on the GPU for cuda and wgpu.
    let torch_device = if backend_name == "cpu" { "cpu" } else { "cuda" };

    let cfg = TrainConfig {
        model,
        // The job recipe's rule (its step's compression and update).
        compress: CompressConfig::shared(),
        lr: LrSchedule {
            base: 1e-3,
            warmup: 1,
            total: 1000,
            min_ratio: 0.1,
        },
        weight_decay: TrainConfig::small(1).weight_decay,
        adaptive_beta2: 0.0,
        // It keeps the weights before each update, as a node does.
        look_ahead: TrainConfig::small(1).look_ahead,
        batch,
        micro_batch: batch,
    };
    let id = Identity {
        job: [1; 32],
        member: [2; 32],
        index: 0,
    };
    let mut t = Trainer::new(cfg, &[3; 32], Corpus::bundled()?, selected.engine, id)?;
    let seed = [4; 32];
    // Warm-up: first-use allocation, kernel compilation and autotuning.
    for _ in 0..2 {
        let (c, _) = t.compute(&seed, 0)?;
        t.apply(&[c])?;
    }
    // Repeats alternate the two engines, so a slow spell of the machine
    // lands on both; each figure is the mean with its min–max.
    let mut ours: Vec<(f64, f64)> = Vec::new();
    let mut theirs: Vec<Torch> = Vec::new();
    let why_not = "not asked for (`--reference none`)";
    let tokens = (batch * model.seq_len) as f64 * steps as f64;
    for r in 0..repeats {
        let (mut full, mut grad_only) = (0.0, 0.0);
        for _ in 0..steps {
            let t0 = Instant::now();
            t.gradients(&seed, 0)?;
            grad_only += t0.elapsed().as_secs_f64();
            let t0 = Instant::now();
            let (c, _) = t.compute(&seed, 0)?;
            t.apply(&[c])?;
            full += t0.elapsed().as_secs_f64();
        }
        ours.push((tokens / full, tokens / grad_only));
        println!(
            "repeat {}/{repeats}: Cohort {:.0} tokens/s (step), {:.0} (gradient)",
            r + 1,
            tokens / full,
            tokens / grad_only
        );
        if want_reference {
            match torch(&model, batch, steps, threads, torch_device) {
                Ok(t) => {
                    println!(
                        "repeat {}/{repeats}: PyTorch {:.0} tokens/s (step), {:.0} (gradient)",
                        r + 1,
                        t.full,
                        t.grad
                    );
                    theirs.push(t);
                }
                // A figure without its baseline is not a benchmark result:
                // keep the last published one.
                Err(why) => anyhow::bail!("PyTorch reference not measured, nothing written: {why}"),
            }
        }
    }
    let ours_full = report::spread(&ours.iter().map(|o| o.0).collect::<Vec<_>>());
    let ours_grad = report::spread(&ours.iter().map(|o| o.1).collect::<Vec<_>>());
    let reference = theirs.first().map(|r| {
        (
            report::spread(&theirs.iter().map(|t| t.full).collect::<Vec<_>>()),
            report::spread(&theirs.iter().map(|t| t.grad).collect::<Vec<_>>()),
            // Each repeat's ratio is taken within the repeat.
            report::spread(
                &ours
                    .iter()
                    .zip(&theirs)
                    .map(|(o, t)| o.0 / t.full)
                    .collect::<Vec<_>>(),
            ),
            report::spread(
                &ours
                    .iter()
                    .zip(&theirs)
                    .map(|(o, t)| o.1 / t.grad)
                    .collect::<Vec<_>>(),
            ),
            r.version.clone(),
            r.threads,
            r.device.clone(),
        )
    });

    let sp = |(mean, min, max): (f64, f64, f64), digits: usize| {
        format!("{mean:.digits$} ({min:.digits$}–{max:.digits$})")
    };
    // CPU figures are the reference record; each GPU backend gets its own
    // section, named for it and the device.
    let heading = if backend_name == "cpu" {
        "Engine speed".to_string()
    } else {
        format!("Engine speed on {}", selected.reason)
    };
    let mut md = format!(
        "## {heading}\n\n`cargo run --release -p cohort-bench -- engine` — one member's training step, {} ({} parameters), batch {batch} x seq {}, {steps} timed steps after 2 warm-up steps, backend `{backend_name}`, {threads} threads, same machine and run; {repeats} repeats, the two engines alternating, figures as mean (min–max), each repeat's ratio taken within the repeat.\n\n| | Cohort engine tokens/s | PyTorch tokens/s | Cohort ÷ PyTorch |\n|---|---|---|---|\n",
        model.arch(),
        model.num_params(),
        model.seq_len
    );
    let mut f = Figures::default();
    f.text("arch", &model.arch())
        .num("params", model.num_params() as f64)
        .num("batch", batch as f64)
        .num("seq_len", model.seq_len as f64)
        .num("steps", steps as f64)
        .num("repeats", repeats as f64)
        .num("threads", threads as f64)
        .text("backend", backend_name);
    for (key, v) in [("step", ours_full), ("grad", ours_grad)] {
        f.num(&format!("tokens_per_sec_cohort_{key}"), v.0)
            .num(&format!("tokens_per_sec_cohort_{key}_min"), v.1)
            .num(&format!("tokens_per_sec_cohort_{key}_max"), v.2);
    }
    println!("\n| | Cohort tokens/s | PyTorch tokens/s | ratio |");
    match reference {
        Some((full, grad, ratio_full, ratio_grad, version, torch_threads, device)) => {
            for (label, ours, theirs, ratio) in [
                (
                    "full step (Cohort: grad + compress + apply; PyTorch: grad + AdamW)",
                    ours_full,
                    full,
                    ratio_full,
                ),
                (
                    "gradient only (forward + backward)",
                    ours_grad,
                    grad,
                    ratio_grad,
                ),
            ] {
                let line = format!(
                    "| {label} | {} | {} | {} |",
                    sp(ours, 0),
                    sp(theirs, 0),
                    sp(ratio, 3)
                );
                println!("{line}");
                md.push_str(&line);
                md.push('\n');
            }
            let place = if device == "cpu" {
                format!("CPU with {torch_threads} threads")
            } else {
                format!("the same GPU ({device}, CUDA)")
            };
            md.push_str(&format!("\nPyTorch {version} on {place} (`bench/torch_ref.py`, `F.scaled_dot_product_attention`).\n"));
            for (key, v) in [
                ("tokens_per_sec_torch_step", full),
                ("tokens_per_sec_torch_grad", grad),
                ("ratio_step", ratio_full),
                ("ratio_grad", ratio_grad),
            ] {
                f.num(key, v.0)
                    .num(&format!("{key}_min"), v.1)
                    .num(&format!("{key}_max"), v.2);
            }
            f.text("torch_version", &version)
                .text("torch_device", &device);
        }
        None => {
            let line = format!(
                "| full step | {} | n/a | n/a |\n| gradient only | {} | n/a | n/a |\n\nPyTorch reference not measured: {why_not}.\n",
                sp(ours_full, 0),
                sp(ours_grad, 0)
            );
            println!("{line}");
            md.push_str(&line);
        }
    }
    // CPU figures are the reference record; GPU runs get their own.
    let name = if backend_name == "cpu" {
        "engine".to_string()
    } else {
        format!("engine-{backend_name}")
    };
    report::publish(&name, &f, &md).context("publishing")
}
