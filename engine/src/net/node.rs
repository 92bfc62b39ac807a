//! One member of a job on the network: a training thread that owns the
//! [`Trainer`] and a network task that owns the swarm and the
//! [`StepMachine`]. They talk through channels, so training never waits on
//! I/O except where the protocol says it must (the manifest of step t-1
//! before computing step t+1).

use super::diverge::{Conclusion, DivergenceVote};
use super::msg::{
    self, Accuse, Announce, Body, Drop, Heartbeat, Manifest, Request, Response, Signed,
};
use super::shaper::Link;
use super::step::{Action, KEEP, StepMachine, Timing, Verdict};
use super::swarm::{self, Behaviour, BehaviourEvent};
use crate::adversary::{self, Attack, Mode};
use crate::audit::{self, AuditConfig, Comparison, StepScreen};
use crate::backend::GradientEngine;
use crate::compress::Payload;
use crate::data::Corpus;
use crate::error::EngineError;
use crate::params::ParamSet;
use crate::trainer::{Identity, StepStats, TrainConfig, Trainer};
use crate::wire::Contribution;
use libp2p::futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance};
use libp2p::identity::ed25519;
use libp2p::request_response::{self, OutboundRequestId};
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, Swarm, ping};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};

/// Decides whether this node co-signs a message a fellow witness sent it.
/// It is called with the message and the keys of the members this node
/// itself accused; the application parses the message (the engine knows
/// no Solana types) and only what it accepts is signed with the node key.
#[derive(Clone)]
pub struct Cosigner(pub Arc<CosignCheck>);

/// `(message, keys of the members this node accused) -> sign it?`
pub type CosignCheck = dyn Fn(&[u8], &[[u8; 32]]) -> bool + Send + Sync;

impl std::fmt::Debug for Cosigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cosigner")
    }
}

/// Proof of contribution for one epoch (see [`crate::audit`]). Every node
/// screens each step's payloads the same way; the epoch's witnesses also
/// audit, and a quorum of their accusations slashes a member.
#[derive(Debug, Clone, Default)]
pub struct Defence {
    pub audit: AuditConfig,
    /// The epoch's witness committee (member indices): only their
    /// accusations count, and this node audits when it is one of them.
    pub witnesses: Vec<u32>,
    /// Tests and benchmarks only: this member attacks. Modes that need the
    /// step's honest payloads use the previous step's (a real attacker
    /// cannot see the others' payloads before sending its own).
    pub adversary: Option<Mode>,
    pub cosigner: Option<Cosigner>,
}

/// One audit this node ran as a witness.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditReport {
    pub step: u32,
    pub member: u32,
    pub passed: bool,
    /// Drawn because the screen flagged the payload (else at random).
    pub targeted: bool,
    /// None when the member withheld or misstated its momentum.
    pub comparison: Option<Comparison>,
    /// How far the revealed momentum is from what the member's previous
    /// one leads to, when the chain was checked ([`audit::chain_error`]);
    /// ∞ when the member lied about or withheld that previous momentum.
    pub chain_error: Option<f32>,
    /// Compute the recomputation took.
    pub secs: f64,
    /// [`audit::evidence_id`] of the audited contribution.
    pub evidence: [u8; 32],
}

/// Requests from the application to a running node.
#[derive(Debug)]
pub enum Control {
    /// Ask members `from` to co-sign `message` (a fraud report they must
    /// agree with, see [`Cosigner`]); answers with the signatures given
    /// within 10 s.
    Cosign {
        message: Vec<u8>,
        from: Vec<u32>,
        reply: oneshot::Sender<Vec<(u32, [u8; 64])>>,
    },
    /// The application is done reporting `member` (sent or given up): this
    /// node, its lead accuser, no longer stays up for that report.
    Settled { member: u32 },
}

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub train: TrainConfig,
    pub job: [u8; 32],
    pub epoch: u32,
    /// Epoch seed (from chain): batches and leaders derive from it.
    pub seed: [u8; 32],
    /// Initial weights of the job.
    pub init_seed: [u8; 32],
    /// Members' node keys; a member's index is its position.
    pub members: Vec<[u8; 32]>,
    pub me: u32,
    /// This node's ed25519 secret (its Solana key's seed).
    pub secret: [u8; 32],
    pub listen: Vec<Multiaddr>,
    pub bootstrap: Vec<Multiaddr>,
    /// Updates to apply before stopping.
    pub steps: u32,
    /// Written after every applied step; resumed from when present.
    pub checkpoint: Option<PathBuf>,
    /// Start by downloading the latest state from peers (late joiner).
    pub join: bool,
    pub link: Link,
    pub timing: Timing,
    pub mdns: bool,
    /// Peers to wait for before a fresh start (0: all other members).
    pub min_peers: usize,
    /// First step of this epoch. A checkpoint saved exactly there holds the
    /// state every member ended the previous epoch with (the first
    /// manifest's state hash checks it), so all members start from their
    /// own copies at once; syncing from peers would deadlock, since every
    /// one of them would be waiting for another.
    pub epoch_start: Option<u32>,
    /// After syncing to a peer's state at step s, fetch the signed
    /// manifests of steps `backfill_from..s` (kept by peers for the whole
    /// epoch) and report their contributors as [`NodeEvent::Backfilled`]:
    /// a restarted member learns who contributed while it was away, so its
    /// points table still matches the one witnesses attest.
    pub backfill_from: Option<u32>,
    /// While set, this member computes no gradients (its owner wants the
    /// device back) but keeps applying every step, so it stays in sync and
    /// can resume at once. Steps it skipped earn it nothing.
    pub pause: Arc<AtomicBool>,
    pub defence: Defence,
}

/// Where each step's time went on this node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    pub compute: f64,
    /// Blocked on the manifest after the step's last contribution existed.
    pub comm: f64,
    /// Blocked because some member had not produced its contribution yet.
    pub wait: f64,
}

#[derive(Debug, Clone)]
pub enum NodeEvent {
    Listening(Multiaddr),
    /// Downloaded and verified the shared state at `step` from a peer.
    Synced {
        step: u32,
        resumed: bool,
    },
    Applied {
        step: u32,
        model_hash: [u8; 32],
        contributors: Vec<u32>,
        times: StepTimes,
        loss: f32,
    },
    /// A step applied while this node was away: its manifest's contributors.
    Backfilled {
        step: u32,
        contributors: Vec<u32>,
    },
    /// More distinct leaders with the same history than could be faulty
    /// published state hashes this node does not have: the same manifests
    /// gave it different weights (`net::diverge`).
    Diverged {
        step: u32,
    },
    /// `leader`'s manifest for `step` stated a state hash this node does
    /// not have, and too few others agree with it to doubt this node's own
    /// state: evidence against the leader, the manifest's entries applied
    /// as listed.
    WrongStateHash {
        step: u32,
        leader: u32,
    },
    /// `leader`'s manifest for `step` listed bytes under `member`'s name
    /// that `member` did not sign: skipped on every node (so `member` is
    /// never audited on them), evidence against the leader.
    ForgedEntry {
        step: u32,
        leader: u32,
        member: u32,
    },
    /// A better manifest for `step` turned up after this node applied
    /// another one: it went back to its state before `step` and applies
    /// again from there.
    Rewound {
        step: u32,
    },
    /// What this node sees of each other member's link, every 2 s.
    Links(Vec<PeerLink>),
    /// This node, as a witness, audited a contribution.
    Audited(AuditReport),
    /// A quorum of witnesses accused `member`: it is left out of manifests
    /// from now on. `witnesses` are the accusers, lowest index first.
    Slashed {
        member: u32,
        step: u32,
        witnesses: Vec<u32>,
        evidence: [u8; 32],
    },
}

/// One other member's link, as this node sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerLink {
    pub member: u32,
    /// The latest ping round trip; `None` before the first.
    pub rtt: Option<Duration>,
    /// Bytes received from it so far: gossip it forwarded, blobs it served.
    pub bytes_in: u64,
}

/// Counters a node keeps about its traffic.
#[derive(Debug, Clone, Default)]
pub struct NodeStats {
    pub dropped: BTreeMap<&'static str, u64>,
    pub accepted: u64,
    pub equivocations: u64,
    pub late: u64,
    pub superseded: u64,
    pub rewinds: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub applied: u32,
    pub model_hash: [u8; 32],
    /// Audits this node ran as a witness, and how many failed.
    pub audits: u64,
    pub audits_failed: u64,
    /// Compute spent on audits and on this node's own contributions.
    pub audit_secs: f64,
    pub compute_secs: f64,
    /// Members slashed by a quorum of accusations.
    pub slashed: BTreeSet<u32>,
    /// Manifests whose state hash was a lone leader's (`WrongStateHash`).
    pub wrong_state_hashes: u64,
    /// Manifest entries their member did not sign (`ForgedEntry`).
    pub forged_entries: u64,
}

