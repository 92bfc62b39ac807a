//! N members in one process exchanging encoded contributions in memory: the
//! reference for the P2P layer, and what tests, benchmarks and the demo use.

use crate::backend::GradientEngine;
use crate::data::Corpus;
use crate::error::EngineError;
use crate::trainer::{Identity, StepStats, TrainConfig, Trainer};
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

/// What one synchronous step produced.
#[derive(Debug, Clone)]
pub struct StepReport {
    pub step: u32,
    /// Mean of the members' training losses.
    pub loss: f32,
    pub bytes_per_member: usize,
    /// Mean compute time per member.
    pub compute_secs: f64,
    pub model_hash: [u8; 32],
    /// Members (by index) whose contribution was applied.
    pub applied: Vec<usize>,
}

/// Members training one model in one process.
pub struct Cluster {
    pub trainers: Vec<Trainer>,
}

impl Cluster {
    /// `members` trainers with identities `member_key(i)`, all starting from
    /// the weights `init_seed` gives.
    pub fn new(
        train: TrainConfig,
        job: [u8; 32],
        init_seed: &[u8; 32],
        corpus: &Corpus,
        engines: Vec<Box<dyn GradientEngine>>,
    ) -> Result<Self, EngineError> {
        let trainers = engines
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                Trainer::new(
                    train,
                    init_seed,
                    corpus.clone(),
                    e,
                    Identity {
                        job,
                        member: member_key(i),
                        index: i as u32,
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        if trainers.is_empty() {
            return Err(EngineError::Config(
                "a cluster needs at least one member".into(),
            ));
        }
        Ok(Self { trainers })
    }

    /// One step: every member computes in parallel (as separate machines
    /// would), contributions go through the wire format, every member applies
    /// all of them, and all must end with the same model hash.
    pub fn step(&mut self, seed: &[u8; 32], epoch: u32) -> Result<StepReport, EngineError> {
        let step = self.trainers[0].step();
        let results: Vec<Result<(Contribution, StepStats), EngineError>> =
            std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .trainers
                    .iter_mut()
                    .map(|t| s.spawn(move || t.compute(seed, epoch)))
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
        let n = self.trainers.len();
        let layout = self.trainers[0].layout().clone();
        let (mut wire, mut loss, mut compute_secs) = (Vec::with_capacity(n), 0.0, 0.0);
        for r in results {
            let (c, stats) = r?;
            loss += stats.loss / n as f32;
            compute_secs += stats.compute_secs / n as f64;
            wire.push(c.encode(&layout));
        }
        let received = wire
            .iter()
            .map(|b| Contribution::decode(b, &layout))
            .collect::<Result<Vec<_>, _>>()?;
        for t in self.trainers.iter_mut() {
            t.apply(&received)?;
        }
        let model_hash = self.trainers[0].model_hash();
        if let Some(i) = self
            .trainers
            .iter()
            .position(|t| t.model_hash() != model_hash)
        {
            return Err(EngineError::Backend(format!(
                "member {i} diverged from member 0 at step {step}"
            )));
        }
        Ok(StepReport {
            step,
            loss,
            bytes_per_member: wire[0].len(),
            compute_secs,
            model_hash,
            applied: (0..n).collect(),
        })
    }

    pub fn validation_loss(&mut self, windows: usize) -> Result<f32, EngineError> {
        self.trainers[0].validation_loss(windows)
    }
}

/// Runs `cfg.steps` synchronous steps from the job's initial weights.
pub fn run(
    cfg: &RunConfig,
    corpus: &Corpus,
    engines: Vec<Box<dyn GradientEngine>>,
    mut progress: impl FnMut(&StepReport),
) -> Result<RunReport, EngineError> {
    if engines.len() != cfg.members {
        return Err(EngineError::Config(format!(
            "{} engines for {} members",
            engines.len(),
            cfg.members
        )));
    }
    let mut cluster = Cluster::new(
        cfg.train,
        cfg.job,
        &epoch_seed(&cfg.job, u32::MAX),
        corpus,
        engines,
    )?;
    let mut report = RunReport {
        dense_fp32_bytes: 4 * cluster.trainers[0].params().numel(),
        ..Default::default()
    };
    let started = Instant::now();
    let mut eval_secs = 0.0;
    for step in 0..cfg.steps {
        let epoch = step / cfg.steps_per_epoch.max(1);
        let r = cluster.step(&epoch_seed(&cfg.job, epoch), epoch)?;
        report.bytes_per_member_step = r.bytes_per_member;
        report.compute_secs += r.compute_secs;
        report.train_curve.push((step, r.loss));
        progress(&r);
        let last = step + 1 == cfg.steps;
        if cfg.eval_windows > 0
            && (last || (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0))
        {
            let t0 = Instant::now();
            let v = cluster.validation_loss(cfg.eval_windows)?;
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
    report.model_hash = cluster.trainers[0].model_hash();
    Ok(report)
}
