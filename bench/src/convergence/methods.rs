//! The three ways the convergence bench trains the same model on the same
//! tokens: dense AdamW, dense sign-SGD with momentum, and Cohort's compressed
//! updates, each at one grid point, one seed and one schedule; plus candidate
//! update rules measured before any of them reaches the engine.

use anyhow::Result;
use cohort_engine::backend;
use cohort_engine::compress::{
    CompressConfig, Compressor, Decode, Draw, Layout, Payload, Select, aggregate,
};
use cohort_engine::data::Corpus;
use cohort_engine::model::ModelConfig;
use cohort_engine::optim::{AdamW, LrSchedule, sign_sgd_step};
use cohort_engine::runner::{self, RunConfig, Schedule};
use cohort_engine::trainer::{Identity, TrainConfig, Trainer};
use cohort_engine::wire;
use std::time::Instant;

use super::codebook::Book;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    AdamW,
    SignSgd,
    Cohort,
    /// The engine's shared rule ([`Select::Shared`]): every member votes the
    /// signs of the same `shared_k` DCT coefficients per chunk, drawn from
    /// the job and step, so positions cost no bytes (1 bit per coefficient)
    /// and all members vote on each one. (Its bench-only prototype was
    /// logged as `sharedk`.)
    Shared,
    /// Cohort's payloads, but the summed votes are cut to the `K` largest
    /// per chunk before decoding, as a sharded exchange's aggregators would
    /// publish them (issue 18, item 3). `K` = 0 keeps every vote: Cohort's
    /// rule, through this bench's own loop.
    TopAgg(u16),
    /// The shared rule through this bench's own loop, with each
    /// coefficient's summed votes cut to their sign before decoding when
    /// `sign`: what a sharded exchange's aggregators publish as 2-bit sign
    /// sums instead of exact integer counts (`cohort-bench simulate`'s
    /// "sign" rows). With `sign` false it is the engine's shared rule, bit
    /// for bit (a test holds it to that).
    SharedAgg {
        sign: bool,
    },
    /// The shared rule through this bench's own loop, on the stale schedule
    /// with each member's gradient computed on weights extrapolated by the
    /// last applied update, `P`/100 of it: `w + P/100 · (w − w_prev)`, a guess
    /// at the weights the gradient will be applied to one step later. Every
    /// node knows both states, so the guess is deterministic and auditable.
    /// On the lock-step schedule it is the shared rule (nothing is stale).
    SharedLook(u8),
    /// A bench-only prototype, DiLoCo-style: each member takes `H` local
    /// AdamW steps (β1 0.9, no weight decay) from the shared weights on its
    /// own batches, then sends the shared rule's signs of its pseudo-gradient
    /// (shared weights minus its own) with `H` × `shared_k` drawn positions
    /// per chunk, so the bytes per step equal the shared rule's; every node
    /// applies one sign step of `H` × lr ÷ 3 (the ratio of the shared rule's
    /// best learning rate to lock-step AdamW's, 3e-3 to 9e-3) with the
    /// rule's weight decay. The grid's learning rate is the inner AdamW's;
    /// its momentum is the error-feedback decay, per exchange. Lock-step
    /// only: every member's inner steps start from the weights the last
    /// exchange left.
    Local(u8),
    /// A bench-only prototype: the shared rule's decoded signs (every
    /// node holds the same) are smoothed by an outer momentum of decay
    /// `B`/100 kept by every node, and each step moves by the sign of
    /// that momentum: signSGD with momentum on the shared direction, on
    /// top of the members' error feedback. Deterministic from the
    /// decoded votes alone, so every node would keep the same state.
    Outer(u8),
    /// A bench-only prototype ([`codebook`]): per large chunk, the best of
    /// 2^B shared random sparse codewords in the DCT domain, greedily in as
    /// many groups as fit the shared rule's bits; look-ahead `look`% on the
    /// stale schedule, as [`Method::SharedLook`].
    Vq {
        book: Book,
        look: u8,
    },
}

impl Method {
    /// The method that runs the job recipe's rule ([`TrainConfig::small`]):
    /// the shared rule, with its look-ahead if the recipe has one.
    pub fn recipe() -> Method {
        let look = TrainConfig::small(1).look_ahead;
        if look > 0.0 {
            Method::SharedLook((look * 100.0).round() as u8)
        } else {
            Method::Shared
        }
    }

