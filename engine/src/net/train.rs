//! The training thread: computes step t+1 while step t is exchanged, applies
//! manifests the network task hands it, and runs this witness's audits.

use super::events::{AuditReport, Credits, NodeConfig, NodeEvent, StepTimes};
use super::guard::{Announced, Guard, Revealed, Sample, Target};
use super::msg::{self, Announce, Manifest};
use crate::adversary::{self, Attack, Mode};
use crate::audit;
use crate::compress::Payload;
use crate::error::EngineError;
use crate::trainer::{StepStats, Trainer};
use crate::wire::Contribution;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

pub(crate) enum ToTrainer {
    Start,
    /// Load this shared state: a verified download, or this node's own
    /// earlier state when it rewinds. `generation` counts rewinds, so the
    /// network side can drop what the trainer sent before this one.
    Snapshot {
        bytes: Vec<u8>,
        generation: u64,
    },
    Apply {
        manifest: Manifest,
        inputs: Inputs,
        last_produced_us: u64,
        same_history: bool,
    },
    /// What a member revealed of the momentum it committed to at `step`.
    Audit {
        step: u32,
        member: u32,
        outcome: Revealed,
    },
    /// A member's payload of `step`, assembled from its slices for an audit
    /// on the sharded exchange (None: they could not all be fetched).
    Sent {
        step: u32,
        member: u32,
        payload: Option<Payload>,
    },
    /// A member's slice of `shard` a witness sampled to screen its
    /// contribution, with the shard's accepted sums (None: nobody served
    /// the slice, or the sums are gone).
    Sampled {
        step: u32,
        member: u32,
        shard: u32,
        found: Option<(Vec<bool>, Vec<i32>)>,
    },
    /// Auditor `by` accused `member`'s step-`step` contribution on its
    /// slice of `shard`: check that slice too, if this node is one of its
    /// auditors.
    ConfirmSample {
        step: u32,
        member: u32,
        shard: u32,
        by: u32,
    },
    /// A member was slashed: it no longer audits anyone.
    Slashed(u32),
    /// Auditor `by`'s coin drew `member`'s step-`step` contribution and its
    /// audit failed: audit it too, if this node is one of its auditors.
    Confirm {
        step: u32,
        member: u32,
        by: u32,
        coin: [u8; 64],
    },
}

/// What a step applies from: the listed members' signed payloads (the
/// all-to-all exchange), or every shard's vote sums over them (the sharded
/// exchange, `net::exchange`).
pub(crate) enum Inputs {
    Payloads(Vec<Vec<u8>>),
    /// The sums, and the announcements this node heard of the listed
    /// members, with the state each was computed on (for audits).
    Sums {
        sums: Vec<Vec<i32>>,
        announced: Vec<(Announced, [u8; 32])>,
    },
}

pub(crate) enum FromTrainer {
    /// Local state loaded; `step` applied so far; `resumed` from checkpoint.
    Ready {
        step: u32,
        resumed: bool,
    },
    Contribution {
        announce: Announce,
        bytes: Vec<u8>,
        /// The momentum it committed to, encoded: revealed when audited.
        momentum: Arc<Vec<u8>>,
        compute_secs: f64,
    },
    /// Contributions of `step` this witness audits: fetch their momenta
    /// (and, for a chain check, the one committed at the step before).
    AuditTargets {
        step: u32,
        targets: Vec<Target>,
    },
    /// Slices of `step` this witness screens contributions by (the sharded
    /// exchange's screen): fetch them.
    Samples {
        step: u32,
        samples: Vec<Sample>,
    },
    /// An audit drawn at `step` of `member` is decided: its report, or
    /// None when there was nothing to decide (the member was unreachable,
    /// or a randomly drawn member declined).
    AuditDone {
        step: u32,
        member: u32,
        report: Option<AuditReport>,
    },
    Applied {
        step: u32,
        state_hash: [u8; 32],
        /// The state the contributions applied at `step` must have been
        /// computed on (`Basis::expected`).
        basis: [u8; 32],
        snapshot: Arc<Vec<u8>>,
        event: NodeEvent,
        generation: u64,
    },
    /// A manifest listed bytes under `member`'s name that it did not sign;
    /// `hash` is what it listed.
    ForgedEntry {
        step: u32,
        leader: u32,
        hash: [u8; 32],
        member: u32,
    },
    /// A manifest of the sharded exchange, naming this node's own state,
    /// listed its leader's own contribution, which the leader announced as
    /// computed on another state ([`foreign_bases`]).
    ForeignBasis {
        step: u32,
        leader: u32,
    },
    /// The state-hash check of an applied manifest of the same history.
    StateCheck {
        step: u32,
        leader: u32,
        matches: bool,
    },
    Synced {
        step: u32,
        resumed: bool,
        credits: Credits,
    },
    Done {
        model_hash: [u8; 32],
        generation: u64,
    },
    Failed(String),
}

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The shared state as hashed in manifests and sent to joiners: the
/// trainer's snapshot, then the hash of the state the contributions of the
/// next step were computed on ([`Basis`]), then the epoch's [`Credits`],
/// then the payload hashes of the last steps (what the screen compares new
/// payloads with), so a node that syncs screens each later step exactly as
/// the others do and credits exactly the members they credit.
/// Bytes [`encode_state`] adds after the trainer's snapshot: reserved up
/// front, so a model-sized state is never copied to grow by a few bytes.
fn trailer_len(recent: &Recent, credits: &Credits) -> usize {
    32 + 4 + 4 * credits.len() + recent.values().map(|h| 8 + 32 * h.len()).sum::<usize>() + 4
}