impl NodeStats {
    fn drop(&mut self, d: Drop) {
        *self.dropped.entry(d.name()).or_default() += 1;
    }
    pub fn dropped(&self, d: Drop) -> u64 {
        self.dropped.get(d.name()).copied().unwrap_or(0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Setup(#[from] swarm::SetupError),
    #[error("{0}")]
    Config(String),
    #[error("training thread stopped: {0}")]
    Trainer(String),
}

enum ToTrainer {
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
        payloads: Vec<Vec<u8>>,
        last_produced_us: u64,
        same_history: bool,
    },
    /// What a member revealed of the momentum it committed to at `step`.
    Audit {
        step: u32,
        member: u32,
        outcome: Revealed,
    },
    /// A member was slashed: it no longer audits anyone.
    Slashed(u32),
}

/// The outcome of asking a member for a committed momentum.
#[derive(Clone)]
enum Revealed {
    /// The encoded momentum, matching its commitment.
    Momentum(Vec<u8>),
    /// A momentum that does not hash to the commitment: a lie.
    Lied,
    /// The member answered without it.
    Refused,
    /// The member could not be reached (it may have restarted honestly).
    Unreachable,
}

enum FromTrainer {
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
        snapshot: Arc<Vec<u8>>,
        event: NodeEvent,
        generation: u64,
    },
    /// A manifest listed bytes under `member`'s name that it did not sign.
    ForgedEntry {
        step: u32,
        leader: u32,
        member: u32,
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
    },
    Done {
        model_hash: [u8; 32],
        generation: u64,
    },
    Failed(String),
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The shared state as hashed in manifests and sent to joiners: the
/// trainer's snapshot, then the payload hashes of the last steps (what the
/// screen compares new payloads with), so a node that syncs screens each
/// later step exactly as the others do.
fn encode_state(mut trainer_snapshot: Vec<u8>, recent: &BTreeMap<u32, Vec<[u8; 32]>>) -> Vec<u8> {
    let start = trainer_snapshot.len();
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

type Recent = BTreeMap<u32, Vec<[u8; 32]>>;

fn decode_state(buf: &[u8]) -> Result<(&[u8], Recent), String> {
    let bad = || "malformed shared state".to_string();
    let n = buf.len().checked_sub(4).ok_or_else(bad)?;
    let trailer = u32::from_le_bytes(buf[n..].try_into().map_err(|_| bad())?) as usize;
    let start = n.checked_sub(trailer).ok_or_else(bad)?;
    let mut r = cohort_program::codec::Reader::new(&buf[start..n]);
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
    Ok((&buf[..start], recent))
}

/// Weight states a witness keeps to audit on (see [`Guard::weights_at`]).
/// Audits run while the trainer waits for manifests, so on a busy machine
/// one can trail its step by several applies.
const KEEP_WEIGHTS: usize = 8;

/// A contribution a witness audits: whose, the momentum commitment, and
/// the member's commitment at the step before when the chain is checked.
struct Target {
    member: u32,
    hash: [u8; 32],
    previous: Option<[u8; 32]>,
}

/// One side of an audit that is still downloading.
enum Wait<T> {
    Pending,
    Done(T),
}

/// A contribution drawn for audit, waiting for what its author reveals.
struct Awaited {
    c: Contribution,
    /// Whether the screen drew it (a refusal then fails the audit).
    targeted: bool,
    own: Wait<Revealed>,
    /// The momentum committed at the step before, for the chain check.
    previous: Option<Wait<Revealed>>,
}

/// The training thread's side of proof of contribution: the screen's
/// memory, and a witness's pending audits.
struct Guard {
    cfg: AuditConfig,
    witness: bool,
    witnesses: Vec<u32>,
    /// Payload hashes applied per step: the screen's memory of recent steps.
    recent: Recent,
    /// Weights after s updates, for the last few s (witnesses only). The
    /// node computes step t on the weights after t-1 updates (pipelining),
    /// so that is what an audit of step t recomputes on.
    weights_at: BTreeMap<u32, ParamSet>,
    /// Contributions drawn for audit, waiting for their momenta.
    awaiting: BTreeMap<(u32, u32), Awaited>,
    /// Each member's momentum commitment per recent step (witnesses only):
    /// what a chain check fetches the previous momentum against.
    commitments: BTreeMap<u32, BTreeMap<u32, [u8; 32]>>,
}

impl Guard {
    fn remember(&mut self, t: &Trainer) {
        if !self.witness {
            return;
        }
        // Anything kept past this step belongs to an abandoned history.
        self.weights_at.retain(|s, _| *s < t.step());
        self.awaiting.retain(|(s, _), _| *s < t.step());
        self.commitments.retain(|s, _| *s < t.step());
        self.weights_at.insert(t.step(), t.params().clone());
        // A pending audit pins the weights it recomputes on: a witness that
        // falls behind audits late, it never drops the audit.
        let pinned = self.pinned();
        while self.weights_at.len() > KEEP_WEIGHTS {
            let Some(old) = self
                .weights_at
                .keys()
                .find(|s| !pinned.contains(s))
                .copied()
            else {
                break;
            };
            if Some(&old) == self.weights_at.keys().next_back() {
                break;
            }
            self.weights_at.remove(&old);
        }
    }

    /// Weight states that audits still waiting for momenta will recompute
    /// on: the step before each, and the one before that for a chain check.
    fn pinned(&self) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for ((step, _), a) in &self.awaiting {
            out.insert(step.saturating_sub(1));
            if a.previous.is_some() {
                out.insert(step.saturating_sub(2));
            }
        }
        out
    }

    /// Screens step `step`'s contributions (identically on every node) and
    /// remembers their hashes for the steps that follow.
    fn screen(
        &mut self,
        layout: &crate::compress::Layout,
        step: u32,
        cs: &[Contribution],
    ) -> StepScreen {
        let window: Vec<[u8; 32]> = self
            .recent
            .range(step.saturating_sub(audit::RECENT_STEPS)..step)
            .flat_map(|(_, h)| h.iter().copied())
            .collect();
        let refs: Vec<&Payload> = cs.iter().map(|c| &c.payload).collect();
        let verdict = audit::screen_step(layout, &refs, &window, &self.cfg);
        self.recent.insert(step, verdict.hashes.clone());
        self.recent
            .retain(|s, _| *s + audit::RECENT_STEPS > step && *s <= step);
        verdict
    }

    /// The contributions of `step` this witness audits: every one the
    /// screen flagged, and the others with probability `rate`, drawn from
    /// the manifest id (known only once the step is over).
    fn draw(
        &mut self,
        me: u32,
        manifest: &Manifest,
        members: &[u32],
        cs: &[Contribution],
        verdict: &StepScreen,
    ) -> Vec<Target> {
        if !self.witness {
            return Vec::new();
        }
        let step = manifest.step;
        self.commitments.insert(
            step,
            members
                .iter()
                .zip(cs)
                .map(|(m, c)| (*m, c.momentum_hash))
                .collect(),
        );
        while self.commitments.len() > KEEP_WEIGHTS {
            self.commitments.pop_first();
        }
        let reveal = manifest.id();
        let mut out = Vec::new();
        for ((member, c), screen) in members.iter().zip(cs).zip(&verdict.screens) {
            let targeted = screen.flagged(&self.cfg);
            if *member == me
                || !(targeted || audit::sampled(&reveal, step, *member, self.cfg.rate))
                || !self.designated(me, &reveal, *member)
            {
                continue;
            }
            // A flagged payload that recomputes correctly may rest on a
            // forged momentum: check that it follows from the last one.
            let chained = targeted || audit::sampled(&reveal, step, *member, self.cfg.chain_rate);
            let previous = step
                .checked_sub(1)
                .filter(|_| chained)
                .and_then(|s| self.commitments.get(&s)?.get(member).copied());
            self.awaiting.insert(
                (step, *member),
                Awaited {
                    c: c.clone(),
                    targeted,
                    own: Wait::Pending,
                    previous: previous.map(|_| Wait::Pending),
                },
            );
            out.push(Target {
                member: *member,
                hash: c.momentum_hash,
                previous,
            });
        }
        out
    }

    /// A momentum came in: it completes the audit of its own step and/or
    /// the chain check of the step after. Returns the audits now decided.
    fn revealed(
        &mut self,
        trainer: &mut Trainer,
        cfg: &NodeConfig,
        step: u32,
        member: u32,
        outcome: Revealed,
    ) -> Result<Vec<(u32, u32, Option<AuditReport>)>, String> {
        // Only flagged payloads chain, so the copy is rare.
        if let Some(a) = self.awaiting.get_mut(&(step + 1, member))
            && matches!(a.previous, Some(Wait::Pending))
        {
            a.previous = Some(Wait::Done(outcome.clone()));
        }
        if let Some(a) = self.awaiting.get_mut(&(step, member))
            && matches!(a.own, Wait::Pending)
        {
            a.own = Wait::Done(outcome);
        }
        let mut out = Vec::new();
        for key in [(step, member), (step + 1, member)] {
            let ready = self.awaiting.get(&key).is_some_and(|a| {
                matches!(a.own, Wait::Done(_)) && !matches!(a.previous, Some(Wait::Pending))
            });
            if ready && let Some(a) = self.awaiting.remove(&key) {
                out.push((key.0, key.1, self.audit(trainer, cfg, key.0, key.1, a)?));
            }
        }
        // An audit abandoned with its history (a rewind) is settled too, so
        // the network side does not wait for it.
        if !self.awaiting.contains_key(&(step, member))
            && !out.iter().any(|d| (d.0, d.1) == (step, member))
        {
            out.push((step, member, None));
        }
        Ok(out)
    }

    /// Whether `me` is one of the `quorum` witnesses, drawn from `reveal`,
    /// that audit `member`'s contribution: enough to slash it if all of
    /// them fail it, without every witness paying for every audit.
    fn designated(&self, me: u32, reveal: &[u8; 32], member: u32) -> bool {
        let eligible: Vec<u32> = self
            .witnesses
            .iter()
            .copied()
            .filter(|w| *w != member)
            .collect();
        let Some(pos) = eligible.iter().position(|w| *w == me) else {
            return false;
        };
        let n = eligible.len();
        let mut h = blake3::Hasher::new();
        h.update(b"cohort-auditors-v1");
        h.update(reveal);
        h.update(&member.to_le_bytes());
        let d = h.finalize();
        let start = u64::from_le_bytes(d.as_bytes()[..8].try_into().unwrap_or([0; 8])) as usize % n;
        (pos + n - start) % n < self.cfg.quorum.max(1)
    }

    /// Runs one audit once its momenta are in (or known to be withheld).
    /// None when there is nothing to decide: the weights are no longer
    /// kept, or the member could not be reached (it may have restarted), or
    /// a randomly drawn member refused (a withheld momentum only counts
    /// against a flagged payload).
    fn audit(
        &mut self,
        trainer: &mut Trainer,
        cfg: &NodeConfig,
        step: u32,
        member: u32,
        a: Awaited,
    ) -> Result<Option<AuditReport>, String> {
        let Awaited {
            c,
            targeted,
            own,
            previous,
        } = a;
        let Wait::Done(own) = own else {
            return Ok(None);
        };
        let Some(weights) = self.weights_at.get(&step.saturating_sub(1)) else {
            eprintln!(
                "member {}: audit of member {member} at step {step} skipped: its weights are no longer kept",
                cfg.me
            );
            return Ok(None);
        };
        let evidence = audit::evidence_id(
            &cfg.job,
            cfg.epoch,
            step,
            member,
            &audit::payload_hash(&c.payload),
        );
        let withheld = AuditReport {
            step,
            member,
            passed: false,
            targeted,
            comparison: None,
            chain_error: None,
            secs: 0.0,
            evidence,
        };
        let revealed = match own {
            Revealed::Momentum(m) => audit::decode_momentum(&m, trainer.momentum()),
            Revealed::Unreachable => return Ok(None),
            Revealed::Refused if !targeted => return Ok(None),
            Revealed::Lied | Revealed::Refused => None,
        };
        let Some(revealed) = revealed else {
            return Ok(Some(withheld));
        };
        let t0 = Instant::now();
        let (reference, _) = trainer
            .replay_on(weights, &cfg.seed, cfg.epoch, step, member, &revealed)
            .map_err(|e| e.to_string())?;
        let cmp = audit::compare(trainer.layout(), &c.payload, &reference);
        let mut report = AuditReport {
            passed: cmp.passes(&self.cfg),
            comparison: Some(cmp),
            ..withheld
        };
        // The chain: replay the step before from the momentum committed
        // then, on the weights it was computed on; this one must follow.
        let before = step.wrapping_sub(1);
        let chain_weights = self.weights_at.get(&before.saturating_sub(1));
        match (report.passed, previous, chain_weights) {
            (true, Some(Wait::Done(Revealed::Momentum(m))), Some(w)) => {
                if let Some(prev) = audit::decode_momentum(&m, trainer.momentum()) {
                    let (_, expected) = trainer
                        .replay_on(w, &cfg.seed, cfg.epoch, before, member, &prev)
                        .map_err(|e| e.to_string())?;
                    let err = audit::chain_error(&revealed, &expected);
                    report.chain_error = Some(err);
                    report.passed = err <= self.cfg.max_chain_error;
                }
            }
            // Lying about, or withholding, a signed commitment of a flagged
            // payload's history is as bad as withholding its own: the chain
            // cannot be followed.
            (true, Some(Wait::Done(Revealed::Lied | Revealed::Refused)), _) => {
                report.chain_error = Some(f32::INFINITY);
                report.passed = false;
            }
            _ => {}
        }
        report.secs = t0.elapsed().as_secs_f64();
        Ok(Some(report))
    }
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
            let (_, g) = trainer.member_gradients(&cfg.seed, cfg.epoch, step, trainer.id.index)?;
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
                payload,
            },
            stats,
            forged,
        ))
    }
}