    /// The look-ahead this method computes its stale gradients with, in %
    /// of the last update; None when it computes them on the weights as
    /// they are.
    pub fn look(self) -> Option<u8> {
        match self {
            Method::SharedLook(p) => Some(p),
            Method::Vq { look, .. } if look > 0 => Some(look),
            _ => None,
        }
    }

    /// A look-ahead of the shared rule: run at the shared rule's best point.
    pub fn looks_ahead(self) -> bool {
        matches!(self, Method::SharedLook(_))
    }

    pub const ALL: [Method; 4] = [
        Method::AdamW,
        Method::SignSgd,
        Method::Cohort,
        Method::Shared,
    ];

    pub fn key(self) -> String {
        match self {
            Method::AdamW => "adamw".into(),
            Method::SignSgd => "sign".into(),
            Method::Cohort => "cohort".into(),
            Method::Shared => "shared".into(),
            Method::TopAgg(k) => format!("topagg{k}"),
            Method::SharedAgg { sign: false } => "sharedagg".into(),
            Method::SharedAgg { sign: true } => "signagg".into(),
            Method::SharedLook(p) => format!("sharedlook{p}"),
            Method::Local(h) => format!("local{h}"),
            Method::Outer(b) => format!("outer{b}"),
            Method::Vq { book, look } => format!(
                "vq{}x{}{}",
                book.bits,
                book.spread,
                if look > 0 {
                    format!("look{look}")
                } else {
                    String::new()
                }
            ),
        }
    }

    pub fn label(self) -> String {
        match self {
            Method::AdamW => "dense AdamW".into(),
            Method::SignSgd => "dense sign-SGD".into(),
            Method::Cohort => "Cohort top-k signs".into(),
            Method::Shared => "Cohort shared random-k signs".into(),
            Method::TopAgg(_) => "Cohort, votes cut to the top K per chunk".into(),
            Method::SharedAgg { sign: false } => {
                "Cohort shared signs, through the bench's loop".into()
            }
            Method::SharedAgg { sign: true } => {
                "Cohort shared signs, summed votes cut to their sign".into()
            }
            Method::SharedLook(p) => format!(
                "Cohort shared signs + look-ahead {} ({}at the shared rule's best point)",
                p as f32 / 100.0,
                if self == Method::recipe() {
                    "the job recipe; "
                } else {
                    ""
                }
            ),
            Method::Local(h) => format!(
                "local AdamW, {h} steps, then shared signs of the pseudo-gradient (prototype)"
            ),
            Method::Outer(b) => format!(
                "Cohort shared signs + outer momentum {} on the decoded signs (prototype)",
                b as f32 / 100.0
            ),
            Method::Vq { book, look } if book.bits == 0 => format!(
                "Cohort, signs of shared random projections on {} positions{} (prototype)",
                book.spread,
                if look > 0 {
                    format!(", look-ahead {}", look as f32 / 100.0)
                } else {
                    String::new()
                }
            ),
            Method::Vq { book, look } => format!(
                "Cohort, best of 2^{} shared codewords of {} positions per group{} (prototype)",
                book.bits,
                book.spread,
                if look > 0 {
                    format!(", look-ahead {}", look as f32 / 100.0)
                } else {
                    String::new()
                }
            ),
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        if let Some(k) = s.strip_prefix("topagg") {
            let k = k
                .parse::<u16>()
                .map_err(|_| anyhow::anyhow!("method `{s}`: expected topagg<K>, K a count"))?;
            return Ok(Method::TopAgg(k));
        }
        if let Some(p) = s.strip_prefix("sharedlook") {
            let p = p.parse::<u8>().ok().filter(|p| *p > 0).ok_or_else(|| {
                anyhow::anyhow!("method `{s}`: expected sharedlook<P>, P a percentage 1 to 255")
            })?;
            return Ok(Method::SharedLook(p));
        }
        if let Some(h) = s.strip_prefix("local") {
            let h = h.parse::<u8>().ok().filter(|h| *h > 0).ok_or_else(|| {
                anyhow::anyhow!("method `{s}`: expected local<H>, H local steps 1 to 255")
            })?;
            return Ok(Method::Local(h));
        }
        if let Some(b) = s.strip_prefix("outer") {
            let b = b
                .parse::<u8>()
                .ok()
                .filter(|b| *b > 0 && *b < 100)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "method `{s}`: expected outer<B>, B the outer decay in % (1 to 99)"
                    )
                })?;
            return Ok(Method::Outer(b));
        }
        if let Some(rest) = s.strip_prefix("vq") {
            let (body, look) = match rest.split_once("look") {
                Some((b, l)) => (b, l.parse::<u8>().ok().filter(|l| *l > 0)),
                None => (rest, Some(0)),
            };
            let parsed = body
                .split_once('x')
                .and_then(|(b, x)| Some((b.parse::<u8>().ok()?, x.parse::<u8>().ok()?)));
            return match (parsed, look) {
                (Some((bits @ 0..=20, spread @ 1..)), Some(look)) => Ok(Method::Vq {
                    book: Book { bits, spread },
                    look,
                }),
                _ => Err(anyhow::anyhow!(
                    "method `{s}`: expected vq<B>x<S>[look<P>], B index bits 0 to 20, S positions per codeword"
                )),
            };
        }
        for sign in [false, true] {
            if s == (Method::SharedAgg { sign }).key() {
                return Ok(Method::SharedAgg { sign });
            }
        }
        Method::ALL
            .into_iter()
            .find(|m| m.key() == s)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown method `{s}`: expected adamw, sign, cohort, shared, topagg<K>, sharedagg, signagg, sharedlook<P>, local<H>, outer<B> or vq<B>x<S>[look<P>]"
                )
            })
    }
}