fn encode_state(
    mut trainer_snapshot: Vec<u8>,
    recent: &Recent,
    basis: &Basis,
    credits: &Credits,
) -> Vec<u8> {
    let start = trainer_snapshot.len();
    trainer_snapshot.extend_from_slice(&basis.previous);
    trainer_snapshot.extend_from_slice(&(credits.len() as u32).to_le_bytes());
    for c in credits {
        trainer_snapshot.extend_from_slice(&c.to_le_bytes());
    }
    for (step, hashes) in recent {
        trainer_snapshot.extend_from_slice(&step.to_le_bytes());
        trainer_snapshot.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
        for h in hashes {
            trainer_snapshot.extend_from_slice(h);
        }
    }
    let trailer = (trainer_snapshot.len() - start) as u32;
    trainer_snapshot.extend_from_slice(&trailer.to_le_bytes());
    trainer_snapshot
}

pub(crate) type Recent = BTreeMap<u32, Vec<[u8; 32]>>;

/// A decoded shared state: the trainer's snapshot and the trailer.
pub(crate) struct SharedState<'a> {
    pub(crate) snapshot: &'a [u8],
    pub(crate) recent: Recent,
    pub(crate) basis: Basis,
    pub(crate) credits: Credits,
}

pub(crate) fn decode_state(buf: &[u8]) -> Result<SharedState<'_>, String> {
    let bad = || "malformed shared state".to_string();
    let n = buf.len().checked_sub(4).ok_or_else(bad)?;
    let trailer = u32::from_le_bytes(buf[n..].try_into().map_err(|_| bad())?) as usize;
    let start = n.checked_sub(trailer).ok_or_else(bad)?;
    let mut r = cohort_program::codec::Reader::new(&buf[start..n]);
    let basis = Basis {
        previous: r.array().map_err(|_| bad())?,
    };
    let members = r.u32().map_err(|_| bad())? as usize;
    if members > r.remaining() / 4 {
        return Err(bad());
    }
    let credits = (0..members)
        .map(|_| r.u32())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad())?;
    let mut recent = BTreeMap::new();
    while r.remaining() > 0 {
        let step = r.u32().map_err(|_| bad())?;
        let count = r.u32().map_err(|_| bad())? as usize;
        if count > r.remaining() / 32 {
            return Err(bad());
        }
        let hashes = (0..count)
            .map(|_| r.array::<32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad())?;
        recent.insert(step, hashes);
    }
    Ok(SharedState {
        snapshot: &buf[..start],
        recent,
        basis,
        credits,
    })
}

/// Which shared state a step's contributions must have been computed on.
/// A node computes step t+1 on the state after step t-1's update while step
/// t is exchanged, so the contributions a manifest lists were computed on
/// the state before the one it is applied to; at the epoch's start (no
/// state before) on that state itself. Each state carries its
/// predecessor's hash, so a node that synced knows it too, and every node
/// on one history skips exactly the same contributions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Basis {
    /// The hash of the state before this one; zeros at the epoch's start.
    previous: [u8; 32],
}

