//! One member's training state and the API the P2P layer and the app drive:
//! compute this step's contribution, apply the step's agreed contributions,
//! checkpoint and restore.

use crate::backend::GradientEngine;
use crate::compress::{CompressConfig, Compressor, Layout, aggregate};
use crate::data::{self, Corpus};
use crate::error::EngineError;
use crate::model::ModelConfig;
use crate::optim::{LrSchedule, adaptive_scale, sign_sgd_step};
use crate::params::ParamSet;
use crate::wire::Contribution;
use cohort_program::codec::Reader;
use std::io::Write;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    pub model: ModelConfig,
    pub compress: CompressConfig,
    pub lr: LrSchedule,
    pub weight_decay: f32,
    /// Sequences per member per step.
    pub batch: usize,
    /// Sequences per forward pass; gradients of micro-batches are averaged.
    /// Lower it to fit a smaller GPU: the result is the same update.
    pub micro_batch: usize,
    /// When > 0, the decoded direction is divided per coordinate by the root
    /// of its running second moment (decay `adaptive_beta2`), as Adam does
    /// for gradients. Computed from the shared direction only, so every node
    /// keeps the same state.
    pub adaptive_beta2: f32,
    /// The look-ahead γ of a contribution computed one step ahead (the P2P
    /// node's pipeline, `runner::Schedule::OneStepStale`): its gradient is
    /// taken at `w + γ (w − w_prev)`, the weights extrapolated by γ of the
    /// last applied update, a guess at the weights it will be applied to
    /// one step later. 0 computes on `w`. Every node holds `w_prev` (it is
    /// part of the shared state), so the guess is deterministic and an
    /// auditor recomputes it.
    pub look_ahead: f32,
}

impl TrainConfig {
    /// The job recipe (`recipe::for_job` builds every job's on it): the
    /// shared rule ([`CompressConfig::shared`]) on the tiny model.
    pub fn small(total_steps: u32) -> Self {
        Self {
            model: ModelConfig::tiny(),
            compress: CompressConfig::shared(),
            lr: LrSchedule {
                // The shared rule's best at 1,000 and 2,000 steps so far
                // (`cohort-bench convergence`; its sweep over lr {3e-4,
                // 1e-3, 3e-3} x decay {0.9, 0.95, 0.99} is still running:
                // provisional until it ends).
                base: 3e-3,
                warmup: total_steps / 20 + 1,
                total: total_steps,
                min_ratio: 0.1,
            },
            // None (recipe 4): `cohort-bench convergence`'s `sharedlook100`
            // at 2,000 steps, 3 seeds, one step stale, came to a mean final
            // loss of 1.4325 at weight decay 0 against 1.4506 at 0.1, lower
            // on every seed; the bench tries every method's tuned point at
            // both (`--wds`), AdamW's included.
            weight_decay: 0.0,
            adaptive_beta2: 0.0,
            // `cohort-bench convergence`'s `sharedlook100`: on the one-step-
            // stale schedule it beat the shared rule without it at batch 8
            // (mean final loss 1.4506 against 1.4939 over 3 seeds) and at
            // batch 32 (docs/engine.md).
            look_ahead: 1.0,
            batch: 8,
            micro_batch: 8,
        }
    }

    /// The job recipe before the shared rule (recipe version 1): each
    /// member's top-4 per chunk with their indices, decay 0.9, lr 2e-3, no
    /// look-ahead, weight decay 0.1. Kept for the top-k tests and the
    /// adversary bench's published tables.
    pub fn top_k(total_steps: u32) -> Self {
        let mut t = Self::small(total_steps);
        t.compress = CompressConfig::default();
        t.lr.base = 2e-3;
        t.look_ahead = 0.0;
        t.weight_decay = 0.1;
        t
    }
}

/// Who this trainer is within a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub job: [u8; 32],
    pub member: [u8; 32],
    /// Index among the epoch's members: selects this member's batches.
    pub index: u32,
}