/// The training side: compute step t+1 while step t is exchanged.
fn train_loop(
    cfg: NodeConfig,
    mut trainer: Trainer,
    rx: std_mpsc::Receiver<ToTrainer>,
    tx: mpsc::UnboundedSender<FromTrainer>,
) -> Result<(), String> {
    let signer = msg::keypair(&cfg.secret);
    let layout = trainer.layout().clone();
    let send = |m: FromTrainer| tx.send(m).map_err(|_| "network task gone".to_string());
    let mut guard = Guard {
        cfg: cfg.defence.audit,
        witness: cfg.defence.witnesses.contains(&cfg.me),
        witnesses: cfg.defence.witnesses.clone(),
        recent: BTreeMap::new(),
        weights_at: BTreeMap::new(),
        awaiting: BTreeMap::new(),
        commitments: BTreeMap::new(),
    };
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
    // Loads a shared state (trainer snapshot and the screen's memory).
    let load_state = |trainer: &mut Trainer, guard: &mut Guard, bytes: &[u8]| {
        let (snapshot, recent) = decode_state(bytes)?;
        trainer.load_snapshot(snapshot).map_err(|e| e.to_string())?;
        guard.recent = recent;
        guard.remember(trainer);
        Ok::<(), String>(())
    };
    loop {
        match rx.recv().map_err(|_| "network task gone".to_string())? {
            ToTrainer::Start => break,
            ToTrainer::Snapshot {
                bytes,
                generation: g,
            } if syncing => {
                load_state(&mut trainer, &mut guard, &bytes)?;
                generation = g;
                send(FromTrainer::Synced {
                    step: trainer.step(),
                    resumed,
                })?;
                break;
            }
            _ => {}
        }
    }
    guard.remember(&trainer);
    let publish_state = |t: &Trainer, guard: &Guard| {
        let snapshot = Arc::new(encode_state(t.snapshot(), &guard.recent));
        let state_hash = *blake3::hash(&snapshot).as_bytes();
        (state_hash, snapshot)
    };
    // The state hash of the current weights, kept so each step encodes and
    // hashes the full state once (it is checked against the next manifest).
    let (mut current_hash, snap) = publish_state(&trainer, &guard);
    send(FromTrainer::Applied {
        step: trainer.step(),
        state_hash: current_hash,
        snapshot: snap,
        event: NodeEvent::Synced {
            step: trainer.step(),
            resumed,
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
     -> Result<[u8; 32], String> {
        load_state(trainer, guard, bytes)?;
        *next_compute = (*next_compute).max(trainer.step() + 1);
        let (hash, snapshot) = publish_state(trainer, guard);
        send(FromTrainer::Applied {
            step: trainer.step(),
            state_hash: hash,
            snapshot,
            event: NodeEvent::Rewound {
                step: trainer.step(),
            },
            generation,
        })?;
        Ok(hash)
    };
    let audit =
        |trainer: &mut Trainer, guard: &mut Guard, step: u32, member: u32, outcome: Revealed| {
            for (step, member, report) in guard.revealed(trainer, &cfg, step, member, outcome)? {
                send(FromTrainer::AuditDone {
                    step,
                    member,
                    report,
                })?;
            }
            Ok::<(), String>(())
        };
    loop {
        while trainer.step() < cfg.steps {
            if next_compute < cfg.steps
                && next_compute <= trainer.step() + 1
                && cfg.pause.load(Ordering::Relaxed)
            {
                // Skipped, not postponed: a contribution for a step already
                // being exchanged would only arrive late.
                next_compute += 1;
                continue;
            }
            if next_compute < cfg.steps && next_compute <= trainer.step() + 1 {
                let before = audit::encode_momentum(trainer.momentum());
                let (c, stats, forged) = match cfg.defence.adversary {
                    None => trainer
                        .compute_step(&cfg.seed, cfg.epoch, next_compute)
                        .map(|(c, s)| (c, s, None)),
                    Some(mode) => attacker.contribute(&mut trainer, &cfg, mode, next_compute),
                }
                .map_err(|e| e.to_string())?;
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
                    len: bytes.len() as u32,
                    produced_us: now_us(),
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
                        payloads,
                        last_produced_us,
                        same_history,
                    } if manifest.step == trainer.step() => {
                        break Some((manifest, payloads, last_produced_us, same_history));
                    }
                    ToTrainer::Snapshot {
                        bytes,
                        generation: g,
                    } => {
                        current_hash =
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
                    ToTrainer::Slashed(m) => guard.witnesses.retain(|w| *w != m),
                    _ => {}
                }
            };
            let Some((manifest, payloads, last_produced_us, same_history)) = next else {
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
            // Payloads that do not decode (or are not the member's for this
            // step) are skipped; every node holds the same bytes for a
            // manifest, so every node skips the same ones.
            let mut contributions = Vec::with_capacity(payloads.len());
            let mut contributors = Vec::with_capacity(payloads.len());
            for ((member, _), bytes) in manifest.entries.iter().zip(&payloads) {
                let Some(key) = cfg.members.get(*member as usize) else {
                    continue;
                };
                match Contribution::decode_signed(bytes, &layout) {
                    Ok(c) if c.member == *key && c.step == manifest.step && c.job == cfg.job => {
                        contributions.push(c);
                        contributors.push(*member);
                    }
                    // Bytes listed under a member's name that the member did
                    // not sign: the leader's doing, never the member's.
                    Err(EngineError::Signature) if *member != manifest.leader => {
                        send(FromTrainer::ForgedEntry {
                            step: manifest.step,
                            leader: manifest.leader,
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
            let targets = guard.draw(cfg.me, &manifest, &contributors, &contributions, &verdict);
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
            let (state_hash, snapshot) = publish_state(&trainer, &guard);
            current_hash = state_hash;
            send(FromTrainer::Applied {
                step: trainer.step(),
                state_hash,
                snapshot,
                event: NodeEvent::Applied {
                    step: manifest.step,
                    model_hash: trainer.model_hash(),
                    contributors,
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
                    current_hash = load(&mut trainer, &mut guard, &bytes, g, &mut next_compute)?;
                    generation = g;
                    break;
                }
                Ok(ToTrainer::Audit {
                    step,
                    member,
                    outcome,
                }) => audit(&mut trainer, &mut guard, step, member, outcome)?,
                Ok(_) => {}
            }
        }
    }
}

enum Pending {
    Payload([u8; 32]),
    Manifest,
    Backfill { step: u32, tries: u32 },
    Snapshot { step: u32, peer: PeerId },
    Momentum { step: u32, member: u32 },
    Cosign { round: u64, member: u32 },
}

/// A momentum being downloaded for an audit.
struct Reveal {
    /// What the member's contribution committed to.
    hash: [u8; 32],
    buf: Vec<u8>,
    tries: u32,
    /// When the download began: a member that cannot be reached is asked
    /// again until [`AUDIT_PATIENCE`] has passed.
    since: Instant,
    /// When to ask again after an unreachable try.
    retry_at: Option<Instant>,
    /// The member answered at least once without the momentum.
    refused: bool,
}

/// Co-signatures being gathered for the application.
struct CosignRound {
    waiting: BTreeSet<u32>,
    got: Vec<(u32, [u8; 64])>,
    reply: oneshot::Sender<Vec<(u32, [u8; 64])>>,
    deadline: Instant,
}

/// A shared-state download in progress.
struct Download {
    step: u32,
    /// What the step's manifest says the state hashes to.
    state_hash: [u8; 32],
    buf: Vec<u8>,
    from: u32,
    /// The manifest's history id: this node's history base once loaded.
    parent: [u8; 32],
}

/// The network side: owns the swarm and the step machine.
struct Net {
    /// Per connected peer: latest round trip and bytes received.
    links: HashMap<PeerId, (Option<Duration>, u64)>,
    cfg: NodeConfig,
    key: ed25519::Keypair,
    swarm: Swarm<Behaviour>,
    topic: IdentTopic,
    machine: StepMachine,
    /// Who is wrong when a manifest's state hash is not ours.
    divergence: DivergenceVote,
    peers: Vec<Option<PeerId>>,
    started: Instant,
    payloads: HashMap<[u8; 32], Vec<u8>>,
    manifests_raw: BTreeMap<u32, Vec<u8>>,
    /// Events raised by the network side (backfill), drained by `run`.
    events: Vec<NodeEvent>,
    snapshots: BTreeMap<u32, Arc<Vec<u8>>>,
    pending: HashMap<OutboundRequestId, Pending>,
    heartbeat_seq: BTreeMap<[u8; 32], u64>,
    seq: u64,
    applied: u32,
    next_contribution: u32,
    syncing: bool,
    sync_buf: Option<Download>,
    /// Rewinds so far; trainer messages from before the latest are stale.
    generation: u64,
    sync_requested: Option<Instant>,
    subscribed: std::collections::BTreeSet<PeerId>,
    to_trainer: std_mpsc::Sender<ToTrainer>,
    unpublished: Vec<Vec<u8>>,
    stats: NodeStats,
    /// `COHORT_NET_DEBUG` set: log every protocol action to stderr.
    debug: bool,
    done: Option<Instant>,
    peers_done: std::collections::BTreeSet<u32>,
    /// This member's momentum before each of its recent contributions:
    /// what it reveals when audited.
    momenta: BTreeMap<u32, Arc<Vec<u8>>>,
    /// Momentum downloads for audits: (step, member) → progress.
    reveals: BTreeMap<(u32, u32), Reveal>,
    /// Accusations heard: accused → witness → evidence.
    accusations: BTreeMap<u32, BTreeMap<u32, [u8; 32]>>,
    /// Members this node accused: the only ones it co-signs reports on.
    accused_by_me: BTreeSet<u32>,
    cosigns: HashMap<u64, CosignRound>,
    next_round: u64,
    /// Convictions whose on-chain report needs this node, so it does not
    /// leave while they are open: as the lead accuser until the application
    /// settles it, as a co-signer until a little after it signed (room for a
    /// retry with a fresh blockhash). Member → when it may stop waiting.
    owed_reports: BTreeMap<u32, Option<Instant>>,
    /// Whether an application drives reports through [`Control`].
    reports: bool,
    /// Audits this witness drew and has not decided yet: it does not
    /// leave while any is open (up to [`AUDIT_PATIENCE`] after its last
    /// step), so a slow witness still audits instead of dropping it.
    auditing: BTreeSet<(u32, u32)>,
    /// Peers whose latest heartbeat says they still audit: their audits
    /// may need this node's momentum or count its accusation, so a
    /// finished node stays for them too (never past [`AUDIT_PATIENCE`]).
    peers_auditing: BTreeSet<u32>,
}

/// How long a node that finished its steps stays for its open audits and
/// for live peers still training or auditing, and how long a witness keeps
/// asking a member it cannot reach for a momentum.
const AUDIT_PATIENCE: Duration = Duration::from_secs(60);

impl Net {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Gossips `raw`; with no subscribed peer yet it is kept for the next
    /// tick.
    fn publish(&mut self, raw: Vec<u8>) {
        if self
            .swarm
            .behaviour_mut()
            .gossip
            .publish(self.topic.clone(), raw.clone())
            .is_ok()
        {
            self.stats.bytes_out += raw.len() as u64;
        } else {
            self.unpublished.push(raw);
        }
    }

    /// What a lying leader does to its manifest before signing it: states
    /// a state hash that is not the state's, and lists under another
    /// member's name a copy of that member's payload with one byte changed
    /// (served by the leader itself).
    fn lie(&mut self, m: &mut Manifest) {
        m.state_hash = *blake3::hash(&m.state_hash).as_bytes();
        let me = self.cfg.me;
        if let Some(entry) = m.entries.iter_mut().find(|(who, _)| *who != me)
            && let Some(real) = self.payloads.get(&entry.1)
        {
            let mut forged = real.clone();
            let at = forged.len().saturating_sub(crate::wire::SIGNATURE_LEN + 1);
            if let Some(b) = forged.get_mut(at) {
                *b ^= 1;
            }
            let hash = *blake3::hash(&forged).as_bytes();
            self.payloads.insert(hash, forged);
            // Held in the machine too, or `prune` drops the bytes and the
            // manifest becomes unservable (and is replaced) before anyone
            // sees the forgery.
            self.machine.on_payload(hash);
            entry.1 = hash;
        }
    }

    fn retry_unpublished(&mut self) {
        for raw in std::mem::take(&mut self.unpublished) {
            self.publish(raw);
        }
    }

    /// Checks membership, job and replay; the signature was checked by
    /// [`msg::open`].
    /// The checks that need no signature: job, membership, the node's own
    /// messages coming back, and the step window. They run before the
    /// signature is verified, so floods by outsiders cost no curve maths.
    fn pre_admit(&self, body: &Body, signer: &[u8; 32]) -> Result<(), Drop> {
        if *body.job() != self.cfg.job {
            return Err(Drop::WrongJob);
        }
        if self.cfg.members.get(body.member() as usize) != Some(signer) {
            return Err(Drop::NotMember);
        }
        // Gossip never hands a node its own messages: one coming back was
        // re-published by someone else.
        if body.member() == self.cfg.me {
            return Err(Drop::Replayed);
        }
        let step = match body {
            Body::Announce(a) => Some(a.step),
            Body::Manifest(m) => Some(m.step),
            _ => None,
        };
        if step.is_some_and(|s| !self.machine.in_window(s)) {
            return Err(Drop::OutOfWindow);
        }
        Ok(())
    }

    /// What needs the signature checked first: heartbeat sequence numbers.
    fn admit(&mut self, s: &Signed) -> Result<(), Drop> {
        if let Body::Heartbeat(h) = &s.body {
            if h.epoch != self.cfg.epoch {
                return Err(Drop::WrongJob);
            }
            let last = self.heartbeat_seq.entry(s.signer).or_insert(0);
            if h.seq <= *last {
                return Err(Drop::Replayed);
            }
            *last = h.seq;
        }
        Ok(())
    }

    fn on_gossip(&mut self, raw: &[u8]) -> MessageAcceptance {
        self.stats.bytes_in += raw.len() as u64;
        let opened = msg::open_checked(raw, |b, k| self.pre_admit(b, k));
        let signed = match opened.and_then(|s| self.admit(&s).map(|_| s)) {
            Ok(s) => s,
            Err(d) => {
                self.stats.drop(d);
                // A lagging honest member may still speak of steps past
                // this node's window: ignored, not held against it.
                return if d == Drop::OutOfWindow {
                    MessageAcceptance::Ignore
                } else {
                    MessageAcceptance::Reject
                };
            }
        };
        let now = self.now();
        self.machine.on_alive(now, signed.body.member());
        match signed.body {
            Body::Announce(a) => match self.machine.on_announce(now, &a) {
                Verdict::Accepted => self.stats.accepted += 1,
                Verdict::Duplicate => {
                    self.stats.drop(Drop::Replayed);
                    return MessageAcceptance::Reject;
                }
                Verdict::Equivocation => {
                    self.stats.equivocations += 1;
                    return MessageAcceptance::Reject;
                }
                Verdict::TooFar => {
                    self.stats.drop(Drop::OutOfWindow);
                    return MessageAcceptance::Ignore;
                }
                _ => self.stats.late += 1,
            },
            Body::Manifest(m) => return self.on_manifest(m, signed.raw),
            Body::Heartbeat(h) => {
                self.stats.accepted += 1;
                // Done, and auditing nobody: a witness that still audits
                // may yet ask this node for a momentum.
                if h.applied >= self.cfg.steps && h.auditing == 0 {
                    self.peers_done.insert(h.member);
                } else {
                    self.peers_done.remove(&h.member);
                }
                if h.auditing > 0 {
                    self.peers_auditing.insert(h.member);
                } else {
                    self.peers_auditing.remove(&h.member);
                }
                self.machine.on_ready(h.member, h.ready_from);
            }
            Body::Accuse(a) => return self.on_accuse(&a),
        }
        MessageAcceptance::Accept
    }

    fn on_manifest(&mut self, m: Manifest, raw: Vec<u8>) -> MessageAcceptance {
        let step = m.step;
        let leader = m.leader;
        match self.machine.on_manifest(self.now(), m) {
            Verdict::Accepted => {
                self.stats.accepted += 1;
                self.manifests_raw.insert(step, raw);
                if self.syncing {
                    self.request_snapshot(step, leader);
                }
                MessageAcceptance::Accept
            }
            Verdict::Duplicate => {
                self.stats.drop(Drop::Replayed);
                MessageAcceptance::Reject
            }
            Verdict::WrongLeader => {
                self.stats.drop(Drop::WrongLeader);
                MessageAcceptance::Reject
            }
            Verdict::Equivocation => {
                self.stats.equivocations += 1;
                MessageAcceptance::Reject
            }
            Verdict::Superseded => {
                self.stats.superseded += 1;
                MessageAcceptance::Accept
            }
            Verdict::Rewind => {
                self.manifests_raw.insert(step, raw);
                self.rewind(step);
                MessageAcceptance::Accept
            }
            Verdict::Stale => {
                self.stats.late += 1;
                MessageAcceptance::Ignore
            }
            Verdict::TooFar => {
                self.stats.drop(Drop::OutOfWindow);
                MessageAcceptance::Ignore
            }
        }
    }

    /// Goes back to the state before `step`: this node's own, if still
    /// kept, else a fresh download of the latest state from a peer.
    fn rewind(&mut self, step: u32) {
        self.stats.rewinds += 1;
        self.generation += 1;
        // States after `step` are from the abandoned history.
        self.snapshots.retain(|&s, _| s <= step);
        self.done = None;
        match self.snapshots.get(&step) {
            Some(snap) => {
                self.applied = step;
                let _ = self.to_trainer.send(ToTrainer::Snapshot {
                    bytes: snap.to_vec(),
                    generation: self.generation,
                });
            }
            None => {
                self.machine.unsync();
                self.syncing = true;
                self.sync_buf = None;
                self.sync_requested = None;
            }
        }
    }

    /// A backfilled manifest must be for this job, epoch and step, signed by
    /// the member who led it at its attempt. Our own manifests (from before
    /// a restart) count too, which gossip admission would refuse.
    fn check_backfill(&self, step: u32, raw: &[u8]) -> Option<Vec<u32>> {
        let s = msg::open(raw).ok()?;
        let Body::Manifest(m) = s.body else {
            return None;
        };
        let ok = m.job == self.cfg.job
            && m.epoch == self.cfg.epoch
            && m.step == step
            && (m.attempt as u32) < self.machine.members()
            && self.machine.leader(step, m.attempt) == m.leader
            && self.cfg.members.get(m.leader as usize) == Some(&s.signer);
        ok.then(|| m.entries.iter().map(|e| e.0).collect())
    }

    /// Asks member `step + tries` (skipping ourselves) for a missed manifest.
    fn ask_backfill(&mut self, step: u32, tries: u32) {
        let n = self.cfg.members.len() as u32;
        if tries >= n {
            return;
        }
        let mut from = (step + tries) % n;
        if from == self.cfg.me {
            from = (from + 1) % n;
        }
        self.ask(
            from,
            Request::Manifest { step },
            Pending::Backfill { step, tries },
        );
    }

    /// Sends `req` to member `member` and remembers what it was for; false
    /// when that member's peer id is unknown.
    fn ask(&mut self, member: u32, req: Request, what: Pending) -> bool {
        let Some(Some(peer)) = self.peers.get(member as usize).copied() else {
            return false;
        };
        let id = self.swarm.behaviour_mut().blobs.send_request(&peer, req);
        self.pending.insert(id, what);
        true
    }

    fn request_snapshot(&mut self, step: u32, from: u32) {
        let fresh = self
            .sync_requested
            .is_none_or(|t| t.elapsed() > Duration::from_secs(5));
        if !fresh || from == self.cfg.me {
            return;
        }
        let Some(Some(peer)) = self.peers.get(from as usize).copied() else {
            return;
        };
        let Some(m) = self.machine.manifest(step) else {
            return;
        };
        self.sync_buf = Some(Download {
            step,
            state_hash: m.state_hash,
            buf: Vec::new(),
            from,
            parent: m.parent,
        });
        self.sync_requested = Some(Instant::now());
        let id = self
            .swarm
            .behaviour_mut()
            .blobs
            .send_request(&peer, Request::Snapshot { step, offset: 0 });
        self.pending.insert(id, Pending::Snapshot { step, peer });
    }

    /// Answers members only: snapshots, momenta and co-signatures are for
    /// the job's members, and an outsider's requests cost nothing but this
    /// check.
    fn serve(&mut self, from: &PeerId, req: Request) -> Response {
        if !self.peers.contains(&Some(*from)) {
            self.stats.drop(Drop::NotMember);
            return Response::NotFound;
        }
        match req {
            Request::Payload(h) => self
                .payloads
                .get(&h)
                .map_or(Response::NotFound, |b| Response::Payload(b.clone())),
            Request::Manifest { step } => self
                .manifests_raw
                .get(&step)
                .map_or(Response::NotFound, |b| Response::Manifest(b.clone())),
            Request::Snapshot { step, offset } => chunk_of(self.snapshots.get(&step), offset),
            Request::Momentum { step, offset } => chunk_of(self.momenta.get(&step), offset),
            Request::Cosign(message) => {
                let accused: Vec<[u8; 32]> = self
                    .accused_by_me
                    .iter()
                    .filter_map(|m| self.cfg.members.get(*m as usize).copied())
                    .collect();
                let agrees = self
                    .cfg
                    .defence
                    .cosigner
                    .as_ref()
                    .is_some_and(|c| !accused.is_empty() && (c.0)(&message, &accused));
                if agrees {
                    let until = Instant::now() + Duration::from_secs(5);
                    for (m, t) in self.owed_reports.iter_mut() {
                        if self.accused_by_me.contains(m) {
                            *t = Some(until);
                        }
                    }
                }
                match self.key.sign(&message).try_into() {
                    Ok(sig) if agrees => Response::Signature(sig),
                    _ => Response::NotFound,
                }
            }
        }
    }

    /// Starts downloading the momentum `member` committed to (`hash`) at
    /// `step`, unless that download is already under way.
    fn fetch_momentum(&mut self, step: u32, member: u32, hash: [u8; 32]) {
        if self.reveals.contains_key(&(step, member)) {
            return;
        }
        let r = Reveal {
            hash,
            buf: Vec::new(),
            tries: 0,
            since: Instant::now(),
            retry_at: None,
            refused: false,
        };
        self.reveals.insert((step, member), r);
        self.ask_momentum(step, member, 0);
    }

    /// Asks `member` for (the rest of) the momentum behind its contribution
    /// to `step`.
    fn ask_momentum(&mut self, step: u32, member: u32, offset: u32) {
        let req = Request::Momentum { step, offset };
        if !self.ask(member, req, Pending::Momentum { step, member }) {
            self.reveal_failed(step, member, false);
        }
    }

    /// A momentum request failed: try again from the start, up to 3 times,
    /// then give up. Only a member that answered and refused (or sent
    /// nonsense) withheld it; one we could not reach may have gone away
    /// honestly, so its audit is dropped.
    fn reveal_failed(&mut self, step: u32, member: u32, answered: bool) {
        let Some(r) = self.reveals.get_mut(&(step, member)) else {
            return;
        };
        r.tries += 1;
        r.refused |= answered;
        if self.debug {
            eprintln!(
                "[{}] momentum of {member} for step {step}: try {} failed (answered: {answered})",
                self.cfg.me, r.tries
            );
        }
        r.buf.clear();
        // Unreachable is not a refusal: a busy or restarting member gets
        // time (a cheat gains nothing by going quiet, the audit waits).
        if !answered && !r.refused && r.since.elapsed() < AUDIT_PATIENCE {
            r.retry_at = Some(Instant::now() + Duration::from_secs(r.tries.min(5) as u64));
            return;
        }
        if r.tries < 3 {
            let req = Request::Momentum { step, offset: 0 };
            if self.ask(member, req, Pending::Momentum { step, member }) {
                return;
            }
        }
        if let Some(r) = self.reveals.remove(&(step, member)) {
            let outcome = if r.refused {
                Revealed::Refused
            } else {
                Revealed::Unreachable
            };
            let _ = self.to_trainer.send(ToTrainer::Audit {
                step,
                member,
                outcome,
            });
        }
    }

    /// Asks again for the momenta whose last try found the member
    /// unreachable, once their wait is over.
    fn retry_reveals(&mut self) {
        let now = Instant::now();
        let due: Vec<(u32, u32)> = self
            .reveals
            .iter_mut()
            .filter(|(_, r)| r.retry_at.is_some_and(|t| t <= now))
            .map(|(k, r)| {
                r.retry_at = None;
                *k
            })
            .collect();
        for (step, member) in due {
            self.ask_momentum(step, member, 0);
        }
    }

    fn on_momentum_chunk(
        &mut self,
        step: u32,
        member: u32,
        total: u32,
        offset: u32,
        chunk: Vec<u8>,
    ) {
        let Some(r) = self.reveals.get_mut(&(step, member)) else {
            return;
        };
        if offset as usize != r.buf.len() || total as usize > 1 << 30 {
            self.stats.drop(Drop::BadBlob);
            self.reveal_failed(step, member, true);
            return;
        }
        r.buf.extend_from_slice(&chunk);
        if r.buf.len() < total as usize && !chunk.is_empty() {
            let next = r.buf.len() as u32;
            self.ask_momentum(step, member, next);
            return;
        }
        let Some(r) = self.reveals.remove(&(step, member)) else {
            return;
        };
        // A momentum that does not hash to what the member signed is a lie,
        // not a transfer error: the blob protocol already framed it whole.
        let outcome = if audit::momentum_hash_bytes(&r.buf) == r.hash {
            Revealed::Momentum(r.buf)
        } else {
            Revealed::Lied
        };
        let _ = self.to_trainer.send(ToTrainer::Audit {
            step,
            member,
            outcome,
        });
    }

    /// This witness's audit of `report.member` failed: tell everyone.
    fn accuse(&mut self, report: &AuditReport) {
        let bp = |x: f32| (x.clamp(0.0, 1.0) * 10_000.0).round() as u16;
        let a = Accuse {
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            step: report.step,
            accused: report.member,
            witness: self.cfg.me,
            evidence: report.evidence,
            overlap: report.comparison.map_or(0, |c| bp(c.overlap)),
            agreement: report.comparison.map_or(0, |c| bp(c.agreement)),
        };
        self.accused_by_me.insert(report.member);
        self.publish(msg::sign(&Body::Accuse(a.clone()), &self.key));
        self.on_accuse(&a);
    }

    /// Counts an accusation; a quorum of the epoch's witnesses slashes.
    fn on_accuse(&mut self, a: &Accuse) -> MessageAcceptance {
        let n = self.cfg.members.len() as u32;
        if a.epoch != self.cfg.epoch
            || a.accused >= n
            || !self.cfg.defence.witnesses.contains(&a.witness)
        {
            self.stats.drop(Drop::NotMember);
            return MessageAcceptance::Reject;
        }
        let by = self.accusations.entry(a.accused).or_default();
        by.entry(a.witness).or_insert(a.evidence);
        // A slashed witness's word no longer counts (nor can it sign on chain).
        let machine = &self.machine;
        let witnesses: Vec<u32> = by
            .keys()
            .copied()
            .filter(|w| !machine.is_slashed(*w))
            .collect();
        let quorum = self.cfg.defence.audit.quorum.max(1);
        if witnesses.len() >= quorum && !self.machine.is_slashed(a.accused) {
            self.machine.slash(a.accused);
            self.stats.slashed.insert(a.accused);
            // Its open audits are moot now: nobody waits for them.
            let accused = a.accused;
            self.auditing.retain(|(_, m)| *m != accused);
            self.reveals.retain(|(_, m), _| *m != accused);
            // Only the first `quorum` accusers sign the report; the first
            // of them sends it.
            let signers = &witnesses[..quorum];
            let me = self.cfg.me;
            let owes = if signers.first() == Some(&me) {
                self.reports
            } else {
                signers.contains(&me) && self.cfg.defence.cosigner.is_some()
            };
            if owes {
                self.owed_reports.insert(a.accused, None);
            }
            let _ = self.to_trainer.send(ToTrainer::Slashed(a.accused));
            self.events.push(NodeEvent::Slashed {
                member: a.accused,
                step: a.step,
                witnesses,
                evidence: a.evidence,
            });
        }
        MessageAcceptance::Accept
    }

    fn on_control(&mut self, c: Control) {
        match c {
            Control::Cosign {
                message,
                from,
                reply,
            } => {
                let round = self.next_round;
                self.next_round += 1;
                let mut waiting = BTreeSet::new();
                for m in from {
                    let req = Request::Cosign(message.clone());
                    if m != self.cfg.me && self.ask(m, req, Pending::Cosign { round, member: m }) {
                        waiting.insert(m);
                    }
                }
                self.cosigns.insert(
                    round,
                    CosignRound {
                        waiting,
                        got: Vec::new(),
                        reply,
                        deadline: Instant::now() + Duration::from_secs(10),
                    },
                );
                self.finish_cosigns();
            }
            Control::Settled { member } => {
                self.owed_reports.remove(&member);
            }
        }
    }

    fn on_cosign(&mut self, round: u64, member: u32, sig: Option<[u8; 64]>) {
        if let Some(r) = self.cosigns.get_mut(&round) {
            r.waiting.remove(&member);
            r.got.extend(sig.map(|s| (member, s)));
        }
        self.finish_cosigns();
    }

    /// Answers rounds with every member heard from, or past their deadline.
    fn finish_cosigns(&mut self) {
        let now = Instant::now();
        let done: Vec<u64> = self
            .cosigns
            .iter()
            .filter(|(_, r)| r.waiting.is_empty() || now > r.deadline)
            .map(|(k, _)| *k)
            .collect();
        for k in done {
            if let Some(r) = self.cosigns.remove(&k) {
                let _ = r.reply.send(r.got);
            }
        }
    }

    fn on_response(&mut self, id: OutboundRequestId, resp: Response) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        match (p, resp) {
            (Pending::Payload(hash), Response::Payload(bytes)) => {
                self.stats.bytes_in += bytes.len() as u64;
                if *blake3::hash(&bytes).as_bytes() == hash && bytes.len() <= msg::MAX_RESPONSE {
                    self.payloads.insert(hash, bytes);
                    self.machine.on_payload(hash);
                } else {
                    self.stats.drop(Drop::BadBlob);
                    self.machine.on_fetch_failed(hash);
                }
            }
            (Pending::Payload(hash), _) => self.machine.on_fetch_failed(hash),
            (Pending::Manifest, Response::Manifest(raw)) => {
                self.stats.bytes_in += raw.len() as u64;
                match msg::open(&raw).and_then(|s| self.admit(&s).map(|_| s)) {
                    Ok(Signed {
                        body: Body::Manifest(m),
                        raw,
                        ..
                    }) => {
                        self.on_manifest(m, raw);
                    }
                    Ok(_) => self.stats.drop(Drop::BadBlob),
                    Err(d) => self.stats.drop(d),
                }
            }
            (Pending::Manifest, _) => {}
            (Pending::Backfill { step, .. }, Response::Manifest(raw)) => {
                self.stats.bytes_in += raw.len() as u64;
                match self.check_backfill(step, &raw) {
                    Some(contributors) => self
                        .events
                        .push(NodeEvent::Backfilled { step, contributors }),
                    None => self.stats.drop(Drop::BadBlob),
                }
            }
            (Pending::Backfill { step, tries }, _) => self.ask_backfill(step, tries + 1),
            (
                Pending::Snapshot { step, peer },
                Response::Snapshot {
                    total,
                    offset,
                    chunk,
                },
            ) => {
                self.stats.bytes_in += chunk.len() as u64;
                let Some(Download {
                    step: want_step,
                    state_hash: hash,
                    buf,
                    parent,
                    ..
                }) = self.sync_buf.as_mut()
                else {
                    return;
                };
                if *want_step != step || offset as usize != buf.len() || total as usize > 1 << 30 {
                    self.stats.drop(Drop::BadBlob);
                    return;
                }
                buf.extend_from_slice(&chunk);
                if buf.len() < total as usize && !chunk.is_empty() {
                    let id = self.swarm.behaviour_mut().blobs.send_request(
                        &peer,
                        Request::Snapshot {
                            step,
                            offset: buf.len() as u32,
                        },
                    );
                    self.pending.insert(id, Pending::Snapshot { step, peer });
                    return;
                }
                if *blake3::hash(buf).as_bytes() != *hash {
                    self.stats.drop(Drop::BadBlob);
                    self.retry_snapshot(step);
                    return;
                }
                let bytes = std::mem::take(buf);
                let parent = *parent;
                self.sync_buf = None;
                self.syncing = false;
                self.machine.resync(step, parent);
                let _ = self.to_trainer.send(ToTrainer::Snapshot {
                    bytes,
                    generation: self.generation,
                });
            }
            (Pending::Snapshot { step, .. }, _) => self.retry_snapshot(step),
            (
                Pending::Momentum { step, member },
                Response::Snapshot {
                    total,
                    offset,
                    chunk,
                },
            ) => {
                self.stats.bytes_in += chunk.len() as u64;
                self.on_momentum_chunk(step, member, total, offset, chunk);
            }
            (Pending::Momentum { step, member }, _) => self.reveal_failed(step, member, true),
            (Pending::Cosign { round, member }, Response::Signature(sig)) => {
                self.on_cosign(round, member, Some(sig))
            }
            (Pending::Cosign { round, member }, _) => self.on_cosign(round, member, None),
        }
    }

    /// The snapshot download failed or did not match: ask the next member.
    fn retry_snapshot(&mut self, step: u32) {
        let from = self.sync_buf.take().map_or(0, |b| b.from);
        self.sync_requested = None;
        self.request_snapshot(step, (from + 1) % self.cfg.members.len() as u32);
    }

    fn on_failure(&mut self, id: OutboundRequestId) {
        match self.pending.remove(&id) {
            Some(Pending::Payload(h)) => self.machine.on_fetch_failed(h),
            Some(Pending::Snapshot { step, .. }) => self.retry_snapshot(step),
            Some(Pending::Backfill { step, tries }) => self.ask_backfill(step, tries + 1),
            Some(Pending::Momentum { step, member }) => self.reveal_failed(step, member, false),
            Some(Pending::Cosign { round, member }) => self.on_cosign(round, member, None),
            _ => {}
        }
    }

    fn drive(&mut self) {
        let actions = self.machine.poll(self.now());
        for a in actions {
            if self.debug {
                eprintln!("[{}] {:?}", self.cfg.me, a);
            }
            match a {
                Action::Fetch { hash, from } => {
                    if !self.ask(from, Request::Payload(hash), Pending::Payload(hash)) {
                        self.machine.on_fetch_failed(hash);
                    }
                }
                Action::RequestManifest { step, from } => {
                    self.ask(from, Request::Manifest { step }, Pending::Manifest);
                }
                Action::Publish(mut m) => {
                    if self.cfg.defence.adversary == Some(Mode::LyingLeader) {
                        self.lie(&mut m);
                    }
                    let raw = msg::sign(&Body::Manifest(m.clone()), &self.key);
                    self.manifests_raw.insert(m.step, raw.clone());
                    self.publish(raw);
                }
                Action::Apply {
                    manifest,
                    same_history,
                } => {
                    // The machine holds a hash only once its bytes are here.
                    let payloads = manifest
                        .entries
                        .iter()
                        .map(|(_, h)| {
                            debug_assert!(self.payloads.contains_key(h), "applying without bytes");
                            self.payloads.get(h).cloned().unwrap_or_default()
                        })
                        .collect();
                    let last_produced_us = self.machine.last_produced_us(manifest.step);
                    let _ = self.to_trainer.send(ToTrainer::Apply {
                        manifest,
                        payloads,
                        last_produced_us,
                        same_history,
                    });
                }
            }
        }
    }

    fn peer_links(&self) -> Vec<PeerLink> {
        self.peers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i as u32 != self.cfg.me)
            .map(|(i, p)| {
                let (rtt, bytes_in) = p
                    .as_ref()
                    .and_then(|p| self.links.get(p).copied())
                    .unwrap_or_default();
                PeerLink {
                    member: i as u32,
                    rtt,
                    bytes_in,
                }
            })
            .collect()
    }

    fn heartbeat(&mut self) {
        self.seq = self.seq.max(now_us());
        let hb = Heartbeat {
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            member: self.cfg.me,
            seq: self.seq,
            ready_from: self.next_contribution,
            applied: self.applied,
            auditing: self.auditing.len() as u32,
        };
        let raw = msg::sign(&Body::Heartbeat(hb), &self.key);
        // Heartbeats are not worth queueing.
        let _ = self
            .swarm
            .behaviour_mut()
            .gossip
            .publish(self.topic.clone(), raw);
    }

    /// Dials bootstrap peers we are not connected to (they may have
    /// started after us, or restarted).
    fn redial(&mut self) {
        for a in self.cfg.bootstrap.clone() {
            let peer = a.iter().find_map(|p| match p {
                libp2p::multiaddr::Protocol::P2p(id) => Some(id),
                _ => None,
            });
            if peer.is_some_and(|p| !self.swarm.is_connected(&p)) {
                let _ = self.swarm.dial(a);
            }
        }
    }

    fn prune(&mut self) {
        let floor = self.applied.saturating_sub(KEEP);
        // The step machine knows which steps are still kept; payloads
        // fetched while syncing carry no useful receipt step.
        let machine = &self.machine;
        self.payloads.retain(|h, _| machine.holds(h));
        // Manifests stay for the whole epoch: a restarted member asks for
        // the ones it missed (see `backfill_from`); they are small.
        let keep = self.cfg.epoch_start.map_or(floor, |e| e.min(floor));
        self.manifests_raw.retain(|s, _| *s >= keep);
        while self.snapshots.len() > 4 {
            self.snapshots.pop_first();
        }
    }
}

/// The piece of a large blob (a state, a momentum) that starts at `offset`.
fn chunk_of(blob: Option<&Arc<Vec<u8>>>, offset: u32) -> Response {
    match blob {
        Some(b) if (offset as usize) <= b.len() => {
            let end = (offset as usize + msg::SNAPSHOT_CHUNK).min(b.len());
            Response::Snapshot {
                total: b.len() as u32,
                offset,
                chunk: b[offset as usize..end].to_vec(),
            }
        }
        _ => Response::NotFound,
    }
}

/// Runs one member until it has applied `cfg.steps` updates, then lingers
/// briefly so slower peers can still fetch from it.
pub async fn run(
    cfg: NodeConfig,
    corpus: Corpus,
    engine: Box<dyn GradientEngine>,
    on_event: impl FnMut(&NodeEvent),
) -> Result<NodeStats, NodeError> {
    run_with_control(cfg, corpus, engine, None, on_event).await
}

/// [`run`], also taking requests from the application (co-signing a fraud
/// report) while it trains.
pub async fn run_with_control(
    cfg: NodeConfig,
    corpus: Corpus,
    engine: Box<dyn GradientEngine>,
    mut control: Option<mpsc::UnboundedReceiver<Control>>,
    mut on_event: impl FnMut(&NodeEvent),
) -> Result<NodeStats, NodeError> {
    let n = cfg.members.len();
    if n == 0 || cfg.me as usize >= n {
        return Err(NodeError::Config(format!(
            "member index {} outside a job of {n} members",
            cfg.me
        )));
    }
    let key = msg::keypair(&cfg.secret);
    if key.public().to_bytes() != cfg.members[cfg.me as usize] {
        return Err(NodeError::Config(format!(
            "this node's key is not member {} of the job",
            cfg.me
        )));
    }
    let trainer = Trainer::new(
        cfg.train,
        &cfg.init_seed,
        corpus,
        engine,
        Identity {
            job: cfg.job,
            member: cfg.members[cfg.me as usize],
            index: cfg.me,
        },
    )?;
    let mut swarm = swarm::build(&key, cfg.link, cfg.mdns)?;
    for a in &cfg.listen {
        swarm
            .listen_on(a.clone())
            .map_err(|e| NodeError::Config(format!("cannot listen on {a}: {e}")))?;
    }
    for a in &cfg.bootstrap {
        if let Err(e) = swarm.dial(a.clone()) {
            return Err(NodeError::Config(format!("cannot dial {a}: {e}")));
        }
    }
    let topic = IdentTopic::new(format!("cohort/{}", hex(&cfg.job[..8])));
    swarm
        .behaviour_mut()
        .gossip
        .subscribe(&topic)
        .map_err(|e| NodeError::Config(format!("gossip subscribe: {e}")))?;
    let (to_trainer, trainer_rx) = std_mpsc::channel();
    let (trainer_tx, mut from_trainer) = mpsc::unbounded_channel();
    let tcfg = cfg.clone();
    let worker = std::thread::Builder::new()
        .name("cohort-train".into())
        .spawn(move || {
            if let Err(e) = train_loop(tcfg, trainer, trainer_rx, trainer_tx.clone()) {
                let _ = trainer_tx.send(FromTrainer::Failed(e));
            }
        })
        .map_err(|e| NodeError::Trainer(e.to_string()))?;
    let mut net = Net {
        machine: StepMachine::new(
            cfg.job, cfg.epoch, cfg.seed, n as u32, cfg.me, cfg.timing, None,
        )
        .with_end(cfg.steps),
        divergence: DivergenceVote::new(n as u32),
        peers: cfg.members.iter().map(swarm::peer_id).collect(),
        key,
        swarm,
        topic,
        started: Instant::now(),
        payloads: HashMap::new(),
        manifests_raw: BTreeMap::new(),
        events: Vec::new(),
        snapshots: BTreeMap::new(),
        pending: HashMap::new(),
        heartbeat_seq: BTreeMap::new(),
        seq: 0,
        applied: 0,
        next_contribution: 0,
        syncing: false,
        sync_buf: None,
        generation: 0,
        sync_requested: None,
        subscribed: Default::default(),
        to_trainer,
        unpublished: Vec::new(),
        stats: NodeStats::default(),
        links: HashMap::new(),
        debug: std::env::var_os("COHORT_NET_DEBUG").is_some(),
        done: None,
        peers_done: Default::default(),
        momenta: BTreeMap::new(),
        reveals: BTreeMap::new(),
        auditing: BTreeSet::new(),
        peers_auditing: BTreeSet::new(),
        accusations: BTreeMap::new(),
        accused_by_me: BTreeSet::new(),
        cosigns: HashMap::new(),
        next_round: 0,
        owed_reports: BTreeMap::new(),
        reports: control.is_some(),
        cfg,
    };
    let min_peers = if net.cfg.min_peers == 0 {
        n - 1
    } else {
        net.cfg.min_peers
    };
    let mut waiting_start = true;
    let mut trainer_open = true;
    let mut redial_at = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut beat = tokio::time::interval(Duration::from_millis(500));
    let mut beats = 0u64;
    let start_deadline = Instant::now() + Duration::from_secs(30);
    let linger = Duration::from_secs(5);
    loop {
        for e in std::mem::take(&mut net.events) {
            on_event(&e);
        }
        tokio::select! {
            ev = net.swarm.select_next_some() => match ev {
                SwarmEvent::NewListenAddr { address, .. } => on_event(&NodeEvent::Listening(address)),
                SwarmEvent::Behaviour(BehaviourEvent::Gossip(gossipsub::Event::Message {
                    propagation_source, message_id, message,
                })) => {
                    net.links.entry(propagation_source).or_default().1 += message.data.len() as u64;
                    let verdict = net.on_gossip(&message.data);
                    let _ = net.swarm.behaviour_mut().gossip.report_message_validation_result(
                        &message_id, &propagation_source, verdict);
                    net.drive();
                }
                SwarmEvent::Behaviour(BehaviourEvent::Gossip(gossipsub::Event::Subscribed { peer_id, .. })) => {
                    net.subscribed.insert(peer_id);
                }
                SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event { peer, result: Ok(rtt), .. })) => {
                    net.links.entry(peer).or_default().0 = Some(rtt);
                }
                SwarmEvent::Behaviour(BehaviourEvent::Blobs(request_response::Event::Message { peer, message, .. })) => match message {
                    request_response::Message::Request { request, channel, .. } => {
                        let resp = net.serve(&peer, request);
                        net.stats.bytes_out += resp.encode().len() as u64;
                        let _ = net.swarm.behaviour_mut().blobs.send_response(channel, resp);
                    }
                    request_response::Message::Response { request_id, response } => {
                        net.links.entry(peer).or_default().1 += response.wire_len() as u64;
                        net.on_response(request_id, response);
                        net.drive();
                    }
                },
                SwarmEvent::Behaviour(BehaviourEvent::Blobs(request_response::Event::OutboundFailure { request_id, error, .. })) => {
                    if net.debug {
                        eprintln!("[{}] request failed: {error}", net.cfg.me);
                    }
                    net.on_failure(request_id);
                    net.drive();
                }
                SwarmEvent::Behaviour(BehaviourEvent::Blobs(request_response::Event::InboundFailure { .. })) => {
                    net.stats.drop(Drop::Malformed);
                }
                SwarmEvent::Behaviour(BehaviourEvent::Identify(libp2p::identify::Event::Received { peer_id, info, .. })) => {
                    for a in info.listen_addrs {
                        net.swarm.behaviour_mut().kad.add_address(&peer_id, a);
                    }
                }
                SwarmEvent::Behaviour(BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(list))) => {
                    for (peer, addr) in list {
                        net.swarm.behaviour_mut().kad.add_address(&peer, addr.clone());
                        let _ = net.swarm.dial(addr);
                    }
                }
                _ => {}
            },
            msg = from_trainer.recv(), if trainer_open => {
                // After `Done` the thread ends and closes the channel; the
                // node lingers to serve peers still finishing.
                let Some(msg) = msg else {
                    trainer_open = false;
                    if net.done.is_none() {
                        break;
                    }
                    continue;
                };
                match msg {
                    FromTrainer::Ready { step, resumed } => {
                        net.applied = step;
                        net.syncing = net.cfg.join || resumed;
                    }
                    FromTrainer::Contribution { announce, bytes, momentum, compute_secs } => {
                        net.stats.compute_secs += compute_secs;
                        net.momenta.insert(announce.step, momentum);
                        while net.momenta.len() > 2 * KEEP as usize {
                            net.momenta.pop_first();
                        }
                        net.next_contribution = announce.step + 1;
                        net.payloads.insert(announce.payload_hash, bytes);
                        let now = net.now();
                        net.machine.on_local(now, &announce);
                        net.publish(msg::sign(&Body::Announce(announce), &net.key));
                        net.drive();
                    }
                    // Sent before the trainer saw the latest rewind: its
                    // state is being replaced.
                    FromTrainer::Applied { generation, .. } | FromTrainer::Done { generation, .. }
                        if generation < net.generation => {}
                    FromTrainer::Applied { step, state_hash, snapshot, event, .. } => {
                        net.applied = step;
                        if matches!(event, NodeEvent::Synced { .. }) {
                            net.next_contribution = step + 1;
                            if net.machine.next_apply().is_none() {
                                let parent = net.machine.manifest(step).map_or([0; 32], |m| m.parent);
                                net.machine.resync(step, parent);
                            }
                        } else {
                            on_event(&event);
                        }
                        net.machine.on_applied(step, state_hash);
                        net.snapshots.insert(step, snapshot);
                        net.prune();
                        net.drive();
                    }
                    FromTrainer::ForgedEntry { step, leader, member } => {
                        net.stats.forged_entries += 1;
                        on_event(&NodeEvent::ForgedEntry { step, leader, member });
                    }
                    FromTrainer::StateCheck { step, leader, matches } => {
                        match net.divergence.check(step, leader, matches) {
                            Conclusion::Agreed => {}
                            Conclusion::Suspect { leader } => {
                                net.stats.wrong_state_hashes += 1;
                                on_event(&NodeEvent::WrongStateHash { step, leader });
                            }
                            Conclusion::Diverged => on_event(&NodeEvent::Diverged { step }),
                        }
                    }
                    FromTrainer::AuditTargets { step, targets } => {
                        if net.debug {
                            eprintln!("[{}] audit step {step}: {:?}", net.cfg.me, targets.iter().map(|t| t.member).collect::<Vec<_>>());
                        }
                        for t in targets {
                            net.auditing.insert((step, t.member));
                            net.fetch_momentum(step, t.member, t.hash);
                            if let Some(prev) = t.previous {
                                net.fetch_momentum(step - 1, t.member, prev);
                            }
                        }
                    }
                    FromTrainer::AuditDone { step, member, report } => {
                        net.auditing.remove(&(step, member));
                        let Some(report) = report else { continue };
                        net.stats.audits += 1;
                        net.stats.audit_secs += report.secs;
                        if !report.passed {
                            net.stats.audits_failed += 1;
                            net.accuse(&report);
                        }
                        on_event(&NodeEvent::Audited(report));
                        net.drive();
                    }
                    FromTrainer::Synced { step, resumed } => {
                        on_event(&NodeEvent::Synced { step, resumed });
                        if let Some(from) = net.cfg.backfill_from {
                            for st in from..step {
                                net.ask_backfill(st, 0);
                            }
                        }
                    }
                    FromTrainer::Done { model_hash, .. } => {
                        net.stats.model_hash = model_hash;
                        net.stats.applied = net.applied;
                        net.done = Some(Instant::now());
                        net.heartbeat();
                    }
                    FromTrainer::Failed(e) => {
                        let _ = worker.join();
                        return Err(NodeError::Trainer(e));
                    }
                }
            }
            _ = tick.tick() => {
                if waiting_start {
                    let members: usize = net.peers.iter().flatten().filter(|p| net.subscribed.contains(p)).count();
                    if !net.syncing && (members >= min_peers || Instant::now() > start_deadline) {
                        waiting_start = false;
                        // The epoch's first step: nothing applied before it.
                        net.machine.resync(net.applied, [0; 32]);
                        let _ = net.to_trainer.send(ToTrainer::Start);
                    } else if net.syncing {
                        waiting_start = false;
                    }
                }
                if net.syncing && net.sync_buf.is_none()
                    && let Some(m) = net.machine.latest_manifest() {
                        let (step, leader) = (m.step, m.leader);
                        net.request_snapshot(step, leader);
                    }
                if redial_at.elapsed() > Duration::from_secs(1) {
                    redial_at = Instant::now();
                    net.redial();
                }
                net.retry_unpublished();
                net.retry_reveals();
                net.drive();
                if let Some(t) = net.done {
                    let all = net.peers_done.len() + 1 >= n;
                    // A conviction is reported on chain with the accusers'
                    // co-signatures: stay until ours is no longer needed.
                    let now = Instant::now();
                    net.owed_reports.retain(|_, until| until.is_none_or(|u| u > now));
                    let reporting = !net.cosigns.is_empty() || !net.owed_reports.is_empty();
                    // Nor while a live peer is still training or auditing:
                    // a slow member must still find peers to fetch from.
                    let now_d = net.now();
                    let slow_peer = (0..n as u32).any(|m| {
                        m != net.cfg.me
                            && !net.peers_done.contains(&m)
                            && !net.machine.is_slashed(m)
                            && net.machine.heard_within(now_d, m, Duration::from_secs(5))
                    });
                    let staying = (slow_peer
                        || !(net.auditing.is_empty() && net.peers_auditing.is_empty()))
                        && t.elapsed() < AUDIT_PATIENCE;
                    let limit = if reporting { linger * 12 } else { linger };
                    if (all && !reporting && !staying) || (t.elapsed() > limit && !staying) {
                        break;
                    }
                }
            }
            c = async {
                match control.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => match c {
                Some(c) => net.on_control(c),
                None => control = None,
            },
            _ = beat.tick() => {
                net.finish_cosigns();
                net.heartbeat();
                beats += 1;
                if beats.is_multiple_of(4) {
                    on_event(&NodeEvent::Links(net.peer_links()));
                }
            }
        }
    }
    // The trainer waits for rewinds until the network side hangs up.
    let Net {
        to_trainer, stats, ..
    } = net;
    drop(to_trainer);
    let _ = worker.join();
    Ok(stats)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