impl Basis {
    /// What the contributions applied to the state hashed `current` must
    /// name.
    fn expected(&self, current: &[u8; 32]) -> [u8; 32] {
        if self.previous == [0; 32] {
            *current
        } else {
            self.previous
        }
    }

    /// The basis of the state an update of the state hashed `current`
    /// leads to.
    fn after(current: &[u8; 32]) -> Self {
        Basis { previous: *current }
    }
}

/// The listed members whose announcement of the listed payload, as this
/// node holds it, names another state than `expected`, the one the step's
/// contributions are computed on here. No witness of the sharded exchange
/// audits such a contribution (it would recompute it on a state its author
/// never used), so its votes count unchecked; an honest leader lists none
/// (`StepMachine::lead`). Only the leader's own entry is proof against it:
/// another author could have shown the leader one announcement and the
/// witnesses another (and block the proof's spread), so a leader is never
/// accused on what someone else announced.
pub(crate) fn foreign_bases(announced: &[(Announced, [u8; 32])], expected: &[u8; 32]) -> Vec<u32> {
    announced
        .iter()
        .filter(|(_, b)| b != expected)
        .map(|(a, _)| a.member)
        .collect()
}

/// A member's work for one step: its contribution, its stats, and the
/// momentum it reveals when that is not its real one (a forger's).
type Computed = (Contribution, StepStats, Option<Vec<Vec<f32>>>);

/// What an adversarial member remembers between steps.
#[derive(Default)]
struct Attacker {
    first: Option<Payload>,
    /// The other members' payloads of the last applied step.
    seen: Vec<Payload>,
}

impl Attacker {
    fn contribute(
        &mut self,
        trainer: &mut Trainer,
        cfg: &NodeConfig,
        mode: Mode,
        step: u32,
    ) -> Result<Computed, EngineError> {
        // The forger commits to (and reveals) a momentum made up so its
        // flipped payload recomputes exactly.
        let forged = if mode == Mode::ForgedMomentum {
            let (_, g) = trainer.gradients_for(&cfg.seed, cfg.epoch, step)?;
            Some(adversary::forged_momentum(
                trainer.momentum(),
                &g,
                trainer.decay(),
            ))
        } else {
            None
        };
        let momentum_hash = audit::momentum_hash(forged.as_deref().unwrap_or(trainer.momentum()));
        let own = if mode.computes(self.first.is_none()) {
            Some(trainer.compute_scaled(&cfg.seed, cfg.epoch, step, mode.grad_scale())?)
        } else {
            None
        };
        let seen: Vec<&Payload> = self.seen.iter().collect();
        let seed =
            *blake3::hash(&[&cfg.seed[..], &step.to_le_bytes(), &cfg.me.to_le_bytes()].concat())
                .as_bytes();
        let payload = adversary::forge(
            mode,
            &Attack {
                layout: trainer.layout(),
                honest: &seen,
                own: own.as_ref().map(|o| &o.0.payload),
                first: self.first.as_ref(),
                seed,
                // A network attacker does not know its accomplices.
                crew: 1,
                rank: 0,
            },
        );
        self.first.get_or_insert_with(|| payload.clone());
        let stats = own.as_ref().map_or(
            StepStats {
                loss: 0.0,
                compute_secs: 0.0,
            },
            |o| o.1,
        );
        Ok((
            Contribution {
                job: cfg.job,
                epoch: cfg.epoch,
                step,
                member: trainer.id.member,
                train_loss: stats.loss,
                momentum_hash,
                basis: [0; 32],
                payload,
            },
            stats,
            forged,
        ))
    }
}