pub struct Trainer {
    pub cfg: TrainConfig,
    pub id: Identity,
    layout: Layout,
    params: ParamSet,
    compressor: Compressor,
    /// Running second moment of the applied direction (see `adaptive_beta2`).
    second_moment: Vec<Vec<f32>>,
    /// The weights before the last applied update, under a look-ahead
    /// recipe (`look_ahead` > 0); None before the first update of a run, or
    /// after weights were set from outside.
    previous: Option<Vec<Vec<f32>>>,
    /// Updates applied so far; the next contribution is for this step.
    step: u32,
    engine: Box<dyn GradientEngine>,
    corpus: Corpus,
}

/// What a member computed for one step, besides the contribution itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    pub loss: f32,
    pub compute_secs: f64,
}

impl Trainer {
    /// A fresh member: weights from `init_seed`, zero momentum, step 0.
    pub fn new(
        cfg: TrainConfig,
        init_seed: &[u8; 32],
        corpus: Corpus,
        engine: Box<dyn GradientEngine>,
        id: Identity,
    ) -> Result<Self, EngineError> {
        cfg.model.validate()?;
        if cfg.batch == 0 || cfg.micro_batch == 0 || !cfg.batch.is_multiple_of(cfg.micro_batch) {
            return Err(EngineError::Config(format!(
                "batch {} must be a positive multiple of micro-batch {}",
                cfg.batch, cfg.micro_batch
            )));
        }
        let params = cfg.model.init(init_seed);
        let layout = Layout::new(&params.shapes, &cfg.compress);
        let compressor = Compressor::new(&layout, cfg.compress);
        let second_moment = params.values.iter().map(|v| vec![0.0; v.len()]).collect();
        Ok(Self {
            cfg,
            id,
            layout,
            params,
            compressor,
            second_moment,
            previous: None,
            step: 0,
            engine,
            corpus,
        })
    }

    pub fn step(&self) -> u32 {
        self.step
    }

    /// Returns the device memory pooled between steps (see
    /// [`GradientEngine::release_memory`]).
    pub fn release_device_memory(&mut self) {
        self.engine.release_memory();
    }
    pub fn params(&self) -> &ParamSet {
        &self.params
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn model_hash(&self) -> [u8; 32] {
        self.params.model_hash()
    }
    pub fn backend(&self) -> &'static str {
        self.engine.kind().name()
    }
    pub fn corpus(&self) -> &Corpus {
        &self.corpus
    }

    /// This member's momentum now: what it reveals when audited on the
    /// contribution it computes next (whose `momentum_hash` commits to it).
    pub fn momentum(&self) -> &[Vec<f32>] {
        &self.compressor.momentum
    }

    /// Forgets this member's momentum: a newcomer taking a seat starts with
    /// none, whatever the seat's last holder had.
    pub fn reset_momentum(&mut self) {
        self.compressor
            .momentum
            .iter_mut()
            .for_each(|m| m.fill(0.0));
    }

    /// What member `index` should have sent for `step`, recomputed by a
    /// witness on `weights` from the member's revealed momentum and its
    /// assigned batch (see [`crate::audit`]), and the momentum the member
    /// holds afterwards: what its next contribution must commit to (the
    /// momentum chain). The P2P node computes step t on the weights before
    /// step t-1 was applied, so its witnesses pass those (kept a few steps).
    pub fn replay_on(
        &mut self,
        weights: &ParamSet,
        seed: &[u8; 32],
        epoch: u32,
        step: u32,
        index: u32,
        momentum: &[Vec<f32>],
    ) -> Result<(crate::compress::Payload, Vec<Vec<f32>>), EngineError> {
        let (_, grads) = self.member_gradients_on(weights, seed, epoch, step, index)?;
        self.compress_from(momentum, &grads, step)
    }

    /// [`Self::member_gradients`] on `weights` instead of the current ones.
    pub fn member_gradients_on(
        &mut self,
        weights: &ParamSet,
        seed: &[u8; 32],
        epoch: u32,
        step: u32,
        index: u32,
    ) -> Result<(f32, Vec<Vec<f32>>), EngineError> {
        self.member_gradients_with(weights.clone(), seed, epoch, step, index)
    }