pub fn schedule_key(s: Schedule) -> &'static str {
    match s {
        Schedule::Lockstep => "lockstep",
        Schedule::OneStepStale => "stale",
    }
}

/// Everything that is the same for every run of one sweep.
#[derive(Debug, Clone)]
pub struct Setting {
    pub model: ModelConfig,
    pub members: usize,
    pub batch: usize,
    pub steps: u32,
    pub topk: usize,
    /// Coefficients per chunk of the shared rule.
    pub shared_k: usize,
    pub decode: Decode,
    pub adaptive_beta2: f32,
    /// The decoupled weight decay of the grid and its climbs (`--wd`); a
    /// method's tuned point may take another (`Point::wd`).
    pub weight_decay: f32,
    /// Where the cosine ends, as a share of the peak learning rate.
    pub min_lr: f32,
    pub eval_windows: usize,
    pub eval_every: u32,
}

/// One run: a method at a grid point, a seed and a schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub method: Method,
    pub lr: f32,
    /// AdamW's β1; the momentum decay of sign-SGD and of Cohort's members.
    pub momentum: f32,
    /// The decoupled weight decay.
    pub wd: f32,
    pub seed: u32,
    pub schedule: Schedule,
}

pub struct Outcome {
    pub final_val_loss: f32,
    pub curve: Vec<(u32, f32)>,
    pub bytes_per_member_step: f64,
    pub tokens_per_sec: f64,
}

impl Setting {
    fn lr(&self, base: f32) -> LrSchedule {
        LrSchedule {
            base,
            warmup: self.steps / 20 + 1,
            total: self.steps,
            min_ratio: self.min_lr,
        }
    }

    /// Coefficients per chunk `method` sends.
    pub fn k(&self, method: Method) -> usize {
        match method {
            Method::Shared
            | Method::SharedAgg { .. }
            | Method::SharedLook(_)
            | Method::Outer(_)
            | Method::Vq { .. } => self.shared_k,
            Method::Local(h) => self.shared_k * h as usize,
            _ => self.topk,
        }
    }

    fn run_config(&self, p: &Point) -> RunConfig {
        RunConfig {
            train: TrainConfig {
                model: self.model,
                compress: CompressConfig {
                    topk: self.k(p.method),
                    decay: p.momentum,
                    decode: self.decode,
                    select: p.method.select().unwrap_or(Select::TopK),
                    ..CompressConfig::default()
                },
                lr: self.lr(p.lr),
                weight_decay: p.wd,
                adaptive_beta2: self.adaptive_beta2,
                // `shared` is the shared rule without the look-ahead, as
                // logged; `sharedlook<P>` runs the look-ahead in this
                // bench's loop, which a test holds to the engine's.
                look_ahead: 0.0,
                batch: self.batch,
                micro_batch: self.batch,
            },
            members: self.members,
            steps: self.steps,
            steps_per_epoch: 50,
            job: seed_job(p.seed),
            eval_windows: self.eval_windows,
            eval_every: self.eval_every,
        }
    }

