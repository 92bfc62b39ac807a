//! N members in one process exchanging encoded contributions in memory: the
//! reference for the P2P layer, and what tests, benchmarks and the demo use.

use crate::backend::GradientEngine;
use crate::data::Corpus;
use crate::error::EngineError;
use crate::trainer::{Identity, TrainConfig, Trainer};
use crate::wire::Contribution;
use std::time::Instant;

#[derive(Debug, Clone, Copy)]
pub struct RunConfig {
    pub train: TrainConfig,
    pub members: usize,
    pub steps: u32,
    pub steps_per_epoch: u32,
    pub job: [u8; 32],
    /// Validation windows per evaluation; 0 skips evaluation.
    pub eval_windows: usize,
    /// Evaluate every this many steps (and at the end).
    pub eval_every: u32,
}

#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub val_curve: Vec<(u32, f32)>,
    pub train_curve: Vec<(u32, f32)>,
    pub final_val_loss: f32,
    /// Encoded contribution size (header + payload), per member per step.
    pub bytes_per_member_step: usize,
    pub dense_fp32_bytes: usize,
    pub tokens_per_sec: f64,
    pub compute_secs: f64,
    pub wall_secs: f64,
    pub model_hash: [u8; 32],
}

/// Epoch seeds for runs with no chain: `blake3(job, epoch)`.
pub fn epoch_seed(job: &[u8; 32], epoch: u32) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"cohort-local-epoch-v1");
    h.update(job);
    h.update(&epoch.to_le_bytes());
    *h.finalize().as_bytes()
}

pub fn member_key(i: usize) -> [u8; 32] {
    *blake3::hash(format!("cohort-local-member-{i}").as_bytes()).as_bytes()
}

/// Runs `cfg.steps` synchronous steps; every member must end each step with
/// the same model hash, or the run fails.
pub fn run(
    cfg: &RunConfig,
    corpus: &Corpus,
    engines: Vec<Box<dyn GradientEngine>>,
    mut progress: impl FnMut(u32, f32),
) -> Result<RunReport, EngineError> {
    if engines.len() != cfg.members || cfg.members == 0 {
        return Err(EngineError::Config(format!(
            "{} engines for {} members",
            engines.len(),
            cfg.members
        )));
    }
    let init_seed = epoch_seed(&cfg.job, u32::MAX);
    let mut trainers = engines
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            Trainer::new(
                cfg.train,
                &init_seed,
                corpus.clone(),
                e,
                Identity {
                    job: cfg.job,
                    member: member_key(i),
                    index: i as u32,
                },
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut report = RunReport {
        dense_fp32_bytes: 4 * trainers[0].params().numel(),
        ..Default::default()
    };
    let started = Instant::now();
    let mut eval_secs = 0.0;
    for step in 0..cfg.steps {
        let epoch = step / cfg.steps_per_epoch.max(1);
        let seed = epoch_seed(&cfg.job, epoch);
        // Members compute in parallel, as separate machines would.
        let results: Vec<Result<(Contribution, crate::trainer::StepStats), EngineError>> =
            std::thread::scope(|s| {
                let handles: Vec<_> = trainers
                    .iter_mut()
                    .map(|t| s.spawn(move || t.compute(&seed, epoch)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(EngineError::Backend("member thread panicked".into()))
                        })
                    })
                    .collect()
            });
        let mut wire = Vec::with_capacity(cfg.members);
        let mut loss = 0.0;
        for r in results {
            let (c, stats) = r?;
            loss += stats.loss / cfg.members as f32;
            report.compute_secs += stats.compute_secs / cfg.members as f64;
            wire.push(c.encode(trainers[0].layout()));
        }
        report.bytes_per_member_step = wire[0].len();
        let received = wire
            .iter()
            .map(|b| Contribution::decode(b, trainers[0].layout()))
            .collect::<Result<Vec<_>, _>>()?;
        for t in trainers.iter_mut() {
            t.apply(&received)?;
        }
        let hash = trainers[0].model_hash();
        if let Some(i) = trainers.iter().position(|t| t.model_hash() != hash) {
            return Err(EngineError::Backend(format!(
                "member {i} diverged from member 0 at step {step}"
            )));
        }
        report.train_curve.push((step, loss));
        progress(step, loss);
        let last = step + 1 == cfg.steps;
        if cfg.eval_windows > 0
            && (last || (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0))
        {
            let t0 = Instant::now();
            let v = trainers[0].validation_loss(cfg.eval_windows)?;
            eval_secs += t0.elapsed().as_secs_f64();
            report.val_curve.push((step + 1, v));
            report.final_val_loss = v;
        }
    }
    report.wall_secs = started.elapsed().as_secs_f64() - eval_secs;
    let tokens = cfg.steps as f64
        * cfg.members as f64
        * cfg.train.batch as f64
        * cfg.train.model.seq_len as f64;
    report.tokens_per_sec = tokens / report.wall_secs.max(1e-9);
    report.model_hash = trainers[0].model_hash();
    Ok(report)
}