    fn member_gradients_with(
        &mut self,
        weights: ParamSet,
        seed: &[u8; 32],
        epoch: u32,
        step: u32,
        index: u32,
    ) -> Result<(f32, Vec<Vec<f32>>), EngineError> {
        let current = std::mem::replace(&mut self.params, weights);
        let out = self.member_gradients(seed, epoch, step, index);
        self.params = current;
        out
    }

    /// Compresses `grads` from `momentum` as a member with that momentum
    /// would for `step` (the witness side of an audit); also returns the
    /// momentum left afterwards.
    pub fn compress_from(
        &self,
        momentum: &[Vec<f32>],
        grads: &[Vec<f32>],
        step: u32,
    ) -> Result<(crate::compress::Payload, Vec<Vec<f32>>), EngineError> {
        let mut c = Compressor {
            cfg: self.cfg.compress,
            momentum: momentum.to_vec(),
        };
        let p = c.compress(&self.layout, grads, self.draw(step))?;
        Ok((p, c.momentum))
    }

    /// The momentum a member with `momentum` holds after folding `grads` in
    /// and sending `sent` ([`Compressor::fold_and_remove`]): what a chain
    /// check expects its next revealed momentum to be.
    pub fn follow_from(
        &self,
        momentum: &[Vec<f32>],
        grads: &[Vec<f32>],
        sent: &crate::compress::Payload,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut c = Compressor {
            cfg: self.cfg.compress,
            momentum: momentum.to_vec(),
        };
        c.fold_and_remove(&self.layout, grads, sent)?;
        Ok(c.momentum)
    }

    /// The shared coefficient draw of this job's `step`.
    pub fn draw(&self, step: u32) -> crate::compress::Draw {
        crate::compress::Draw::for_step(&self.id.job, step)
    }

    /// The momentum decay (β) this job compresses with.
    pub fn decay(&self) -> f32 {
        self.cfg.compress.decay
    }

    /// Loss and gradients on this member's batch for `(epoch, step)` at the
    /// current weights, averaged over micro-batches.
    pub fn gradients(
        &mut self,
        seed: &[u8; 32],
        epoch: u32,
    ) -> Result<(f32, Vec<Vec<f32>>), EngineError> {
        self.gradients_for(seed, epoch, self.step)
    }

    /// Loss and gradients on this member's batch for `step`: on the current
    /// weights, or one step ahead (the P2P node's pipeline) on
    /// [`Self::ahead_weights`]. What [`Self::compute_step`] compresses.
    pub fn gradients_for(
        &mut self,
        seed: &[u8; 32],
        epoch: u32,
        step: u32,
    ) -> Result<(f32, Vec<Vec<f32>>), EngineError> {
        let index = self.id.index;
        if step == self.step + 1 && self.look_from().is_some() {
            let ahead = self.ahead_weights();
            self.member_gradients_with(ahead, seed, epoch, step, index)
        } else {
            self.member_gradients(seed, epoch, step, index)
        }
    }

    /// The weights a contribution for the step after this state's is
    /// computed on: these weights extrapolated by `look_ahead` of the last
    /// applied update, `w + γ (w − w_prev)`, or these weights themselves when
    /// the recipe does not look ahead or no update was applied yet. A
    /// function of the shared state alone, so it is what a witness keeps to
    /// audit that step on.
    pub fn ahead_weights(&self) -> ParamSet {
        let mut w = self.params.clone();
        if let Some(prev) = self.look_from() {
            let gamma = self.cfg.look_ahead;
            for (v, v0) in w.values.iter_mut().zip(prev) {
                for (x, x0) in v.iter_mut().zip(v0) {
                    *x += gamma * (*x - x0);
                }
            }
        }
        w
    }

    /// The weights before the last update, when the recipe looks ahead.
    fn look_from(&self) -> Option<&[Vec<f32>]> {
        if self.cfg.look_ahead > 0.0 {
            self.previous.as_deref()
        } else {
            None
        }
    }