    pub fn tokens(&self) -> f64 {
        self.steps as f64 * self.members as f64 * self.batch as f64 * self.model.seq_len as f64
    }

    pub fn run(&self, p: &Point, corpus: &Corpus) -> Result<Outcome> {
        let cfg = self.run_config(p);
        match p.method {
            Method::Cohort | Method::Shared => {
                let engines = (0..cfg.members).map(|_| backend::cpu()).collect();
                let r = runner::run_scheduled(&cfg, p.schedule, corpus, engines, |_| {})?;
                Ok(Outcome {
                    final_val_loss: r.final_val_loss,
                    curve: r.val_curve,
                    bytes_per_member_step: r.bytes_per_member_step as f64,
                    tokens_per_sec: r.tokens_per_sec,
                })
            }
            Method::AdamW
            | Method::SignSgd
            | Method::TopAgg(_)
            | Method::SharedAgg { .. }
            | Method::SharedLook(_)
            | Method::Outer(_)
            | Method::Vq { .. } => dense(p, &cfg, corpus),
            Method::Local(h) => local(p, &cfg, corpus, h as u32),
        }
    }
}

/// Bytes of one encoded contribution (header and payload, as the runner
/// counts them) for `model` under today's wire format: the figure the
/// tables print for the engine's rules, so runs logged under an earlier
/// wire version (v3 had no rule byte and an 8-bit k) show today's size.
pub fn wire_bytes(model: &ModelConfig, select: Select, k: usize) -> f64 {
    let shapes: Vec<Vec<usize>> = model.shapes().into_iter().map(|(_, s)| s).collect();
    let layout = Layout::new(
        &shapes,
        &CompressConfig {
            topk: k,
            select,
            ..CompressConfig::default()
        },
    );
    (wire::HEADER_LEN + wire::payload_len(&layout)) as f64
}

impl Method {
    /// The engine rule this method runs, if it runs one through the wire
    /// (the look-ahead is the job recipe's, whose contributions the wire
    /// carries as the shared rule's).
    pub fn select(self) -> Option<Select> {
        match self {
            Method::Cohort => Some(Select::TopK),
            Method::Shared | Method::SharedLook(_) => Some(Select::Shared),
            _ => None,
        }
    }
}

/// A run's job key: it seeds the initial weights and every epoch's batches.
pub fn seed_job(seed: u32) -> [u8; 32] {
    *blake3::hash(format!("cohort-convergence-seed-{seed}").as_bytes()).as_bytes()
}

/// One trainer per member, every one on the run's initial weights.
fn trainers(cfg: &RunConfig, corpus: &Corpus) -> Result<Vec<Trainer>> {
    let init_seed = runner::epoch_seed(&cfg.job, u32::MAX);
    Ok((0..cfg.members)
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
        .collect::<Result<Vec<_>, _>>()?)
}

