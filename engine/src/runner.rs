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

/// Every member's encoded contribution for one step, not yet applied.
#[derive(Debug, Clone)]
pub struct Computed {
    pub step: u32,
    pub wire: Vec<Vec<u8>>,
    /// Mean of the members' training losses.
    pub loss: f32,
    /// Mean compute time per member.
    pub compute_secs: f64,
}

/// When a member computes step t+1 relative to applying step t.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Compute step t on the weights after step t-1, then apply it: what a
    /// cluster with an all-reduce does.
    Lockstep,
    /// Compute step t+1 on the weights step t has not yet been applied to,
    /// while step t is exchanged: what the P2P node ships (its gradients are
    /// one step stale).
    OneStepStale,
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
        let computed = self.compute(seed, epoch, step)?;
        self.apply(computed)
    }

    /// Every member's contribution for `step` (the current step, or the next
    /// one while the current one is still being exchanged), through the wire
    /// format.
    pub fn compute(
        &mut self,
        seed: &[u8; 32],
        epoch: u32,
        step: u32,
    ) -> Result<Computed, EngineError> {
        let results: Vec<Result<(Contribution, StepStats), EngineError>> =
            std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .trainers
                    .iter_mut()
                    .map(|t| s.spawn(move || t.compute_step(seed, epoch, step)))
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
        let mut out = Computed {
            step,
            wire: Vec::with_capacity(n),
            loss: 0.0,
            compute_secs: 0.0,
        };
        for r in results {
            let (c, stats) = r?;
            out.loss += stats.loss / n as f32;
            out.compute_secs += stats.compute_secs / n as f64;
            out.wire.push(c.encode(&layout));
        }
        Ok(out)
    }

    /// Every member decodes and applies the contributions of the current
    /// step; all must end with the same model hash.
    pub fn apply(&mut self, computed: Computed) -> Result<StepReport, EngineError> {
        let step = computed.step;
        let layout = self.trainers[0].layout().clone();
        let received = computed
            .wire
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
        let n = self.trainers.len();
        Ok(StepReport {
            step,
            loss: computed.loss,
            bytes_per_member: computed.wire[0].len(),
            compute_secs: computed.compute_secs,
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
    progress: impl FnMut(&StepReport),
) -> Result<RunReport, EngineError> {
    run_scheduled(cfg, Schedule::Lockstep, corpus, engines, progress)
}

/// Runs `cfg.steps` steps from the job's initial weights on `schedule`.
pub fn run_scheduled(
    cfg: &RunConfig,
    schedule: Schedule,
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
    let epoch_of = |step: u32| step / cfg.steps_per_epoch.max(1);
    let started = Instant::now();
    let mut eval_secs = 0.0;
    let mut ahead: Option<Computed> = None;
    for step in 0..cfg.steps {
        let current = match ahead.take() {
            Some(c) => c,
            None => cluster.compute(&epoch_seed(&cfg.job, epoch_of(step)), epoch_of(step), step)?,
        };
        if schedule == Schedule::OneStepStale && step + 1 < cfg.steps {
            let next = step + 1;
            ahead = Some(cluster.compute(
                &epoch_seed(&cfg.job, epoch_of(next)),
                epoch_of(next),
                next,
            )?);
        }
        let r = cluster.apply(current)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend;

    fn cfg(steps: u32) -> RunConfig {
        RunConfig {
            train: TrainConfig::small(steps),
            members: 2,
            steps,
            steps_per_epoch: 2,
            job: [3; 32],
            eval_windows: 0,
            eval_every: 0,
        }
    }

    #[test]
    fn the_stale_schedule_computes_each_step_on_the_weights_before_the_last_update() {
        let c = cfg(2);
        let corpus = Corpus::bundled().unwrap();
        let engines = || vec![backend::cpu(), backend::cpu()];
        let lock = run(&c, &corpus, engines(), |_| {}).unwrap();
        let stale = run_scheduled(&c, Schedule::OneStepStale, &corpus, engines(), |_| {}).unwrap();
        // Step 0 is computed on the initial weights either way.
        assert_eq!(lock.train_curve[0], stale.train_curve[0]);
        assert_ne!(lock.model_hash, stale.model_hash);
        // By hand: steps 0 and 1 both on the initial weights, then both applied.
        let mut by_hand = Cluster::new(
            c.train,
            c.job,
            &epoch_seed(&c.job, u32::MAX),
            &corpus,
            engines(),
        )
        .unwrap();
        let seed = epoch_seed(&c.job, 0);
        let first = by_hand.compute(&seed, 0, 0).unwrap();
        let second = by_hand.compute(&seed, 0, 1).unwrap();
        assert_eq!(second.loss, stale.train_curve[1].1);
        by_hand.apply(first).unwrap();
        by_hand.apply(second).unwrap();
        assert_eq!(by_hand.trainers[0].model_hash(), stale.model_hash);
    }
}