    /// Loss and gradients on member `index`'s batch for `(epoch, step)` at
    /// this trainer's weights.
    pub fn member_gradients(
        &mut self,
        seed: &[u8; 32],
        epoch: u32,
        step: u32,
        index: u32,
    ) -> Result<(f32, Vec<Vec<f32>>), EngineError> {
        let (b, mb, t) = (self.cfg.batch, self.cfg.micro_batch, self.cfg.model.seq_len);
        let train = self.corpus.train();
        let offsets = data::batch_offsets(seed, epoch, step, index, b, t, train.len());
        let mut total: Option<(f32, Vec<Vec<f32>>)> = None;
        for part in offsets.chunks(mb) {
            let (x, y) = data::windows(train, part, t);
            let (loss, grads) =
                self.engine
                    .loss_and_grads(&self.cfg.model, &self.params, &x, &y, part.len())?;
            total = Some(match total {
                None => (loss, grads),
                Some((l, mut acc)) => {
                    for (a, g) in acc.iter_mut().zip(&grads) {
                        for (ai, gi) in a.iter_mut().zip(g) {
                            *ai += gi;
                        }
                    }
                    (l + loss, acc)
                }
            });
        }
        let (loss, mut grads) = total.ok_or_else(|| EngineError::Config("empty batch".into()))?;
        let parts = (b / mb) as f32;
        if parts > 1.0 {
            grads.iter_mut().flatten().for_each(|g| *g /= parts);
        }
        Ok((loss / parts, grads))
    }

    /// This member's contribution for the current step: gradient on its
    /// assigned batch, folded into momentum, compressed.
    pub fn compute(
        &mut self,
        seed: &[u8; 32],
        epoch: u32,
    ) -> Result<(Contribution, StepStats), EngineError> {
        self.compute_step(seed, epoch, self.step)
    }

    /// The contribution for `step` computed on the current weights. The P2P
    /// layer computes step t+1 while step t is still being exchanged, so
    /// `step` may run one ahead of the updates applied so far.
    pub fn compute_step(
        &mut self,
        seed: &[u8; 32],
        epoch: u32,
        step: u32,
    ) -> Result<(Contribution, StepStats), EngineError> {
        self.compute_scaled(seed, epoch, step, 1.0)
    }

    /// [`Self::compute_step`] with the gradient multiplied by `scale` before
    /// it enters the momentum: only the `scale` adversary uses another value.
    pub fn compute_scaled(
        &mut self,
        seed: &[u8; 32],
        epoch: u32,
        step: u32,
        scale: f32,
    ) -> Result<(Contribution, StepStats), EngineError> {
        if step != self.step && step != self.step + 1 {
            return Err(EngineError::Config(format!(
                "cannot compute step {step} at step {}: at most one step ahead",
                self.step
            )));
        }
        let started = std::time::Instant::now();
        let (loss, mut grads) = self.gradients_for(seed, epoch, step)?;
        if !loss.is_finite() {
            return Err(EngineError::NonFinite("training loss".into()));
        }
        if scale != 1.0 {
            grads.iter_mut().flatten().for_each(|g| *g *= scale);
        }
        let momentum_hash = crate::audit::momentum_hash(&self.compressor.momentum);
        let draw = self.draw(step);
        let payload = self.compressor.compress(&self.layout, &grads, draw)?;
        let c = Contribution {
            job: self.id.job,
            epoch,
            step,
            member: self.id.member,
            train_loss: loss,
            momentum_hash,
            // The network node names the shared state; the trainer does
            // not know the screen's part of it.
            basis: [0; 32],
            payload,
        };
        Ok((
            c,
            StepStats {
                loss,
                compute_secs: started.elapsed().as_secs_f64(),
            },
        ))
    }

    /// Applies the step's agreed contributions (all or none): majority of
    /// signs in the DCT domain, inverse DCT, sign-SGD with weight decay.
    pub fn apply(&mut self, contributions: &[Contribution]) -> Result<(), EngineError> {
        self.apply_weighted(contributions, &vec![1; contributions.len()])
    }