/// Dense data-parallel training: every member's full gradient, averaged in
/// member order (an all-reduce), then AdamW or sign-SGD with momentum.
fn dense(p: &Point, cfg: &RunConfig, corpus: &Corpus) -> Result<Outcome> {
    let mut members = trainers(cfg, corpus)?;
    let mut params = members[0].params().clone();
    let sizes: Vec<usize> = params.values.iter().map(Vec::len).collect();
    let mut adam = AdamW::new(&sizes, cfg.train.weight_decay);
    adam.beta1 = p.momentum;
    let mut momentum: Vec<Vec<f32>> = sizes.iter().map(|n| vec![0.0; *n]).collect();
    let lr = cfg.train.lr;
    let mut curve = Vec::new();
    let started = Instant::now();
    let mut eval_secs = 0.0;
    let mut val_loss = f32::NAN;
    let mut ahead: Option<Vec<Vec<Vec<f32>>>> = None;
    // The weights before the last applied update (`SharedLook` only).
    let mut previous: Option<cohort_engine::params::ParamSet> = None;
    let cut = match p.method {
        Method::TopAgg(_)
        | Method::SharedAgg { .. }
        | Method::SharedLook(_)
        | Method::Outer(_)
        | Method::Vq { .. } => {
            let compress = CompressConfig {
                decay: p.momentum,
                decode: Decode::Sign,
                select: match p.method {
                    Method::SharedAgg { .. }
                    | Method::SharedLook(_)
                    | Method::Outer(_)
                    | Method::Vq { .. } => Select::Shared,
                    _ => Select::TopK,
                },
                ..cfg.train.compress
            };
            let layout = Layout::new(&params.shapes, &compress);
            let members: Vec<Compressor> = (0..cfg.members)
                .map(|_| Compressor::new(&layout, compress))
                .collect();
            let k = match p.method {
                Method::TopAgg(k) => k as usize,
                _ => 0,
            };
            Some((layout, members, k))
        }
        _ => None,
    };
    let mut cut = cut;
    let member_gradients = |members: &mut Vec<Trainer>, step: u32| -> Result<Vec<Vec<Vec<f32>>>> {
        let epoch = step / cfg.steps_per_epoch;
        let seed = runner::epoch_seed(&cfg.job, epoch);
        let grads: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = members
                .iter_mut()
                .map(|m| {
                    let index = m.id.index;
                    s.spawn(move || m.member_gradients(&seed, epoch, step, index))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("member thread"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        Ok(grads.into_iter().map(|(_, g)| g).collect())
    };
    let mean_gradient = |grads: Vec<Vec<Vec<f32>>>| -> Vec<Vec<f32>> {
        let mut avg: Vec<Vec<f32>> = sizes.iter().map(|n| vec![0.0; *n]).collect();
        for g in &grads {
            for (a, gi) in avg.iter_mut().zip(g) {
                for (x, y) in a.iter_mut().zip(gi) {
                    *x += y;
                }
            }
        }
        let inv = 1.0 / cfg.members as f32;
        avg.iter_mut().flatten().for_each(|x| *x *= inv);
        avg
    };
    let mut bytes_per_member_step = 4.0 * params.numel() as f64;
    for step in 0..cfg.steps {
        let grads = match ahead.take() {
            Some(g) => g,
            None => member_gradients(&mut members, step)?,
        };
        if p.schedule == Schedule::OneStepStale && step + 1 < cfg.steps {
            // Computed on weights step `step` has not been applied to yet
            // (or, for `SharedLook`, on those extrapolated by the last update).
            if let (Some(pct), Some(prev)) = (p.method.look(), &previous) {
                let gamma = pct as f32 / 100.0;
                let mut look = params.clone();
                for (l, w0) in look.values.iter_mut().zip(&prev.values) {
                    for (x, x0) in l.iter_mut().zip(w0) {
                        *x += gamma * (*x - x0);
                    }
                }
                for m in members.iter_mut() {
                    m.set_params(look.clone(), step)?;
                }
            }
            ahead = Some(member_gradients(&mut members, step + 1)?);
        }
        if p.method.look().is_some() {
            previous = Some(params.clone());
        }
        match p.method {
            Method::AdamW => adam.step(&mut params.values, &mean_gradient(grads), lr.at(step)),
            Method::Vq { book, .. } => {
                let (layout, compressors, _) = cut.as_mut().expect("set up for Vq");
                let draw = Draw::for_step(&cfg.job, step);
                let picks: Vec<_> = compressors
                    .iter_mut()
                    .zip(&grads)
                    .map(|(c, g)| book.compress(layout, &mut c.momentum, g, p.momentum, draw))
                    .collect();
                bytes_per_member_step = book.payload_len(layout) as f64;
                let dirs = book.decode(layout, &picks, draw, Decode::Sign);
                sign_sgd_step(
                    &mut params.values,
                    &dirs,
                    lr.at(step),
                    cfg.train.weight_decay,
                );
            }
            Method::TopAgg(_)
            | Method::SharedAgg { .. }
            | Method::SharedLook(_)
            | Method::Outer(_) => {
                let (layout, compressors, k) = cut.as_mut().expect("set up for TopAgg");
                // The draw the engine's members use (it matters only to the
                // shared rule).
                let draw = Draw::for_step(&cfg.job, step);
                let payloads = compressors
                    .iter_mut()
                    .zip(&grads)
                    .map(|(c, g)| c.compress(layout, g, draw))
                    .collect::<Result<Vec<_>, _>>()?;
                bytes_per_member_step = wire::payload_len(layout) as f64;
                let dirs = if p.method == (Method::SharedAgg { sign: true }) {
                    aggregate_signs(layout, &payloads)
                } else if *k == 0 {
                    let weighted: Vec<_> = payloads.iter().map(|p| (p, 1)).collect();
                    aggregate(layout, &weighted, Decode::Sign)
                } else {
                    aggregate_top(layout, &payloads, *k)
                };
                let dirs = match p.method {
                    // The outer momentum (`momentum`'s buffer, unused
                    // otherwise on this path) and its sign.
                    Method::Outer(b) => {
                        let beta = b as f32 / 100.0;
                        momentum
                            .iter_mut()
                            .zip(&dirs)
                            .map(|(m, d)| {
                                m.iter_mut()
                                    .zip(d)
                                    .map(|(mi, di)| {
                                        *mi = beta * *mi + di;
                                        mi.signum() * (*mi != 0.0) as u8 as f32
                                    })
                                    .collect()
                            })
                            .collect()
                    }
                    _ => dirs,
                };
                sign_sgd_step(
                    &mut params.values,
                    &dirs,
                    lr.at(step),
                    cfg.train.weight_decay,
                );
            }
            _ => {
                let avg = mean_gradient(grads);
                for (m, g) in momentum.iter_mut().zip(&avg) {
                    for (mi, gi) in m.iter_mut().zip(g) {
                        *mi = p.momentum * *mi + gi;
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
    Ok(Outcome {
        final_val_loss: val_loss,
        curve,
        bytes_per_member_step,
        tokens_per_sec: tokens / wall,
    })
}

/// [`Method::Local`]: `h` local AdamW steps per member between exchanges
/// of the shared rule's signs of each member's pseudo-gradient.
fn local(p: &Point, cfg: &RunConfig, corpus: &Corpus, h: u32) -> Result<Outcome> {
    if p.schedule != Schedule::Lockstep {
        anyhow::bail!("method local{h} runs lock-step only: add --schedule lockstep");
    }
    let mut members = trainers(cfg, corpus)?;
    let mut params = members[0].params().clone();
    let sizes: Vec<usize> = params.values.iter().map(Vec::len).collect();
    let mut inner: Vec<AdamW> = (0..cfg.members).map(|_| AdamW::new(&sizes, 0.0)).collect();
    let mut own: Vec<Vec<Vec<f32>>> = (0..cfg.members).map(|_| params.values.clone()).collect();
    let compress = CompressConfig {
        decay: p.momentum,
        decode: Decode::Sign,
        select: Select::Shared,
        ..cfg.train.compress
    };
    let layout = Layout::new(&params.shapes, &compress);
    let mut compressors: Vec<Compressor> = (0..cfg.members)
        .map(|_| Compressor::new(&layout, compress))
        .collect();
    let lr = cfg.train.lr;
    let mut curve = Vec::new();
    let started = Instant::now();
    let mut eval_secs = 0.0;
    let mut val_loss = f32::NAN;
    let mut lr_sum = 0.0f32;
    for step in 0..cfg.steps {
        let epoch = step / cfg.steps_per_epoch;
        let seed = runner::epoch_seed(&cfg.job, epoch);
        let grads: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = members
                .iter_mut()
                .zip(&own)
                .map(|(m, w)| {
                    let index = m.id.index;
                    let mine = cohort_engine::params::ParamSet {
                        names: params.names.clone(),
                        shapes: params.shapes.clone(),
                        values: w.clone(),
                    };
                    s.spawn(move || -> Result<_> {
                        m.set_params(mine, step)?;
                        Ok(m.member_gradients(&seed, epoch, step, index)?.1)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("member thread"))
                .collect::<Result<Vec<_>>>()
        })?;
        for ((a, w), g) in inner.iter_mut().zip(own.iter_mut()).zip(&grads) {
            a.step(w, g, lr.at(step));
        }
        lr_sum += lr.at(step);
        if (step + 1) % h == 0 || step + 1 == cfg.steps {
            let draw = Draw::for_step(&cfg.job, step);
            let payloads = compressors
                .iter_mut()
                .zip(&own)
                .map(|(c, w)| {
                    let delta: Vec<Vec<f32>> = params
                        .values
                        .iter()
                        .zip(w)
                        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x - y).collect())
                        .collect();
                    c.compress(&layout, &delta, draw)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let weighted: Vec<_> = payloads.iter().map(|p| (p, 1)).collect();
            let dirs = aggregate(&layout, &weighted, Decode::Sign);
            sign_sgd_step(
                &mut params.values,
                &dirs,
                lr_sum / 3.0,
                cfg.train.weight_decay,
            );
            lr_sum = 0.0;
            for w in own.iter_mut() {
                w.clone_from(&params.values);
            }
        }
        if (step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps {
            let t0 = Instant::now();
            members[0].set_params(params.clone(), step + 1)?;
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
    Ok(Outcome {
        final_val_loss: val_loss,
        curve,
        bytes_per_member_step: wire::payload_len(&layout) as f64 / h as f64,
        tokens_per_sec: tokens / wall,
    })
}

/// The members' votes summed per coefficient and cut to their sign (−1, 0
/// or +1: a 2-bit sign sum), inverse-DCT'd in ascending index order and
/// signed: what a node would apply from sign-sum aggregates of the shared
/// rule, whose members all vote on the same positions.
fn aggregate_signs(layout: &Layout, payloads: &[Payload]) -> Vec<Vec<f32>> {
    use rayon::prelude::*;
    layout
        .dcts
        .par_iter()
        .enumerate()
        .map(|(p, dct)| {
            let k = layout.topk[p];
            let mut x = vec![0f32; layout.numel(p)];
            let mut votes = vec![0i32; dct.tiling.chunk_size()];
            for ch in 0..dct.tiling.chunks() {
                let range = ch * k..(ch + 1) * k;
                for payload in payloads {
                    let s = &payload.params[p];
                    for (i, neg) in s.idx[range.clone()].iter().zip(&s.neg[range.clone()]) {
                        votes[*i as usize] += if *neg { -1 } else { 1 };
                    }
                }
                // Every member names the same drawn positions.
                if let Some(first) = payloads.first() {
                    for &i in &first.params[p].idx[range] {
                        let v = votes[i as usize].signum();
                        if v != 0 {
                            dct.add_basis(&mut x, ch, i as usize, v as f32);
                        }
                        votes[i as usize] = 0;
                    }
                }
            }
            x.iter_mut()
                .for_each(|v| *v = v.signum() * (*v != 0.0) as u8 as f32);
            x
        })
        .collect()
}

/// The members' votes summed per coefficient (integers), cut to the `cut`
/// largest in magnitude per chunk (ties to the lower index), inverse-DCT'd in
/// ascending index order and signed: what a node would apply from top-`cut`
/// aggregates.
fn aggregate_top(layout: &Layout, payloads: &[Payload], cut: usize) -> Vec<Vec<f32>> {
    use rayon::prelude::*;
    layout
        .dcts
        .par_iter()
        .enumerate()
        .map(|(p, dct)| {
            let k = layout.topk[p];
            let mut x = vec![0f32; layout.numel(p)];
            let mut votes = vec![0i32; dct.tiling.chunk_size()];
            let mut touched: Vec<u16> = Vec::new();
            for ch in 0..dct.tiling.chunks() {
                touched.clear();
                for payload in payloads {
                    let s = &payload.params[p];
                    let range = ch * k..(ch + 1) * k;
                    for (i, neg) in s.idx[range.clone()].iter().zip(&s.neg[range]) {
                        touched.push(*i);
                        votes[*i as usize] += if *neg { -1 } else { 1 };
                    }
                }
                touched.sort_unstable();
                touched.dedup();
                touched.retain(|&i| votes[i as usize] != 0);
                if touched.len() > cut {
                    touched.sort_by(|&a, &b| {
                        votes[b as usize]
                            .abs()
                            .cmp(&votes[a as usize].abs())
                            .then(a.cmp(&b))
                    });
                    touched.truncate(cut);
                    touched.sort_unstable();
                }
                for &i in &touched {
                    dct.add_basis(&mut x, ch, i as usize, votes[i as usize] as f32);
                }
                for payload in payloads {
                    let range = ch * k..(ch + 1) * k;
                    for i in &payload.params[p].idx[range] {
                        votes[*i as usize] = 0;
                    }
                }
            }
            x.iter_mut()
                .for_each(|v| *v = v.signum() * (*v != 0.0) as u8 as f32);
            x
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn setting() -> Setting {
        Setting {
            model: ModelConfig::parse("gpt l1 d32 h2 s16").unwrap(),
            members: 3,
            batch: 2,
            steps: 6,
            topk: 4,
            shared_k: 8,
            decode: Decode::Sign,
            adaptive_beta2: 0.0,
            weight_decay: 0.1,
            min_lr: 0.1,
            eval_windows: 4,
            eval_every: 3,
        }
    }

    fn run(method: Method) -> Outcome {
        run_on(method, Schedule::OneStepStale)
    }

    fn run_on(method: Method, schedule: Schedule) -> Outcome {
        let p = Point {
            method,
            lr: 3e-3,
            momentum: 0.99,
            wd: 0.1,
            seed: 0,
            schedule,
        };
        setting().run(&p, &Corpus::bundled().unwrap()).unwrap()
    }

    fn bits(o: &Outcome) -> Vec<(u32, u32)> {
        o.curve.iter().map(|(s, l)| (*s, l.to_bits())).collect()
    }

    #[test]
    fn the_look_ahead_changes_the_stale_run_and_leaves_the_lock_step_one_alone() {
        let look = Method::SharedLook(100);
        let kept = Method::SharedAgg { sign: false };
        assert_ne!(bits(&run(look)), bits(&run(kept)));
        assert_eq!(
            bits(&run_on(look, Schedule::Lockstep)),
            bits(&run_on(kept, Schedule::Lockstep))
        );
    }

    #[test]
    fn the_loop_looking_ahead_by_the_whole_last_update_is_the_engines_look_ahead_bit_for_bit() {
        let corpus = Corpus::bundled().unwrap();
        let look = run(Method::SharedLook(100));
        let s = setting();
        let p = Point {
            method: Method::Shared,
            lr: 3e-3,
            momentum: 0.99,
            wd: 0.1,
            seed: 0,
            schedule: Schedule::OneStepStale,
        };
        let mut cfg = s.run_config(&p);
        cfg.train.look_ahead = 1.0;
        let engines = (0..cfg.members).map(|_| backend::cpu()).collect();
        let engine =
            runner::run_scheduled(&cfg, Schedule::OneStepStale, &corpus, engines, |_| {}).unwrap();
        let engine: Vec<(u32, u32)> = engine
            .val_curve
            .iter()
            .map(|(s, l)| (*s, l.to_bits()))
            .collect();
        assert_eq!(engine, bits(&look));
        assert_eq!(engine.len(), 2);
    }

    #[test]
    fn the_loop_keeping_every_vote_is_the_engines_shared_rule_bit_for_bit_and_sign_sums_are_not() {
        let engine = run(Method::Shared);
        let kept = run(Method::SharedAgg { sign: false });
        assert_eq!(bits(&engine), bits(&kept));
        assert_eq!(engine.curve.len(), 2);
        // With three members a sign sum weighs a 3–0 vote as a 2–1 one:
        // another rule, so other weights. (With two it would be the sum
        // halved, which the decoder's final sign cannot tell apart.)
        let signs = run(Method::SharedAgg { sign: true });
        assert_ne!(bits(&engine), bits(&signs));
    }

    #[test]
    fn the_aggregate_methods_parse_from_their_keys() {
        for m in [
            Method::SharedAgg { sign: false },
            Method::SharedAgg { sign: true },
            Method::TopAgg(3),
            Method::SharedLook(100),
            Method::Local(4),
            Method::Outer(90),
        ] {
            assert_eq!(Method::parse(&m.key()).unwrap(), m);
        }
        assert!(Method::parse("signagg2").is_err());
        assert!(Method::parse("sharedlook0").is_err());
        assert!(Method::parse("local0").is_err());
        assert!(Method::parse("outer100").is_err());
    }
}
