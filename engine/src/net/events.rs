//! What a running node is configured with and reports: its settings,
//! events, counters, errors and the controls the application sends it.

use super::msg::Drop;
use super::shaper::Link;
use super::step::Timing;
use super::swarm;
use crate::adversary::Mode;
use crate::audit::{AuditConfig, Comparison};
use crate::defence::Ground;
use crate::error::EngineError;
use crate::trainer::TrainConfig;
use libp2p::Multiaddr;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::sync::oneshot;

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
    /// What an accusation on it carries (see [`crate::defence`]).
    pub ground: Ground,
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
    /// While set, this member computes no gradients (its owner wants the
    /// device back) but keeps applying every step, so it stays in sync and
    /// can resume at once. Steps it skipped earn it nothing.
    pub pause: Arc<AtomicBool>,
    /// Whether a pause also hands the device memory the backend pools
    /// between steps back to the driver (the owner asked for the VRAM).
    pub release_memory_when_paused: bool,
    pub defence: Defence,
    /// States and momenta this node keeps to serve (four and sixteen of
    /// them, each about the model's size) go to disk from this size on.
    pub spill_above: usize,
    /// Who signs gossip messages: our envelope only, unless a benchmark
    /// measures the old way (`swarm::GossipSigning`).
    pub gossip_signing: crate::net::swarm::GossipSigning,
    /// The sharded exchange's plan; None runs the all-to-all exchange.
    pub exchange: Option<crate::net::exchange::Plan>,
}

/// [`NodeConfig::spill_above`] for nodes that do not choose: anything the
/// size of a small model's state or more lives on disk.
pub const SPILL_ABOVE: usize = 16 << 20;

impl NodeConfig {
    /// This epoch's defence policy: the same on the training thread and
    /// the network task.
    pub fn policy(&self) -> crate::defence::Policy {
        crate::defence::Policy {
            audit: self.defence.audit,
            witnesses: self.defence.witnesses.clone(),
            seed: self.seed,
            job: self.job,
            epoch: self.epoch,
        }
    }
}

/// How many of this epoch's applied steps credited each member (by member
/// index): what the member's points grow by, and what the epoch's witnesses
/// attest. Part of the shared state, so its hash covers it and a node that
/// loads a state (a rewind past its kept states, a restart, a late join)
/// takes the credits of the steps it did not apply itself from the state
/// every other member has, instead of keeping those of a history it left.
pub type Credits = Vec<u32>;

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
    /// Downloaded and verified the shared state at `step` from a peer;
    /// `credits` are the epoch's so far, as every member has them.
    Synced {
        step: u32,
        resumed: bool,
        credits: Credits,
    },
    Applied {
        step: u32,
        model_hash: [u8; 32],
        /// The members this step credits: their contributions were applied.
        contributors: Vec<u32>,
        /// The epoch's credits after this step, by member index.
        credits: Credits,
        times: StepTimes,
        loss: f32,
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
    /// `leader`'s manifest for `step` left out `member`'s contribution
    /// although this node had held it for a while (`step::Omission`): a
    /// sign of censorship, counted per leader, not proof.
    Omitted {
        step: u32,
        leader: u32,
        member: u32,
    },
    /// A better manifest turned up for a step this node had applied
    /// another one for: it went back to the state before that step (its
    /// own kept copy, or past those the latest state the others have, which
    /// is `step`'s) and applies again from `step`.
    Rewound {
        step: u32,
        /// The epoch's credits in the state it went back to: they replace
        /// whatever the abandoned history credited.
        credits: Credits,
    },
    /// What this node sees of each other member's link, every 2 s.
    Links(Vec<PeerLink>),
    /// This node, as a witness, audited a contribution.
    Audited(AuditReport),
    /// This node, as a witness, accused `member`: a failed audit, or proof
    /// it holds by itself (equivocation, a forged entry). The application
    /// votes on chain with `evidence` (the same id on every witness).
    Accused {
        member: u32,
        step: u32,
        evidence: [u8; 32],
        ground: Ground,
    },
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
    /// The lowest gossip peer score seen (0 until a peer misbehaves).
    pub lowest_peer_score: f64,
    /// Requests given up at their deadline (see `Timing::deadline`).
    pub timed_out: u64,
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
    /// Omissions per leader (`NodeEvent::Omitted`).
    pub omissions: BTreeMap<u32, u64>,
    /// Manifest entries their member did not sign (`ForgedEntry`).
    pub forged_entries: u64,
    /// Aggregators this node caught signing a false sum (sharded exchange).
    pub false_sums: u64,
    /// Listed slices this node, as a seat, summed with no vote: the
    /// shard's screen flagged them (`shard::votes`).
    pub unvoted: u64,
    /// How this node reached each member it connected to, at best.
    pub routes: BTreeMap<u32, Route>,
    /// Ticks of the beat timer that sent no heartbeat: this node's own
    /// announcement had shown it alive lately (`liveness::beat_due`).
    pub beats_skipped: u64,
}

/// How a node reached a peer, from worst to best: through a relay only, by
/// dialing it, or by a hole punched through both NATs (DCUtR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    Relayed,
    Direct,
    HolePunched,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Relayed => "relayed",
            Route::Direct => "direct",
            Route::HolePunched => "holepunched",
        }
    }

    /// Keeps the better of the route known and a new one.
    pub fn improve(known: &mut BTreeMap<u32, Route>, member: u32, route: Route) {
        let r = known.entry(member).or_insert(route);
        *r = (*r).max(route);
    }
}

impl NodeStats {
    pub(crate) fn drop(&mut self, d: Drop) {
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
