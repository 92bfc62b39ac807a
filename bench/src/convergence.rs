//! `cohort-bench convergence`: the same model on the same tokens with the same
//! members, trained three ways in one run: (a) dense data-parallel AdamW, the
//! baseline; (b) dense data-parallel sign-SGD with momentum; (c) Cohort's
//! compressed updates.

use crate::args::Args;
use crate::report::{self, Figures, fmt_bytes};
use anyhow::Result;
use cohort_engine::backend;
use cohort_engine::compress::{CompressConfig, Decode};
use cohort_engine::data::Corpus;
use cohort_engine::model::ModelConfig;
use cohort_engine::optim::{AdamW, LrSchedule, sign_sgd_step};
use cohort_engine::runner::{self, RunConfig};
use cohort_engine::trainer::{Identity, TrainConfig, Trainer};
use std::time::Instant;

struct Row {
    name: &'static str,
    val_loss: f32,
    bytes: f64,
    tokens_per_sec: f64,
    curve: Vec<(u32, f32)>,
}

enum Dense {
    AdamW,
    SignSgd,
}

fn dense(kind: Dense, cfg: &RunConfig, lr: LrSchedule, corpus: &Corpus) -> Result<Row> {
    let init_seed = runner::epoch_seed(&cfg.job, u32::MAX);
    let mut members = (0..cfg.members)
        .map(|i| {
            Trainer::new(
                cfg.train,
                &init_seed,
                corpus.clone(),
                backend::cpu(),
                Identity {
                    job: cfg.job,
                    member: runner::member_key(i),
                    index: i as u32,
                },
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut params = members[0].params().clone();
    let sizes: Vec<usize> = params.values.iter().map(Vec::len).collect();
    let mut adam = AdamW::new(&sizes, cfg.train.weight_decay);
    let mut momentum: Vec<Vec<f32>> = sizes.iter().map(|n| vec![0.0; *n]).collect();
    let mut curve = Vec::new();
    let started = Instant::now();
    let mut eval_secs = 0.0;
    let mut val_loss = f32::NAN;
    for step in 0..cfg.steps {
        let epoch = step / cfg.steps_per_epoch;
        let seed = runner::epoch_seed(&cfg.job, epoch);
        let grads: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = members
                .iter_mut()
                .map(|m| s.spawn(move || m.gradients(&seed, epoch)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("member thread"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        // All-reduce: mean of the members' gradients, summed in member order.
        let mut avg: Vec<Vec<f32>> = sizes.iter().map(|n| vec![0.0; *n]).collect();
        for (_, g) in &grads {
            for (a, gi) in avg.iter_mut().zip(g) {
                for (x, y) in a.iter_mut().zip(gi) {
                    *x += y;
                }
            }
        }
        let inv = 1.0 / cfg.members as f32;
        avg.iter_mut().flatten().for_each(|x| *x *= inv);
        match kind {
            Dense::AdamW => adam.step(&mut params.values, &avg, lr.at(step)),
            Dense::SignSgd => {
                for (m, g) in momentum.iter_mut().zip(&avg) {
                    for (mi, gi) in m.iter_mut().zip(g) {
                        *mi = cfg.train.compress.decay * *mi + gi;
                    }
                }
                let dirs: Vec<Vec<f32>> = momentum
                    .iter()
                    .map(|m| {
                        m.iter()
                            .map(|v| v.signum() * (*v != 0.0) as u8 as f32)
                            .collect()
                    })
                    .collect();
                sign_sgd_step(
                    &mut params.values,
                    &dirs,
                    lr.at(step),
                    cfg.train.weight_decay,
                );
            }
        }
        for m in members.iter_mut() {
            m.set_params(params.clone(), step + 1)?;
        }
        if (step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps {
            let t0 = Instant::now();
            val_loss = members[0].validation_loss(cfg.eval_windows)?;
            eval_secs += t0.elapsed().as_secs_f64();
            curve.push((step + 1, val_loss));
        }
    }
    let wall = started.elapsed().as_secs_f64() - eval_secs;
    let tokens = cfg.steps as f64
        * cfg.members as f64
        * cfg.train.batch as f64
        * cfg.train.model.seq_len as f64;
    let name = match kind {
        Dense::AdamW => "(a) dense AdamW",
        Dense::SignSgd => "(b) dense sign-SGD",
    };
    Ok(Row {
        name,
        val_loss,
        bytes: 4.0 * params.numel() as f64,
        tokens_per_sec: tokens / wall,
        curve,
    })
}

fn cohort(cfg: &RunConfig, corpus: &Corpus) -> Result<Row> {
    let engines = (0..cfg.members).map(|_| backend::cpu()).collect();
    let r = runner::run(cfg, corpus, engines, |_| {})?;
    Ok(Row {
        name: "(c) Cohort compressed",
        val_loss: r.final_val_loss,
        bytes: r.bytes_per_member_step as f64,
        tokens_per_sec: r.tokens_per_sec,
        curve: r.val_curve,
    })
}

pub fn run(raw: &[String]) -> Result<()> {
    let args = Args::parse(
        raw,
        &[
            "steps",
            "members",
            "arch",
            "batch",
            "topk",
            "lr-adamw",
            "lr-sign",
            "lr-cohort",
            "eval-windows",
            "decay",
            "methods",
            "decode",
            "adaptive",
        ],
    )?;
    let methods: String = args.get("methods", "abc".to_string())?;
    let decay: f32 = args.get("decay", CompressConfig::default().decay)?;
    let steps: u32 = args.get("steps", 300)?;
    let members: usize = args.get("members", 4)?;
    let model = ModelConfig::parse(&args.get("arch", "gpt l2 d128 h4 s64".to_string())?)?;
    let topk: usize = args.get("topk", 4)?;
    let lr = |base: f32| LrSchedule {
        base,
        warmup: steps / 20 + 1,
        total: steps,
        min_ratio: 0.1,
    };
    let (lr_adamw, lr_sign, lr_cohort) = (
        lr(args.get("lr-adamw", 3e-3)?),
        lr(args.get("lr-sign", 1e-3)?),
        lr(args.get("lr-cohort", 1e-3)?),
    );
    let train = TrainConfig {
        model,
        compress: CompressConfig {
            topk,
            decay,
            decode: match args.get("decode", "sign".to_string())?.as_str() {
                "rms" => Decode::Rms,
                "sign" => Decode::Sign,
                other => anyhow::bail!("--decode {other}: expected rms or sign"),
            },
            ..CompressConfig::default()
        },
        lr: lr_cohort,
        weight_decay: 0.1,
        adaptive_beta2: args.get("adaptive", 0.0)?,
        batch: args.get("batch", 8)?,
        micro_batch: args.get("batch", 8)?,
    };
    let cfg = RunConfig {
        train,
        members,
        steps,
        steps_per_epoch: 50,
        job: [7; 32],
        eval_windows: args.get("eval-windows", 64)?,
        eval_every: (steps / 6).max(1),
    };
    let corpus = Corpus::bundled()?;
    println!(
        "convergence: {} ({} params), {members} members x batch {} x seq {}, {steps} steps, bundled corpus",
        model.arch(),
        model.num_params(),
        train.batch,
        model.seq_len
    );

    let run_method = |m: char| -> Result<Row> {
        println!("running {m} ...");
        match m {
            'a' => dense(Dense::AdamW, &cfg, lr_adamw, &corpus),
            'b' => {
                let sign_cfg = RunConfig {
                    train: TrainConfig {
                        lr: lr_sign,
                        ..train
                    },
                    ..cfg
                };
                dense(Dense::SignSgd, &sign_cfg, lr_sign, &corpus)
            }
            'c' => cohort(&cfg, &corpus),
            other => anyhow::bail!("unknown method `{other}` in --methods (a, b, c)"),
        }
    };
    if methods != "abc" {
        // Tuning runs: print, publish nothing.
        for m in methods.chars() {
            let row = run_method(m)?;
            println!(
                "{}: val loss {:.4}, {:.0} B/member/step, curve {:?}",
                row.name, row.val_loss, row.bytes, row.curve
            );
        }
        return Ok(());
    }
    let rows = "abc".chars().map(run_method).collect::<Result<Vec<_>>>()?;
    let base = rows[0].val_loss;
    let dense_bytes = rows[0].bytes;
    let mut md = format!(
        "## Convergence\n\n`cargo run --release -p cohort-bench -- convergence` — {} ({} parameters), {members} members, batch {} x {} bytes per member per step, {steps} steps, bundled KJV corpus (validation: {} fixed held-out windows). Learning rates (peak, warmup then cosine to 10%): AdamW {}, sign-SGD {}, Cohort {}; weight decay 0.1; Cohort: 64x64 DCT chunks, top-{topk} per chunk, momentum decay {}, decoder `{:?}`, adaptive β2 {}.\n\n| method | final val loss | ratio to (a) | bytes sent / member / step | compression vs fp32 | tokens/s |\n|---|---|---|---|---|---|\n",
        model.arch(),
        model.num_params(),
        train.batch,
        model.seq_len,
        cfg.eval_windows,
        lr_adamw.base,
        lr_sign.base,
        lr_cohort.base,
        train.compress.decay,
        train.compress.decode,
        train.adaptive_beta2
    );
    println!(
        "\n| method | final val loss | ratio to (a) | bytes/member/step | compression vs fp32 | tokens/s |"
    );
    for r in &rows {
        let line = format!(
            "| {} | {:.4} | {:.3} | {} | {:.0}x | {:.0} |",
            r.name,
            r.val_loss,
            r.val_loss / base,
            fmt_bytes(r.bytes),
            dense_bytes / r.bytes,
            r.tokens_per_sec
        );
        println!("{line}");
        md.push_str(&line);
        md.push('\n');
    }
    let c = &rows[2];
    let ratio = dense_bytes / c.bytes;
    let goal_loss = c.val_loss <= 1.05 * base;
    let _ = writeln_md(
        &mut md,
        &format!(
            "\nGoals: compression ≥ 1000x — reached {ratio:.0}x ({}); Cohort loss ≤ 1.05 × AdamW — reached {:.3} ({}).\n\nValidation loss during training (step: a / b / c): {}",
            if ratio >= 1000.0 { "met" } else { "not met" },
            c.val_loss / base,
            if goal_loss { "met" } else { "not met" },
            rows[0]
                .curve
                .iter()
                .zip(&rows[1].curve)
                .zip(&rows[2].curve)
                .map(|((a, b), c)| format!("{}: {:.3} / {:.3} / {:.3}", a.0, a.1, b.1, c.1))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    );
    println!(
        "{}",
        md.lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );

    let mut f = Figures::default();
    f.text("arch", &model.arch())
        .num("params", model.num_params() as f64)
        .num("members", members as f64)
        .num("batch", train.batch as f64)
        .num("seq_len", model.seq_len as f64)
        .num("steps", steps as f64)
        .num("topk", topk as f64)
        .num("momentum_decay", train.compress.decay as f64)
        .text(
            "decode",
            &format!("{:?}", train.compress.decode).to_lowercase(),
        )
        .num("adaptive_beta2", train.adaptive_beta2 as f64)
        .num("lr_adamw", lr_adamw.base as f64)
        .num("lr_sign", lr_sign.base as f64)
        .num("lr_cohort", lr_cohort.base as f64)
        .num("val_loss_adamw", rows[0].val_loss as f64)
        .num("val_loss_sign_sgd", rows[1].val_loss as f64)
        .num("val_loss_cohort", rows[2].val_loss as f64)
        .num("loss_ratio_sign_sgd", (rows[1].val_loss / base) as f64)
        .num("loss_ratio_cohort", (rows[2].val_loss / base) as f64)
        .num("bytes_per_member_step_dense", dense_bytes)
        .num("bytes_per_member_step_cohort", c.bytes)
        .num("compression_ratio", ratio)
        .num("tokens_per_sec_adamw", rows[0].tokens_per_sec)
        .num("tokens_per_sec_sign_sgd", rows[1].tokens_per_sec)
        .num("tokens_per_sec_cohort", c.tokens_per_sec);
    report::publish("convergence", &f, &md)
}

fn writeln_md(md: &mut String, s: &str) -> std::fmt::Result {
    use std::fmt::Write;
    writeln!(md, "{s}")
}
