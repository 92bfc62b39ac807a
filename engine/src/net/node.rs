//! One member of a job on the network: a training thread that owns the
//! [`Trainer`] and a network task that owns the swarm and the
//! [`StepMachine`]. They talk through channels, so training never waits on
//! I/O except where the protocol says it must (the manifest of step t-1
//! before computing step t+1).

use super::msg::{self, Announce, Body, Drop, Heartbeat, Manifest, Request, Response, Signed};
use super::shaper::Link;
use super::step::{Action, KEEP, StepMachine, Timing, Verdict};
use super::swarm::{self, Behaviour, BehaviourEvent};
use crate::backend::GradientEngine;
use crate::data::Corpus;
use crate::error::EngineError;
use crate::trainer::{Identity, TrainConfig, Trainer};
use crate::wire::Contribution;
use libp2p::futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance};
use libp2p::identity::ed25519;
use libp2p::request_response::{self, OutboundRequestId};
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, Swarm, ping};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

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
    /// This node's state differed from that of a leader with the same
    /// history: the same manifests gave different weights.
    Diverged {
        step: u32,
    },
    /// A better manifest for `step` turned up after this node applied
    /// another one: it went back to its state before `step` and applies
    /// again from there.
    Rewound {
        step: u32,
    },
    /// What this node sees of each other member's link, every 2 s.
    Links(Vec<PeerLink>),
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
    },
    Applied {
        step: u32,
        state_hash: [u8; 32],
        snapshot: Arc<Vec<u8>>,
        event: NodeEvent,
        generation: u64,
    },
    Diverged {
        step: u32,
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

/// The training side: compute step t+1 while step t is exchanged.
fn train_loop(
    cfg: NodeConfig,
    mut trainer: Trainer,
    rx: std_mpsc::Receiver<ToTrainer>,
    tx: mpsc::UnboundedSender<FromTrainer>,
) -> Result<(), String> {
    let layout = trainer.layout().clone();
    let send = |m: FromTrainer| tx.send(m).map_err(|_| "network task gone".to_string());
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
    loop {
        match rx.recv().map_err(|_| "network task gone".to_string())? {
            ToTrainer::Start => break,
            ToTrainer::Snapshot {
                bytes,
                generation: g,
            } if syncing => {
                trainer.load_snapshot(&bytes).map_err(|e| e.to_string())?;
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
    let publish_state = |t: &Trainer| {
        let snapshot = Arc::new(t.snapshot());
        let state_hash = *blake3::hash(&snapshot).as_bytes();
        (state_hash, snapshot)
    };
    // The state hash of the current weights, kept so each step encodes and
    // hashes the full state once (it is checked against the next manifest).
    let (mut current_hash, snap) = publish_state(&trainer);
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
                bytes: &[u8],
                generation: u64,
                next_compute: &mut u32|
     -> Result<[u8; 32], String> {
        trainer.load_snapshot(bytes).map_err(|e| e.to_string())?;
        *next_compute = (*next_compute).max(trainer.step() + 1);
        let (hash, snapshot) = publish_state(trainer);
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
                let (c, stats) = trainer
                    .compute_step(&cfg.seed, cfg.epoch, next_compute)
                    .map_err(|e| e.to_string())?;
                compute_secs = stats.compute_secs;
                loss = stats.loss;
                let bytes = c.encode(&layout);
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
                send(FromTrainer::Contribution { announce, bytes })?;
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
                        current_hash = load(&mut trainer, &bytes, g, &mut next_compute)?;
                        generation = g;
                        break None;
                    }
                    _ => {}
                }
            };
            let Some((manifest, payloads, last_produced_us, same_history)) = next else {
                continue;
            };
            let unblocked = now_us();
            // A leader with another history legitimately has other weights
            // (one of us rewinds once the better manifest is known).
            if same_history && manifest.state_hash != current_hash {
                send(FromTrainer::Diverged {
                    step: manifest.step,
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
                match Contribution::decode(bytes, &layout) {
                    Ok(c) if c.member == *key && c.step == manifest.step && c.job == cfg.job => {
                        contributions.push(c);
                        contributors.push(*member);
                    }
                    _ => {}
                }
            }
            trainer.apply(&contributions).map_err(|e| e.to_string())?;
            if let Some(path) = &cfg.checkpoint {
                trainer.save(path).map_err(|e| e.to_string())?;
            }
            let blocked = (unblocked.saturating_sub(blocked_from)) as f64 / 1e6;
            let wait = (last_produced_us.saturating_sub(blocked_from) as f64 / 1e6).min(blocked);
            let (state_hash, snapshot) = publish_state(&trainer);
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
        // last steps can still rewind it until the network side hangs up.
        loop {
            match rx.recv() {
                Err(_) => return Ok(()),
                Ok(ToTrainer::Snapshot {
                    bytes,
                    generation: g,
                }) => {
                    current_hash = load(&mut trainer, &bytes, g, &mut next_compute)?;
                    generation = g;
                    break;
                }
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
}

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

    fn retry_unpublished(&mut self) {
        for raw in std::mem::take(&mut self.unpublished) {
            self.publish(raw);
        }
    }

    /// Checks membership, job and replay; the signature was checked by
    /// [`msg::open`].
    fn admit(&mut self, s: &Signed) -> Result<(), Drop> {
        if *s.body.job() != self.cfg.job {
            return Err(Drop::WrongJob);
        }
        if self.cfg.members.get(s.body.member() as usize) != Some(&s.signer) {
            return Err(Drop::NotMember);
        }
        // Gossip never hands a node its own messages: one coming back was
        // re-published by someone else.
        if s.body.member() == self.cfg.me {
            return Err(Drop::Replayed);
        }
        if let Body::Heartbeat(h) = &s.body {
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
        let signed = match msg::open(raw).and_then(|s| self.admit(&s).map(|_| s)) {
            Ok(s) => s,
            Err(d) => {
                self.stats.drop(d);
                return MessageAcceptance::Reject;
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
                _ => self.stats.late += 1,
            },
            Body::Manifest(m) => return self.on_manifest(m, signed.raw),
            Body::Heartbeat(h) => {
                self.stats.accepted += 1;
                if h.applied >= self.cfg.steps {
                    self.peers_done.insert(h.member);
                }
                self.machine.on_ready(h.member, h.ready_from);
            }
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

    fn serve(&mut self, req: Request) -> Response {
        match req {
            Request::Payload(h) => self
                .payloads
                .get(&h)
                .map_or(Response::NotFound, |b| Response::Payload(b.clone())),
            Request::Manifest { step } => self
                .manifests_raw
                .get(&step)
                .map_or(Response::NotFound, |b| Response::Manifest(b.clone())),
            Request::Snapshot { step, offset } => match self.snapshots.get(&step) {
                Some(s) if (offset as usize) <= s.len() => {
                    let end = (offset as usize + msg::SNAPSHOT_CHUNK).min(s.len());
                    Response::Snapshot {
                        total: s.len() as u32,
                        offset,
                        chunk: s[offset as usize..end].to_vec(),
                    }
                }
                _ => Response::NotFound,
            },
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
                Action::Publish(m) => {
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
            member: self.cfg.me,
            seq: self.seq,
            ready_from: self.next_contribution,
            applied: self.applied,
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

/// Runs one member until it has applied `cfg.steps` updates, then lingers
/// briefly so slower peers can still fetch from it.
pub async fn run(
    cfg: NodeConfig,
    corpus: Corpus,
    engine: Box<dyn GradientEngine>,
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
        ),
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
                        let resp = net.serve(request);
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
                    FromTrainer::Contribution { announce, bytes } => {
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
                    FromTrainer::Diverged { step } => on_event(&NodeEvent::Diverged { step }),
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
                net.drive();
                if let Some(t) = net.done {
                    let all = net.peers_done.len() + 1 >= n;
                    if all || t.elapsed() > linger {
                        break;
                    }
                }
            }
            _ = beat.tick() => {
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