    /// As [`Trainer::apply`], with an integer trust weight per contribution.
    pub fn apply_weighted(
        &mut self,
        contributions: &[Contribution],
        weights: &[i32],
    ) -> Result<(), EngineError> {
        if weights.len() != contributions.len() {
            return Err(EngineError::Shape(format!(
                "{} weights for {} contributions",
                weights.len(),
                contributions.len()
            )));
        }
        for (i, c) in contributions.iter().enumerate() {
            if c.step != self.step {
                return Err(EngineError::Malformed(format!(
                    "contribution for step {}, this node is at step {}",
                    c.step, self.step
                )));
            }
            if c.job != self.id.job {
                return Err(EngineError::Malformed(
                    "contribution for another job".into(),
                ));
            }
            if contributions[..i].iter().any(|o| o.member == c.member) {
                return Err(EngineError::Malformed(
                    "two contributions from one member".into(),
                ));
            }
            c.payload.validate(&self.layout)?;
        }
        let weighted: Vec<_> = contributions
            .iter()
            .map(|c| &c.payload)
            .zip(weights.iter().copied())
            .collect();
        let dirs = aggregate(&self.layout, &weighted, self.cfg.compress.decode);
        self.step_along(dirs);
        Ok(())
    }

    /// Applies the step from its shards' integer vote sums, as the sharded
    /// exchange delivers them (`crate::shard`): the same update, bit for
    /// bit, as [`Trainer::apply_weighted`] over the contributions those sums
    /// add up, with nobody holding every payload. Needs the shared rule.
    pub fn apply_sums(
        &mut self,
        shards: &[crate::shard::Shard],
        sums: &[Vec<i32>],
    ) -> Result<(), EngineError> {
        let dirs = crate::shard::decode(
            &self.layout,
            shards,
            sums,
            self.draw(self.step),
            self.cfg.compress.decode,
        )?;
        self.step_along(dirs);
        Ok(())
    }

    /// One optimiser step along the decoded direction `dirs`: the shared
    /// second moment if the recipe scales by it, then sign-SGD with weight
    /// decay at this step's learning rate.
    fn step_along(&mut self, mut dirs: Vec<Vec<f32>>) {
        if self.cfg.adaptive_beta2 > 0.0 {
            adaptive_scale(
                &mut dirs,
                &mut self.second_moment,
                self.cfg.adaptive_beta2,
                self.step + 1,
            );
        }
        if self.cfg.look_ahead > 0.0 {
            match &mut self.previous {
                Some(p) => p.clone_from(&self.params.values),
                None => self.previous = Some(self.params.values.clone()),
            }
        }
        let lr = self.cfg.lr.at(self.step);
        sign_sgd_step(&mut self.params.values, &dirs, lr, self.cfg.weight_decay);
        self.step += 1;
    }

    /// Mean loss over `windows` fixed validation windows.
    pub fn validation_loss(&mut self, windows: usize) -> Result<f32, EngineError> {
        let t = self.cfg.model.seq_len;
        let val = self.corpus.validation();
        let offsets = data::validation_offsets(val.len(), t, windows);
        let mut sum = 0.0;
        let chunks = offsets
            .chunks(self.cfg.micro_batch.max(1))
            .collect::<Vec<_>>();
        for part in &chunks {
            let (x, y) = data::windows(val, part, t);
            sum += self
                .engine
                .loss(&self.cfg.model, &self.params, &x, &y, part.len())?
                * part.len() as f32;
        }
        Ok(sum / offsets.len() as f32)
    }

    /// Replaces the weights (a late joiner's catch-up from a verified checkpoint).
    pub fn set_params(&mut self, params: ParamSet, step: u32) -> Result<(), EngineError> {
        if params.shapes != self.params.shapes {
            return Err(EngineError::Shape(
                "checkpoint weights do not fit this model".into(),
            ));
        }
        self.params = params;
        self.previous = None;
        self.step = step;
        Ok(())
    }