/// The training side: compute step t+1 while step t is exchanged.
pub(crate) fn train_loop(
    cfg: NodeConfig,
    mut trainer: Trainer,
    rx: std_mpsc::Receiver<ToTrainer>,
    tx: mpsc::UnboundedSender<FromTrainer>,
) -> Result<(), String> {
    let signer = msg::keypair(&cfg.secret);
    let layout = trainer.layout().clone();
    // The sharded exchange's shards, which its sums come in.
    let shards = match cfg.exchange {
        Some(plan) => Some(crate::shard::split(&layout, plan.shards).map_err(|e| e.to_string())?),
        None => None,
    };
    let send = |m: FromTrainer| tx.send(m).map_err(|_| "network task gone".to_string());
    let mut guard = Guard::new(&cfg);
    let mut attacker = Attacker::default();
    let mut resumed = false;
    if let Some(path) = &cfg.checkpoint
        && path.exists()
    {
        trainer.restore(path).map_err(|e| e.to_string())?;
        resumed = cfg.epoch_start != Some(trainer.step());
    }
    send(FromTrainer::Ready {
        step: trainer.step(),
        resumed,
    })?;
    let syncing = cfg.join || resumed;
    let mut generation = 0;
    // Loads a shared state (trainer snapshot, the screen's memory, the
    // basis of the contributions applied next, and the epoch's credits).
    let load_state = |trainer: &mut Trainer, guard: &mut Guard, bytes: &[u8]| {
        let state = decode_state(bytes)?;
        if state.credits.len() != cfg.members.len() {
            return Err(format!(
                "a shared state credits {} members, this job has {}",
                state.credits.len(),
                cfg.members.len()
            ));
        }
        trainer
            .load_snapshot(state.snapshot)
            .map_err(|e| e.to_string())?;
        guard.recent = state.recent;
        guard.remember(trainer);
        Ok::<(Basis, Credits), String>((state.basis, state.credits))
    };
    let mut basis = Basis::default();
    // A fresh start is the epoch's first step: nobody credited yet.
    let mut credits: Credits = vec![0; cfg.members.len()];
    loop {
        match rx.recv().map_err(|_| "network task gone".to_string())? {
            ToTrainer::Start => {
                guard.start_fresh(trainer.step());
                break;
            }
            ToTrainer::Snapshot {
                bytes,
                generation: g,
            } if syncing => {
                (basis, credits) = load_state(&mut trainer, &mut guard, &bytes)?;
                generation = g;
                send(FromTrainer::Synced {
                    step: trainer.step(),
                    resumed,
                    credits: credits.clone(),
                })?;
                break;
            }
            _ => {}
        }
    }
    guard.remember(&trainer);
    let publish_state = |t: &Trainer, guard: &Guard, basis: &Basis, credits: &Credits| {
        let room = trailer_len(&guard.recent, credits);
        let snapshot = Arc::new(encode_state(
            t.snapshot_with_room(room),
            &guard.recent,
            basis,
            credits,
        ));
        let state_hash = *blake3::hash(&snapshot).as_bytes();
        (state_hash, snapshot)
    };
    // The state hash of the current weights, kept so each step encodes and
    // hashes the full state once (it is checked against the next manifest).
    let (mut current_hash, snap) = publish_state(&trainer, &guard, &basis, &credits);
    send(FromTrainer::Applied {
        step: trainer.step(),
        state_hash: current_hash,
        basis: basis.expected(&current_hash),
        snapshot: snap,
        event: NodeEvent::Synced {
            step: trainer.step(),
            resumed,
            credits: credits.clone(),
        },
        generation,
    })?;
    // A fresh start computes steps 0 and 1 before applying 0; a node that
    // synced at step s computes s+1 (its step-s contribution would be late).
    let mut next_compute = if cfg.join || resumed {
        trainer.step() + 1
    } else {
        trainer.step()
    };
    let mut compute_secs = 0.0;
    let mut loss = 0.0;
    // Loads a state sent by the network side (a rewind, or a download after
    // a rewind too deep for this node's kept states). Contributions already
    // announced are never computed again: a second, different one for the
    // same step would be equivocation.
    let load = |trainer: &mut Trainer,
                guard: &mut Guard,
                bytes: &[u8],
                generation: u64,
                next_compute: &mut u32|
     -> Result<([u8; 32], Basis, Credits), String> {
        let (basis, credits) = load_state(trainer, guard, bytes)?;
        *next_compute = (*next_compute).max(trainer.step() + 1);
        let (hash, snapshot) = publish_state(trainer, guard, &basis, &credits);
        send(FromTrainer::Applied {
            step: trainer.step(),
            state_hash: hash,
            basis: basis.expected(&hash),
            snapshot,
            event: NodeEvent::Rewound {
                step: trainer.step(),
                credits: credits.clone(),
            },
            generation,
        })?;
        Ok((hash, basis, credits))
    };
    let report = |decided: Vec<super::guard::Decided>| {
        for (step, member, report) in decided {
            send(FromTrainer::AuditDone {
                step,
                member,
                report,
            })?;
        }
        Ok::<(), String>(())
    };
    let audit =
        |trainer: &mut Trainer, guard: &mut Guard, step: u32, member: u32, outcome: Revealed| {
            report(guard.revealed(trainer, &cfg, step, member, outcome)?)
        };
    let sent = |trainer: &mut Trainer,
                guard: &mut Guard,
                step: u32,
                member: u32,
                payload: Option<Payload>| {
        report(guard.sent(trainer, &cfg, step, member, payload)?)
    };
    // A sampled slice the screen flags opens an audit.
    let sampled = |guard: &mut Guard,
                   step: u32,
                   member: u32,
                   shard: u32,
                   found: Option<(Vec<bool>, Vec<i32>)>| {
        if let Some(t) = guard.sampled(step, member, shard, found) {
            send(FromTrainer::AuditTargets {
                step,
                targets: vec![t],
            })?;
        }
        Ok::<(), String>(())
    };
    // Another auditor's sample flagged it: check the same slice.
    let confirm_sample = |guard: &mut Guard, step: u32, member: u32, shard: u32, by: u32| {
        if let Some(s) = guard.confirm_sample(step, member, shard, by) {
            send(FromTrainer::Samples {
                step,
                samples: vec![s],
            })?;
        }
        Ok::<(), String>(())
    };
    // Another auditor's drawn audit failed: this one runs it too.
    let confirm = |guard: &mut Guard, step: u32, member: u32, by: u32, coin: [u8; 64]| {
        if let Some(t) = guard.confirm(step, member, by, coin) {
            send(FromTrainer::AuditTargets {
                step,
                targets: vec![t],
            })?;
        }
        Ok::<(), String>(())
    };
    let mut memory = PauseMemory::default();
    loop {
        while trainer.step() < cfg.steps {
            if next_compute < cfg.steps
                && next_compute <= trainer.step() + 1
                && cfg.pause.load(Ordering::Relaxed)
            {
                if memory.paused(cfg.release_memory_when_paused) {
                    trainer.release_device_memory();
                }
                // Skipped, not postponed: a contribution for a step already
                // being exchanged would only arrive late.
                next_compute += 1;
                continue;
            }
            if next_compute < cfg.steps && next_compute <= trainer.step() + 1 {
                memory.computing();
                let before = audit::encode_momentum(trainer.momentum());
                let (mut c, stats, forged) = match cfg.defence.adversary {
                    None => trainer
                        .compute_step(&cfg.seed, cfg.epoch, next_compute)
                        .map(|(c, s)| (c, s, None)),
                    Some(mode) => attacker.contribute(&mut trainer, &cfg, mode, next_compute),
                }
                .map_err(|e| e.to_string())?;
                // Computed on the current state: it applies only there.
                c.basis = current_hash;
                let momentum = Arc::new(forged.map_or(before, |m| audit::encode_momentum(&m)));
                compute_secs = stats.compute_secs;
                loss = stats.loss;
                let bytes = c.encode_signed(&layout, &signer);
                let announce = Announce {
                    job: cfg.job,
                    epoch: cfg.epoch,
                    step: next_compute,
                    member: cfg.me,
                    payload_hash: *blake3::hash(&bytes).as_bytes(),
                    momentum_hash: c.momentum_hash,
                    basis: c.basis,
                    len: bytes.len() as u32,
                    produced_us: now_us(),
                    // The node fills in its history as it publishes.
                    chain_step: 0,
                    chain: [0; 32],
                };
                send(FromTrainer::Contribution {
                    announce,
                    bytes,
                    momentum,
                    compute_secs,
                })?;
                next_compute += 1;
                if next_compute <= trainer.step() + 1 && next_compute < cfg.steps {
                    continue;
                }
            }
            let blocked_from = now_us();
            let next = loop {
                match rx.recv().map_err(|_| "network task gone".to_string())? {
                    ToTrainer::Apply {
                        manifest,
                        inputs,
                        last_produced_us,
                        same_history,
                    } if manifest.step == trainer.step() => {
                        break Some((manifest, inputs, last_produced_us, same_history));
                    }
                    ToTrainer::Snapshot {
                        bytes,
                        generation: g,
                    } => {
                        (current_hash, basis, credits) =
                            load(&mut trainer, &mut guard, &bytes, g, &mut next_compute)?;
                        generation = g;
                        break None;
                    }
                    // Audits run while this node waits for the manifest.
                    ToTrainer::Audit {
                        step,
                        member,
                        outcome,
                    } => audit(&mut trainer, &mut guard, step, member, outcome)?,
                    ToTrainer::Sent {
                        step,
                        member,
                        payload,
                    } => sent(&mut trainer, &mut guard, step, member, payload)?,
                    ToTrainer::Sampled {
                        step,
                        member,
                        shard,
                        found,
                    } => sampled(&mut guard, step, member, shard, found)?,
                    ToTrainer::ConfirmSample {
                        step,
                        member,
                        shard,
                        by,
                    } => confirm_sample(&mut guard, step, member, shard, by)?,
                    ToTrainer::Slashed(m) => guard.policy.slash(m),
                    ToTrainer::Confirm {
                        step,
                        member,
                        by,
                        coin,
                    } => confirm(&mut guard, step, member, by, coin)?,
                    _ => {}
                }
            };
            let Some((manifest, inputs, last_produced_us, same_history)) = next else {
                continue;
            };
            let unblocked = now_us();
            // A leader with another history legitimately has other weights
            // (one of us rewinds once the better manifest is known).
            if same_history {
                send(FromTrainer::StateCheck {
                    step: manifest.step,
                    leader: manifest.leader,
                    matches: manifest.state_hash == current_hash,
                })?;
            }
            let (contributors, targets) = match inputs {
                Inputs::Payloads(payloads) => {
                    // Payloads that do not decode (or are not the member's for this
                    // step) are skipped; every node holds the same bytes for a
                    // manifest, so every node skips the same ones.
                    // So are contributions computed on another state (their author
                    // rewound since): recomputed on this one they would fail an
                    // honest member's audit.
                    let expected = basis.expected(&current_hash);
                    let mut contributions = Vec::with_capacity(payloads.len());
                    let mut contributors = Vec::with_capacity(payloads.len());
                    for ((member, hash), bytes) in manifest.entries.iter().zip(&payloads) {
                        let Some(key) = cfg.members.get(*member as usize) else {
                            continue;
                        };
                        match Contribution::decode_signed(bytes, &layout) {
                            Ok(c)
                                if c.member == *key
                                    && c.step == manifest.step
                                    && c.job == cfg.job
                                    && c.basis == expected =>
                            {
                                contributions.push(c);
                                contributors.push(*member);
                            }
                            // Bytes listed under a member's name that the member did
                            // not sign: the leader's doing, never the member's.
                            Err(EngineError::Signature) if *member != manifest.leader => {
                                send(FromTrainer::ForgedEntry {
                                    step: manifest.step,
                                    leader: manifest.leader,
                                    hash: *hash,
                                    member: *member,
                                })?;
                            }
                            _ => {}
                        }
                    }
                    // Flagged and copied payloads get no vote; the screen is a pure
                    // function of the manifest's payloads and the recent steps', so
                    // every node weighs them alike and stays bit-identical.
                    let verdict = guard.screen(&layout, manifest.step, &contributions);
                    let targets =
                        guard.draw(manifest.step, &contributors, &contributions, &verdict);
                    if cfg.defence.adversary.is_some() {
                        attacker.seen = contributors
                            .iter()
                            .zip(&contributions)
                            .filter(|(m, _)| **m != cfg.me)
                            .map(|(_, c)| c.payload.clone())
                            .collect();
                    }
                    trainer
                        .apply_weighted(&contributions, &verdict.weights)
                        .map_err(|e| e.to_string())?;
                    (contributors, targets)
                }
                // Every listed member counts once: the sums are the
                // members' slices, checked against the roots they signed
                // (the whole-payload screen needs what no node of a sharded
                // exchange holds). A witness screens and audits those
                // computed on this state (`Guard::draw_sharded`).
                Inputs::Sums { sums, announced } => {
                    let Some(shards) = &shards else {
                        return Err("sums for a node on the all-to-all exchange".into());
                    };
                    trainer
                        .apply_sums(shards, &sums)
                        .map_err(|e| e.to_string())?;
                    let listed: Vec<u32> = manifest.entries.iter().map(|e| e.0).collect();
                    let expected = basis.expected(&current_hash);
                    // The manifest names this node's state, so its leader's
                    // step state is this node's too: listing its own work
                    // announced on another is the leader's breach of the
                    // rule, not a fork.
                    if manifest.state_hash == current_hash
                        && foreign_bases(&announced, &expected).contains(&manifest.leader)
                    {
                        send(FromTrainer::ForeignBasis {
                            step: manifest.step,
                            leader: manifest.leader,
                        })?;
                    }
                    let auditable: Vec<Announced> = announced
                        .into_iter()
                        .filter(|(_, b)| *b == expected)
                        .map(|(a, _)| a)
                        .collect();
                    let (targets, samples) =
                        guard.draw_sharded(manifest.step, &manifest.entries, &auditable, &sums);
                    if !samples.is_empty() {
                        send(FromTrainer::Samples {
                            step: manifest.step,
                            samples,
                        })?;
                    }
                    (listed, targets)
                }
            };
            guard.remember(&trainer);
            if let Some(path) = &cfg.checkpoint {
                trainer.save(path).map_err(|e| e.to_string())?;
            }
            if !targets.is_empty() {
                send(FromTrainer::AuditTargets {
                    step: manifest.step,
                    targets,
                })?;
            }
            let blocked = (unblocked.saturating_sub(blocked_from)) as f64 / 1e6;
            let wait = (last_produced_us.saturating_sub(blocked_from) as f64 / 1e6).min(blocked);
            basis = Basis::after(&current_hash);
            for m in &contributors {
                credits[*m as usize] += 1;
            }
            let (state_hash, snapshot) = publish_state(&trainer, &guard, &basis, &credits);
            current_hash = state_hash;
            send(FromTrainer::Applied {
                step: trainer.step(),
                state_hash,
                basis: basis.expected(&state_hash),
                snapshot,
                event: NodeEvent::Applied {
                    step: manifest.step,
                    model_hash: trainer.model_hash(),
                    contributors,
                    credits: credits.clone(),
                    times: StepTimes {
                        compute: compute_secs,
                        comm: blocked - wait,
                        wait,
                    },
                    loss,
                },
                generation,
            })?;
        }
        send(FromTrainer::Done {
            model_hash: trainer.model_hash(),
            generation,
        })?;
        // The node lingers for its peers; a better manifest for one of the
        // last steps can still rewind it until the network side hangs up,
        // and the last steps' audits finish here.
        loop {
            match rx.recv() {
                Err(_) => return Ok(()),
                Ok(ToTrainer::Snapshot {
                    bytes,
                    generation: g,
                }) => {
                    (current_hash, basis, credits) =
                        load(&mut trainer, &mut guard, &bytes, g, &mut next_compute)?;
                    generation = g;
                    break;
                }
                Ok(ToTrainer::Audit {
                    step,
                    member,
                    outcome,
                }) => audit(&mut trainer, &mut guard, step, member, outcome)?,
                Ok(ToTrainer::Sent {
                    step,
                    member,
                    payload,
                }) => sent(&mut trainer, &mut guard, step, member, payload)?,
                Ok(ToTrainer::Sampled {
                    step,
                    member,
                    shard,
                    found,
                }) => sampled(&mut guard, step, member, shard, found)?,
                Ok(ToTrainer::ConfirmSample {
                    step,
                    member,
                    shard,
                    by,
                }) => confirm_sample(&mut guard, step, member, shard, by)?,
                Ok(ToTrainer::Confirm {
                    step,
                    member,
                    by,
                    coin,
                }) => confirm(&mut guard, step, member, by, coin)?,
                Ok(_) => {}
            }
        }
    }
}

/// Whether a pause should hand the device memory back: once when a pause
/// starts (if the owner asked), not again until the member has computed.
#[derive(Debug, Default)]
struct PauseMemory {
    released: bool,
}

impl PauseMemory {
    /// A step skipped for a pause: true when the memory should go now.
    fn paused(&mut self, release_asked: bool) -> bool {
        let now = release_asked && !self.released;
        self.released |= now;
        now
    }

    fn computing(&mut self) {
        self.released = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_contribution_announced_on_another_state_is_named_and_one_on_this_state_is_not() {
        let held = |member: u32, basis: [u8; 32]| {
            (
                Announced {
                    member,
                    momentum: [member as u8; 32],
                    root: [9; 32],
                },
                basis,
            )
        };
        let here = [1; 32];
        let announced = [
            held(0, here),
            held(2, [7; 32]),
            held(3, here),
            held(5, [0; 32]),
        ];
        assert_eq!(foreign_bases(&announced, &here), vec![2, 5]);
        assert!(foreign_bases(&announced[..1], &here).is_empty());
    }

    #[test]
    fn a_shared_state_carries_the_basis_of_the_next_contributions_and_round_trips() {
        let recent: Recent = [(3, vec![[7; 32], [8; 32]]), (4, vec![])].into();
        let basis = Basis::after(&[9; 32]);
        let credits: Credits = vec![4, 0, 5];
        // The trailer fits the room reserved for it: a model-sized buffer
        // is never copied to grow.
        let mut room = Vec::with_capacity(3 + trailer_len(&recent, &credits));
        room.extend_from_slice(&[1, 2, 3]);
        let capacity = room.capacity();
        let bytes = encode_state(room, &recent, &basis, &credits);
        assert_eq!(bytes.capacity(), capacity, "grew");
        assert_eq!(bytes.len(), 3 + trailer_len(&recent, &credits));
        let s = decode_state(&bytes).unwrap();
        assert_eq!(
            (s.snapshot, &s.recent, s.basis, &s.credits),
            (&[1u8, 2, 3][..], &recent, basis, &credits)
        );
        // Another basis is another state: its hash differs.
        let other = encode_state(vec![1, 2, 3], &recent, &Basis::after(&[6; 32]), &credits);
        assert_ne!(blake3::hash(&bytes), blake3::hash(&other));
        for cut in [0, 3, bytes.len() - 1] {
            assert!(decode_state(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn the_epochs_credits_are_part_of_the_state_so_a_node_that_loads_it_takes_the_others_credits() {
        // Two states alike but for one member's credit (one node credited a
        // step of a history it then left) hash apart: a node that downloads
        // the state every other member has can only end with their credits.
        let recent: Recent = [(5, vec![[1; 32]])].into();
        let basis = Basis::after(&[2; 32]);
        let kept = encode_state(vec![9; 8], &recent, &basis, &vec![6, 6, 6]);
        let left = encode_state(vec![9; 8], &recent, &basis, &vec![6, 6, 5]);
        assert_ne!(blake3::hash(&kept), blake3::hash(&left));
        assert_eq!(decode_state(&kept).unwrap().credits, vec![6, 6, 6]);
        // A count of members the bytes cannot hold is malformed.
        let mut lying = encode_state(vec![9; 8], &Recent::new(), &basis, &vec![]);
        let at = lying.len() - 4 - 4;
        lying[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_state(&lying).is_err());
    }

    #[test]
    fn contributions_are_applied_on_the_state_before_the_one_they_were_computed_on_except_at_the_start()
     {
        // At the epoch's start steps 0 and 1 are both computed on the first
        // state: what manifest 0 lists must name that state itself.
        let first = [1; 32];
        assert_eq!(Basis::default().expected(&first), first);
        // Step 1's manifest is applied to the state after step 0, and its
        // contributions were computed on the first state.
        let after_0 = Basis::after(&first);
        assert_eq!(after_0.expected(&[2; 32]), first);
        // A contribution computed on a state of an abandoned history names
        // another hash, so it is skipped.
        assert_ne!(after_0.expected(&[2; 32]), [3; 32]);
    }

    #[test]
    fn a_pause_releases_device_memory_once_and_only_when_asked() {
        let mut m = PauseMemory::default();
        assert!(!m.paused(false));
        assert!(m.paused(true));
        assert!(
            !m.paused(true),
            "a second skipped step releases nothing more"
        );
        m.computing();
        assert!(m.paused(true), "the next pause releases again");
    }
}