    /// The state every honest member holds identically (weights, the
    /// shared second moment, the step and, under a look-ahead recipe, the
    /// weights before the last update), encoded for a late joiner.
    /// Momentum is each member's own and is not part of it.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_with_room(0)
    }

    /// Floats per parameter a [`Trainer::snapshot`] under `cfg` holds at
    /// most: the weights, the second moment and, under a look-ahead recipe,
    /// the weights before the last update.
    pub fn floats_in_state(cfg: &TrainConfig) -> u64 {
        if cfg.look_ahead > 0.0 { 3 } else { 2 }
    }

    /// [`Trainer::snapshot`] in a buffer with `room` bytes to spare, for a
    /// caller that appends to it.
    pub fn snapshot_with_room(&self, room: usize) -> Vec<u8> {
        let previous = self.look_from();
        let tail = if self.cfg.look_ahead > 0.0 {
            1 + previous.map_or(0, |_| 4 * self.params.numel())
        } else {
            0
        };
        let mut buf =
            Vec::with_capacity(SNAPSHOT_MAGIC.len() + 36 + 8 * self.params.numel() + tail + room);
        buf.extend_from_slice(SNAPSHOT_MAGIC);
        buf.extend_from_slice(&self.id.job);
        buf.extend_from_slice(&self.step.to_le_bytes());
        let put = |buf: &mut Vec<u8>, set: &[Vec<f32>]| {
            for v in set {
                for x in v {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
            }
        };
        put(&mut buf, &self.params.values);
        put(&mut buf, &self.second_moment);
        if self.cfg.look_ahead > 0.0 {
            buf.push(previous.is_some() as u8);
            if let Some(p) = previous {
                put(&mut buf, p);
            }
        }
        buf
    }

    /// Hash of [`Trainer::snapshot`]: what a step manifest commits to.
    pub fn state_hash(&self) -> [u8; 32] {
        *blake3::hash(&self.snapshot()).as_bytes()
    }

    /// Replaces the shared state with a snapshot whose hash the caller has
    /// checked; keeps this member's momentum. Changes nothing on error.
    pub fn load_snapshot(&mut self, buf: &[u8]) -> Result<(), EngineError> {
        let numel = self.params.numel();
        let base = SNAPSHOT_MAGIC.len() + 32 + 4 + 8 * numel;
        // Under a look-ahead recipe a byte says whether the weights before
        // the last update follow.
        let with_previous = self.cfg.look_ahead > 0.0 && buf.get(base) == Some(&1);
        let want = match (self.cfg.look_ahead > 0.0, with_previous) {
            (false, _) => base,
            (true, false) => base + 1,
            (true, true) => base + 1 + 4 * numel,
        };
        if buf.len() != want || &buf[..4] != SNAPSHOT_MAGIC || (want > base && buf[base] > 1) {
            return Err(EngineError::Malformed(format!(
                "snapshot of {} bytes, this model needs {want}",
                buf.len()
            )));
        }
        if buf[4..36] != self.id.job {
            return Err(EngineError::Malformed(
                "snapshot belongs to another job".into(),
            ));
        }
        let step = u32::from_le_bytes([buf[36], buf[37], buf[38], buf[39]]);
        let mut floats = buf[40..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        let mut fill = |set: &mut Vec<Vec<f32>>| {
            for v in set.iter_mut() {
                for x in v.iter_mut() {
                    *x = floats.next().unwrap_or(0.0);
                }
            }
        };
        let (mut values, mut second) = (self.params.values.clone(), self.second_moment.clone());
        fill(&mut values);
        fill(&mut second);
        let previous = with_previous.then(|| {
            let mut p = self.params.values.clone();
            let mut at = base + 1;
            for v in p.iter_mut() {
                for x in v.iter_mut() {
                    *x = f32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
                    at += 4;
                }
            }
            p
        });
        if values
            .iter()
            .chain(previous.iter().flatten())
            .flatten()
            .any(|x| !x.is_finite())
        {
            return Err(EngineError::NonFinite("snapshot weights".into()));
        }
        self.params.values = values;
        self.second_moment = second;
        self.previous = previous;
        self.step = step;
        Ok(())
    }

    /// Weights, momentum and step, written atomically: a crash leaves the
    /// previous checkpoint intact.
    pub fn save(&self, path: &Path) -> Result<(), EngineError> {
        let mut buf = Vec::with_capacity(8 * self.params.numel() + 256);
        buf.extend_from_slice(CHECKPOINT_MAGIC);
        buf.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        let arch = self.cfg.model.arch();
        buf.extend_from_slice(&(arch.len() as u16).to_le_bytes());
        buf.extend_from_slice(arch.as_bytes());
        buf.extend_from_slice(&self.id.job);
        buf.extend_from_slice(&self.step.to_le_bytes());
        for set in [
            &self.params.values,
            &self.compressor.momentum,
            &self.second_moment,
        ] {
            buf.extend_from_slice(&(set.len() as u32).to_le_bytes());
            for v in set.iter() {
                buf.extend_from_slice(&(v.len() as u64).to_le_bytes());
                for x in v {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        let sum = blake3::hash(&buf);
        buf.extend_from_slice(sum.as_bytes());
        let err = |e: std::io::Error| EngineError::Checkpoint {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        {
            let mut f = std::fs::File::create(&tmp).map_err(err)?;
            f.write_all(&buf).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(d) = std::fs::File::open(dir)
        {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Restores weights, momentum and step. A corrupt file, another model or
    /// another job is an error and changes nothing.
    pub fn restore(&mut self, path: &Path) -> Result<(), EngineError> {
        let fail = |reason: String| EngineError::Checkpoint {
            path: path.display().to_string(),
            reason,
        };
        let buf = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        if buf.len() < CHECKPOINT_MAGIC.len() + 32 || &buf[..4] != CHECKPOINT_MAGIC {
            return Err(fail("not a Cohort checkpoint".into()));
        }
        let (body, sum) = buf.split_at(buf.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(fail(
                "checksum mismatch: the file is corrupt or truncated".into(),
            ));
        }
        let truncated = |_| fail("truncated".into());
        let mut r = Reader::new(body);
        r.bytes(4).map_err(truncated)?;
        let version = r.u32().map_err(truncated)?;
        if version != CHECKPOINT_VERSION {
            return Err(fail(format!(
                "version {version}, this build reads {CHECKPOINT_VERSION}"
            )));
        }
        let n = r.u16().map_err(truncated)? as usize;
        let arch = r
            .bytes(n)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .map_err(truncated)?;
        if arch != self.cfg.model.arch() {
            return Err(fail(format!(
                "holds `{arch}`, this job trains `{}`",
                self.cfg.model.arch()
            )));
        }
        let job = r.bytes(32).map_err(truncated)?;
        if job != self.id.job {
            return Err(fail("belongs to another job".into()));
        }
        let step = r.u32().map_err(truncated)?;
        let mut sets = Vec::new();
        for _ in 0..3 {
            let count = r.u32().map_err(truncated)? as usize;
            if count != self.params.values.len() {
                return Err(fail(format!(
                    "{count} tensors, model has {}",
                    self.params.values.len()
                )));
            }
            let mut set = Vec::with_capacity(count);
            for (i, want) in self.params.values.iter().enumerate() {
                let len = r.u64().map_err(truncated)? as usize;
                if len != want.len() {
                    return Err(fail(format!(
                        "tensor {i} has {len} values, expected {}",
                        want.len()
                    )));
                }
                let raw = r.bytes(len.saturating_mul(4)).map_err(truncated)?;
                set.push(
                    raw.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect::<Vec<f32>>(),
                );
            }
            sets.push(set);
        }
        let second_moment = sets.pop().unwrap_or_default();
        let momentum = sets.pop().unwrap_or_default();
        self.params.values = sets.pop().unwrap_or_default();
        self.compressor.momentum = momentum;
        self.second_moment = second_moment;
        // A checkpoint restarts a run at an epoch's start (mid-epoch, the
        // node loads the shared state from its peers): no update to look
        // from, as for every member starting there.
        self.previous = None;
        self.step = step;
        Ok(())
    }
}

const CHECKPOINT_MAGIC: &[u8; 4] = b"CHKP";
const SNAPSHOT_MAGIC: &[u8; 4] = b"CHSS";
const CHECKPOINT_VERSION: u32 = 1;
