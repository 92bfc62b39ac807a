//! One member of a job on the network: a training thread that owns the
//! [`Trainer`] and a network task that owns the swarm and the
//! [`StepMachine`]. They talk through channels, so training never waits on
//! I/O except where the protocol says it must (the manifest of step t-1
//! before computing step t+1).

mod blobs;
mod fetch;
mod gossip;
mod sharded;
mod witness;

use crate::adversary::Mode;
use crate::audit;
use crate::backend::GradientEngine;
use crate::data::Corpus;
use crate::defence::{self, Ground, Policy, Tally};
use crate::net::diverge::{Conclusion, DivergenceVote};
pub use crate::net::events::*;
use crate::net::guard::Revealed;
use crate::net::liveness;
use crate::net::msg::{self, Accuse, Body, Drop, Heartbeat, Manifest, Request, Response, Signed};
use crate::net::step::{Action, KEEP, StepMachine, Verdict};
use crate::net::swarm::{self, Behaviour, BehaviourEvent};
use crate::net::train::{FromTrainer, Inputs, ToTrainer, now_us, train_loop};
use crate::trainer::{Identity, Trainer};
use libp2p::futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance};
use libp2p::identity::ed25519;
use libp2p::request_response::{self, OutboundRequestId};
use libp2p::swarm::SwarmEvent;
use libp2p::{PeerId, Swarm, ping};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use witness::Failed;

use sharded::Why;

enum Pending {
    /// A part of a payload, asked of member `from`.
    Payload {
        hash: [u8; 32],
        from: u32,
    },
    Manifest,
    Snapshot {
        step: u32,
        peer: PeerId,
    },
    Momentum {
        step: u32,
        member: u32,
    },
    Cosign {
        round: u64,
        member: u32,
    },
    /// This node's slice of `shard`, pushed to aggregator `to`.
    Push {
        step: u32,
        shard: u32,
        to: u32,
    },
    /// `member`'s slice of `shard`, to aggregate, to recompute with, or to
    /// check a seat's claim that it is withheld.
    Slice {
        step: u32,
        shard: u32,
        member: u32,
        why: Why,
    },
    /// `member`'s slice handed to a seat that claimed it withheld.
    Hand,
    /// The sum of `shard` over `manifest`, asked of aggregator `from`.
    Sum {
        step: u32,
        shard: u32,
        from: u32,
        manifest: [u8; 32],
    },
    /// This node's signed sum hash, sent to a member (the answer only
    /// says it arrived).
    Claim,
}

impl Pending {
    /// Whether it belongs to the sharded exchange.
    fn is_sharded(&self) -> bool {
        matches!(
            self,
            Pending::Push { .. }
                | Pending::Slice { .. }
                | Pending::Sum { .. }
                | Pending::Hand
                | Pending::Claim
        )
    }
}

/// A momentum being downloaded for an audit.
struct Reveal {
    /// What the member's contribution committed to.
    hash: [u8; 32],
    /// The bytes received so far: a retry resumes after them.
    buf: Vec<u8>,
    tries: u32,
    /// When the download began or last received a chunk: a member that
    /// does not answer is asked again until [`AUDIT_PATIENCE`] has passed
    /// since then, so a slow link that makes progress is never "silent".
    progress: Instant,
    /// When to ask again after an unanswered try.
    retry_at: Option<Instant>,
    /// The member answered at least once without the momentum.
    refused: bool,
    /// Requests that reached the member over an open connection and went
    /// unanswered past their deadline: the only silence that can count as
    /// withholding (a dial failure or a closed connection does not).
    silent: u32,
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
    /// Whether one of this node's relays has identified it (told it the
    /// address it sees), and whether DCUtR has an address to punch with
    /// (any peer's observation; a false one only fails its punch).
    relay_identified: bool,
    address_candidate: bool,
    /// The relays named in this node's relayed addresses.
    relays: HashSet<PeerId>,
    /// Relayed addresses: when each may be dialed again, and the next wait.
    relayed_redial: HashMap<libp2p::Multiaddr, (Instant, Duration)>,
    payloads: HashMap<[u8; 32], Vec<u8>>,
    /// Payload downloads in progress: the bytes so far and the size their
    /// first part announced. Payloads are content-addressed, so the next
    /// holder asked resumes after them.
    partial: HashMap<[u8; 32], (Vec<u8>, u64)>,
    /// Largest state a download accepts (the model's weights and shared
    /// second moment, plus the screen's memory), and a momentum's exact size.
    state_cap: u64,
    momentum_len: u64,
    /// The signed manifest this node applied per step, for the whole epoch:
    /// what it serves for a step the step machine no longer keeps.
    manifests_raw: BTreeMap<u32, Vec<u8>>,
    /// Every signed manifest the step machine keeps, by id, for the steps
    /// still kept: where `manifests_raw` is filled from when one is applied.
    ranked_raw: HashMap<[u8; 32], (u32, Vec<u8>)>,
    /// Events raised by the network side, drained by `run`.
    events: Vec<NodeEvent>,
    snapshots: blobs::BlobStore,
    pending: HashMap<OutboundRequestId, Pending>,
    /// When each pending request is given up (`Timing::deadline`).
    deadlines: HashMap<OutboundRequestId, Instant>,
    /// Size of this node's own payloads: what a payload fetch expects.
    payload_len: u64,
    /// This node's recent payloads: hash → step.
    own_payloads: BTreeMap<[u8; 32], u32>,
    /// Requests the stalling attacker holds unanswered (tests only).
    unanswered: std::collections::VecDeque<request_response::ResponseChannel<Response>>,
    heartbeat_seq: BTreeMap<[u8; 32], u64>,
    seq: u64,
    /// When this node last gossiped its own announcement, and its step.
    announced: Option<(Instant, u32)>,
    applied: u32,
    next_contribution: u32,
    syncing: bool,
    sync_buf: Option<Download>,
    /// Rewinds so far; trainer messages from before the latest are stale.
    generation: u64,
    sync_requested: Option<Instant>,
    /// The next member to ask for the state after one refused or failed,
    /// and when: asked at once, a job where nobody holds the state turned
    /// into a request (and a dial of any member gone) every few
    /// milliseconds on every syncing node, starving the rest of the machine.
    sync_retry: Option<(u32, u32, Instant)>,
    subscribed: std::collections::BTreeSet<PeerId>,
    to_trainer: std_mpsc::Sender<ToTrainer>,
    unpublished: Vec<Vec<u8>>,
    stats: NodeStats,
    done: Option<Instant>,
    peers_done: std::collections::BTreeSet<u32>,
    /// This member's momentum before each of its recent contributions:
    /// what it reveals when audited.
    momenta: blobs::BlobStore,
    /// Momentum downloads for audits: (step, member) → progress.
    reveals: BTreeMap<(u32, u32), Reveal>,
    /// Momentum requests past their deadline → whose reveal they were for:
    /// an answer that still comes shows the member is answering, on a slow
    /// link, not withholding (it resets the patience).
    late_reveals: HashMap<OutboundRequestId, (u32, u32)>,
    /// The defence policy (this side's copy: the trainer holds another).
    policy: Policy,
    /// Accusations heard, counted under `policy`.
    tally: Tally,
    /// Evidence this node accused on from proof it holds (once each).
    proofs: BTreeSet<[u8; 32]>,
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
    /// leave while any is open (up to [`AUDIT_PATIENCE`] and
    /// [`AUDIT_GRACE`] after its last step), so a slow witness still audits
    /// instead of dropping it.
    auditing: BTreeSet<(u32, u32)>,
    /// The sharded exchange's driver, when the job runs it.
    sharded: Option<sharded::Sharded>,
    /// Peers whose latest heartbeat says they still audit: their audits
    /// may need this node's momentum or count its accusation, so a
    /// finished node stays for them too (never past [`AUDIT_PATIENCE`] and
    /// [`AUDIT_GRACE`]).
    peers_auditing: BTreeSet<u32>,
}

/// How long a node that finished its steps stays for its open audits and
/// for live peers still training or auditing, and how long a witness keeps
/// asking a member it cannot reach for a momentum.
const AUDIT_PATIENCE: Duration = Duration::from_secs(60);

/// How much longer than `AUDIT_PATIENCE` a finished node stays for open
/// audits: a reveal given up at its patience still has to reach the
/// trainer, be judged, and have its accusations gossiped to a quorum.
const AUDIT_GRACE: Duration = Duration::from_secs(30);

/// A member heard (any valid message) within this long is online: the
/// window `may_leave` waits for a slow peer, and what tells a silent
/// author from a gone one when a reveal is given up.
const ALIVE_WINDOW: Duration = Duration::from_secs(5);

/// A state download that received nothing for this long is asked of the
/// next member: its answer may have been lost, or dropped as not matching
/// a newer request, and nothing else would ask again once the others have
/// finished and publish no more manifests (seen under load: a node that
/// rewound past its kept states waited the others' whole 60 s patience
/// and was left alone).
const SYNC_STALL: Duration = Duration::from_secs(20);

/// The pause before asking the next member for a state the last one did
/// not serve.
const SYNC_RETRY: Duration = Duration::from_millis(500);

impl Net {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Gossips `raw`; with no subscribed peer yet it is kept for the next
    /// tick. The very same bytes gossiped already (a message is known by
    /// its content) are not sent again.
    fn publish(&mut self, raw: Vec<u8>) {
        match self
            .swarm
            .behaviour_mut()
            .gossip
            .publish(self.topic.clone(), raw.clone())
        {
            Ok(_) => self.stats.bytes_out += raw.len() as u64,
            Err(gossipsub::PublishError::Duplicate) => {}
            Err(_) => self.unpublished.push(raw),
        }
    }

    fn drive(&mut self) {
        loop {
            self.drive_steps();
            if !self.drive_exchange() {
                break;
            }
        }
    }

    fn drive_steps(&mut self) {
        let actions = self.machine.poll(self.now());
        for a in actions {
            tracing::trace!(me = self.cfg.me, action = ?a);
            match a {
                // Nothing to fetch on the sharded exchange: a contribution's
                // slices travel to its aggregators instead.
                Action::Fetch { hash, .. } if self.sharded.is_some() => {
                    let now = self.now();
                    if let Some(step) = self.machine.on_payload(now, hash) {
                        self.rewind(step);
                    }
                }
                Action::Apply {
                    manifest,
                    same_history,
                } if self.sharded.is_some() => self.sharded_manifest(manifest, same_history),
                Action::Fetch { hash, from } => {
                    let offset = self.partial.get(&hash).map_or(0, |p| p.0.len() as u64);
                    let req = Request::Payload { hash, offset };
                    if !self.ask(from, req, Pending::Payload { hash, from }) {
                        self.machine.on_fetch_failed(hash);
                    }
                }
                Action::RequestManifest { step, from } => {
                    self.ask(from, Request::Manifest { step }, Pending::Manifest);
                }
                // The stalling member leads in silence on even steps, and on
                // odd ones lists its own payload under a hash nobody holds.
                Action::Publish(mut m) if self.cfg.defence.adversary == Some(Mode::Stalling) => {
                    if m.step % 2 == 1 {
                        let me = self.cfg.me;
                        for (who, hash) in m.entries.iter_mut() {
                            if *who == me {
                                *hash = *blake3::hash(hash).as_bytes();
                            }
                        }
                        self.publish(msg::sign(&Body::Manifest(m), &self.key));
                    }
                }
                Action::Publish(mut m) => {
                    // The lying leader also equivocates: a second signed
                    // manifest for the same attempt, without its own entry.
                    let mut twin = None;
                    if self.cfg.defence.adversary == Some(Mode::LyingLeader) {
                        self.lie(&mut m);
                        let mut t = m.clone();
                        t.entries.retain(|(who, _)| *who != self.cfg.me);
                        twin = (t != m).then_some(t);
                    }
                    let raw = msg::sign(&Body::Manifest(m.clone()), &self.key);
                    self.ranked_raw.insert(m.id(), (m.step, raw.clone()));
                    self.publish(raw);
                    if let Some(t) = twin {
                        self.publish(msg::sign(&Body::Manifest(t), &self.key));
                    }
                }
                Action::Apply {
                    manifest,
                    same_history,
                } => {
                    tracing::debug!(
                        me = self.cfg.me,
                        step = manifest.step,
                        leader = manifest.leader,
                        attempt = manifest.attempt,
                        members = ?manifest.entries.iter().map(|e| e.0).collect::<Vec<_>>(),
                        same_history,
                        "applying a manifest"
                    );
                    // The machine holds a hash only once its bytes are here.
                    let payloads = manifest
                        .entries
                        .iter()
                        .map(|(_, h)| {
                            debug_assert!(self.payloads.contains_key(h), "applying without bytes");
                            self.payloads.get(h).cloned().unwrap_or_default()
                        })
                        .collect();
                    if let Some((_, raw)) = self.ranked_raw.get(&manifest.id()) {
                        self.manifests_raw.insert(manifest.step, raw.clone());
                    }
                    let last_produced_us = self.machine.last_produced_us(manifest.step);
                    let _ = self.to_trainer.send(ToTrainer::Apply {
                        manifest,
                        inputs: Inputs::Payloads(payloads),
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

    /// The lowest gossip score of any connected peer so far (a peer that
    /// sent invalid messages goes negative, and past -80 is graylisted).
    fn note_scores(&mut self) {
        let g = &self.swarm.behaviour().gossip;
        let low = g
            .all_peers()
            .filter_map(|(p, _)| g.peer_score(p))
            .fold(f64::INFINITY, f64::min);
        if low.is_finite() {
            self.stats.lowest_peer_score = self.stats.lowest_peer_score.min(low);
        }
    }

    /// A tick of the beat timer: a heartbeat, unless this node announced
    /// lately and in time (its announcement stood in for it). One that
    /// the step's manifest left out came late, to the leader at least:
    /// peers that had applied the step took it as no sign of life (only
    /// fresh announcements count), and the beat also tells leaders again
    /// from which step this node contributes.
    fn beat(&mut self) {
        self.note_scores();
        let since = self.announced.and_then(|(at, step)| {
            let me = self.cfg.me;
            let left_out = self
                .machine
                .manifest(step)
                .is_some_and(|m| m.entries.iter().all(|e| e.0 != me));
            (!left_out).then(|| at.elapsed())
        });
        let n = self.cfg.members.len() as u32;
        if liveness::beat_due(n, self.cfg.timing.alive, since) {
            self.heartbeat();
        } else {
            self.stats.beats_skipped += 1;
        }
    }

    fn heartbeat(&mut self) {
        self.seq = self.seq.max(now_us());
        let (chain_step, chain) = self.machine.history().unwrap_or((0, [0; 32]));
        let hb = Heartbeat {
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            member: self.cfg.me,
            seq: self.seq,
            ready_from: self.next_contribution,
            applied: self.applied,
            auditing: self.auditing.len() as u32,
            chain_step,
            chain,
        };
        let raw = msg::sign(&Body::Heartbeat(hb), &self.key);
        // Heartbeats are not worth queueing.
        let _ = self
            .swarm
            .behaviour_mut()
            .gossip
            .publish(self.topic.clone(), raw);
    }

    /// The member index of a connected peer id, if it is a member.
    fn member_of(&self, peer: &PeerId) -> Option<u32> {
        self.peers
            .iter()
            .position(|p| p.as_ref() == Some(peer))
            .map(|i| i as u32)
    }

    fn note_route(&mut self, peer: &PeerId, route: Route) {
        if let Some(i) = self.member_of(peer) {
            Route::improve(&mut self.stats.routes, i, route);
        }
    }

    /// Dials bootstrap peers we are not connected to (they may have
    /// started after us, or restarted).
    fn redial(&mut self) {
        for a in self.cfg.bootstrap.clone() {
            let Some(peer) = peer_ids(&a).last() else {
                continue;
            };
            if self.swarm.is_connected(&peer) {
                self.relayed_redial.remove(&a);
                continue;
            }
            if !is_relayed(&a) {
                let _ = self.swarm.dial(a);
                continue;
            }
            // Relayed: only toward higher member indices at first. Two
            // relayed connections opened at once from both ends each start
            // a hole punch, and the two punches spoil each other (seen here:
            // both members stayed relayed in 1 run of 5). The lower index
            // dials; the other waits to be dialed, then dials too.
            let lower = self.member_of(&peer).is_some_and(|i| i < self.cfg.me);
            if lower && self.started.elapsed() < RELAY_DIAL_WAIT * 3 {
                continue;
            }
            // After the public address, with a growing wait.
            let now = Instant::now();
            let due = self.relayed_redial.get(&a).is_none_or(|(at, _)| now >= *at);
            if !due || !self.may_dial_relayed() {
                continue;
            }
            let wait = self
                .relayed_redial
                .get(&a)
                .map_or(Duration::from_secs(1), |(_, w)| {
                    (*w * 2).min(RELAY_REDIAL_MAX)
                });
            self.relayed_redial.insert(a.clone(), (now + wait, wait));
            if let Err(e) = self.swarm.dial(a.clone()) {
                tracing::warn!(addr = %a, error = %e, "cannot dial through the relay");
            }
        }
    }

    /// DCUtR sends the remote the public addresses this node knows *when
    /// a relayed connection opens*, and tries once: a member dialed
    /// through the relay before the relay told it its public address has
    /// nothing to punch and stays relayed. So relayed dials wait for that
    /// address, or a few seconds, whichever comes first.
    fn may_dial_relayed(&self) -> bool {
        (self.relay_identified && self.address_candidate)
            || self.started.elapsed() > RELAY_DIAL_WAIT
    }

    fn prune(&mut self) {
        let floor = self.applied.saturating_sub(KEEP);
        // The step machine knows which steps are still kept; payloads
        // fetched while syncing carry no useful receipt step.
        let machine = &self.machine;
        self.payloads.retain(|h, _| machine.holds(h));
        // Manifests stay for the whole epoch: they are small, and a peer
        // that fell behind may still ask for one.
        let keep = self.cfg.epoch_start.map_or(floor, |e| e.min(floor));
        self.manifests_raw.retain(|s, _| *s >= keep);
        self.ranked_raw.retain(|_, (s, _)| *s >= floor);
        self.snapshots.keep_latest(4);
        let machine = &self.machine;
        self.partial.retain(|h, _| machine.wants(h));
        self.prune_sharded(floor);
    }
}

/// When a node starts and when it may leave: the network task's clock.
struct Life {
    /// Still waiting for peers before a fresh start.
    waiting_start: bool,
    min_peers: usize,
    start_deadline: Instant,
    redial_at: Instant,
    /// How long a finished node stays for its peers.
    linger: Duration,
}

impl Life {
    fn new(cfg: &NodeConfig, n: usize) -> Self {
        Life {
            waiting_start: true,
            min_peers: if cfg.min_peers == 0 {
                n - 1
            } else {
                cfg.min_peers
            },
            start_deadline: Instant::now() + Duration::from_secs(30),
            redial_at: Instant::now(),
            linger: Duration::from_secs(5),
        }
    }
}

impl Net {
    fn new(
        cfg: NodeConfig,
        key: ed25519::Keypair,
        swarm: Swarm<Behaviour>,
        topic: IdentTopic,
        to_trainer: std_mpsc::Sender<ToTrainer>,
        reports: bool,
        sharded: Option<sharded::Sharded>,
    ) -> Self {
        let n = cfg.members.len();
        let numel = cfg.train.model.num_params() as u64;
        Net {
            // Silence means gone after as many missed beats at any size.
            machine: StepMachine::new(
                cfg.job,
                cfg.epoch,
                cfg.seed,
                n as u32,
                cfg.me,
                crate::net::step::Timing {
                    alive: liveness::alive_window(n as u32, cfg.timing.alive),
                    ..cfg.timing
                },
                None,
            )
            .with_end(cfg.steps),
            divergence: DivergenceVote::new(n as u32),
            peers: cfg.members.iter().map(swarm::peer_id).collect(),
            key,
            swarm,
            topic,
            started: Instant::now(),
            relay_identified: false,
            address_candidate: false,
            relays: relays_of(cfg.listen.iter().chain(&cfg.bootstrap)),
            relayed_redial: HashMap::new(),
            payloads: HashMap::new(),
            partial: HashMap::new(),
            // The weights, the shared second moment and (under a look-ahead
            // recipe) the weights before the last update, 4 bytes each, and
            // room for the screen's memory of recent payload hashes.
            state_cap: crate::trainer::Trainer::floats_in_state(&cfg.train) * 4 * numel
                + (16 << 20),
            momentum_len: 4 * numel,
            manifests_raw: BTreeMap::new(),
            ranked_raw: HashMap::new(),
            events: Vec::new(),
            snapshots: blobs::BlobStore::new("states", cfg.spill_above),
            pending: HashMap::new(),
            deadlines: HashMap::new(),
            payload_len: 64 * 1024,
            unanswered: std::collections::VecDeque::new(),
            own_payloads: BTreeMap::new(),
            heartbeat_seq: BTreeMap::new(),
            announced: None,
            seq: 0,
            applied: 0,
            next_contribution: 0,
            syncing: false,
            sync_buf: None,
            generation: 0,
            sync_requested: None,
            sync_retry: None,
            subscribed: Default::default(),
            to_trainer,
            unpublished: Vec::new(),
            stats: NodeStats::default(),
            links: HashMap::new(),
            done: None,
            peers_done: Default::default(),
            momenta: blobs::BlobStore::new("momenta", cfg.spill_above),
            reveals: BTreeMap::new(),
            late_reveals: HashMap::new(),
            auditing: BTreeSet::new(),
            peers_auditing: BTreeSet::new(),
            policy: cfg.policy(),
            tally: Tally::default(),
            proofs: BTreeSet::new(),
            accused_by_me: BTreeSet::new(),
            cosigns: HashMap::new(),
            next_round: 0,
            owed_reports: BTreeMap::new(),
            reports,
            sharded,
            cfg,
        }
    }

    /// One event from the swarm: gossip, requests and answers, discovery.
    fn on_swarm(&mut self, ev: SwarmEvent<BehaviourEvent>) {
        match ev {
            SwarmEvent::NewListenAddr { address, .. } => {
                self.events.push(NodeEvent::Listening(address))
            }
            SwarmEvent::NewExternalAddrCandidate { address } => {
                tracing::debug!(%address, "public address candidate");
                self.address_candidate = true;
            }
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } => {
                let relayed = endpoint.is_relayed();
                self.note_route(
                    &peer_id,
                    if relayed {
                        Route::Relayed
                    } else {
                        Route::Direct
                    },
                );
            }
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(libp2p::dcutr::Event {
                remote_peer_id,
                result,
            })) => match result {
                Ok(_) => {
                    tracing::info!(peer = %remote_peer_id, "hole punched");
                    self.note_route(&remote_peer_id, Route::HolePunched)
                }
                Err(e) => tracing::info!(peer = %remote_peer_id, error = %e, "hole punch failed"),
            },
            SwarmEvent::Behaviour(BehaviourEvent::Gossip(gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            })) => {
                self.links.entry(propagation_source).or_default().1 += message.data.len() as u64;
                let verdict = self.on_gossip(&message.data);
                let _ = self
                    .swarm
                    .behaviour_mut()
                    .gossip
                    .report_message_validation_result(&message_id, &propagation_source, verdict);
                self.drive();
            }
            // Only this epoch's topic counts: the same member's run of
            // another epoch may still be up on the same key.
            SwarmEvent::Behaviour(BehaviourEvent::Gossip(gossipsub::Event::Subscribed {
                peer_id,
                topic,
            })) if topic == self.topic.hash() => {
                self.subscribed.insert(peer_id);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Gossip(gossipsub::Event::Unsubscribed {
                peer_id,
                topic,
            })) if topic == self.topic.hash() => {
                self.subscribed.remove(&peer_id);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event {
                peer,
                result: Ok(rtt),
                ..
            })) => {
                self.links.entry(peer).or_default().0 = Some(rtt);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Blobs(request_response::Event::Message {
                peer,
                message,
                ..
            })) => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => {
                    // The stalling member never answers for its payloads:
                    // the asker waits out its deadline.
                    if self.stalls(&peer, &request) {
                        self.unanswered.push_back(channel);
                        if self.unanswered.len() > 256 {
                            self.unanswered.pop_front();
                        }
                        return;
                    }
                    // Traffic is counted here, at the edge, for every
                    // kind alike: what a request or an answer carries.
                    self.stats.bytes_in += request.encode().len() as u64;
                    let resp = self.serve(&peer, request);
                    self.stats.bytes_out += resp.encode().len() as u64;
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .blobs
                        .send_response(channel, resp);
                }
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    self.links.entry(peer).or_default().1 += response.wire_len() as u64;
                    self.stats.bytes_in += response.encode().len() as u64;
                    self.on_response(request_id, response);
                    self.drive();
                }
            },
            SwarmEvent::Behaviour(BehaviourEvent::Blobs(
                request_response::Event::OutboundFailure {
                    request_id, error, ..
                },
            )) => {
                tracing::debug!(me = self.cfg.me, %error, "request failed");
                // Only a timeout is an unanswered request on an open
                // connection; the rest never reached the member.
                let why = match error {
                    request_response::OutboundFailure::Timeout => Failed::TimedOut,
                    _ => Failed::Undelivered,
                };
                self.on_failure(request_id, why);
                self.drive();
            }
            SwarmEvent::Behaviour(BehaviourEvent::Blobs(
                request_response::Event::InboundFailure { .. },
            )) => {
                self.stats.drop(Drop::Malformed);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(
                libp2p::identify::Event::Received { peer_id, info, .. },
            )) => {
                if self.relays.contains(&peer_id) {
                    self.relay_identified = true;
                }
                for a in info.listen_addrs {
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, a);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(list))) => {
                for (peer, addr) in list {
                    self.swarm
                        .behaviour_mut()
                        .kad
                        .add_address(&peer, addr.clone());
                    let _ = self.swarm.dial(addr);
                }
            }
            _ => {}
        }
    }

    /// One message from the training thread; an error when it failed.
    fn on_trainer(&mut self, msg: FromTrainer) -> Result<(), String> {
        match msg {
            FromTrainer::Ready { step, resumed } => {
                self.applied = step;
                self.syncing = self.cfg.join || resumed;
            }
            FromTrainer::Contribution {
                announce,
                bytes,
                momentum,
                compute_secs,
            } => {
                self.stats.compute_secs += compute_secs;
                self.momenta.insert(announce.step, momentum);
                self.momenta.keep_latest(2 * KEEP as usize);
                self.next_contribution = announce.step + 1;
                self.payload_len = bytes.len() as u64;
                if let Ok(took) = Duration::try_from_secs_f64(compute_secs) {
                    self.machine.on_compute(took);
                }
                // Announced once its slices reached the aggregators.
                if self.sharded_contribution(announce.clone(), &bytes) {
                    self.drive();
                    return Ok(());
                }
                self.own_payloads
                    .insert(announce.payload_hash, announce.step);
                let keep = announce.step.saturating_sub(2 * KEEP);
                self.own_payloads.retain(|_, s| *s >= keep);
                self.payloads.insert(announce.payload_hash, bytes);
                let now = self.now();
                self.machine.on_local(now, &announce);
                self.publish_announce(announce);
                self.drive();
            }
            // Sent before the trainer saw the latest rewind: its state is
            // being replaced.
            FromTrainer::Applied { generation, .. } | FromTrainer::Done { generation, .. }
                if generation < self.generation => {}
            FromTrainer::Applied {
                step,
                state_hash,
                basis,
                snapshot,
                event,
                ..
            } => {
                self.applied = step;
                if matches!(event, NodeEvent::Synced { .. }) {
                    self.next_contribution = step + 1;
                    if self.machine.next_apply().is_none() {
                        let parent = self.machine.manifest(step).map_or([0; 32], |m| m.parent);
                        self.machine.resync(step, parent);
                    }
                } else {
                    self.events.push(event);
                }
                self.machine.on_applied(step, state_hash, basis);
                self.snapshots.insert(step, snapshot);
                self.prune();
                self.drive();
            }
            FromTrainer::ForgedEntry {
                step,
                leader,
                member,
                hash,
            } => {
                self.stats.forged_entries += 1;
                self.events.push(NodeEvent::ForgedEntry {
                    step,
                    leader,
                    member,
                });
                // Proof against the leader only when the member announced
                // other bytes (and nothing else).
                if self.machine.leader_forged(step, member, &hash) {
                    let evidence = defence::forged_entry_evidence(
                        &self.cfg.job,
                        self.cfg.epoch,
                        step,
                        leader,
                        member,
                    );
                    self.accuse_leader(leader, step, evidence, Ground::ForgedEntry);
                }
            }
            FromTrainer::ForeignBasis { step, leader } => {
                tracing::warn!(
                    me = self.cfg.me,
                    step,
                    leader,
                    "a leader listed its own contribution, announced on another state"
                );
                let evidence =
                    defence::foreign_basis_evidence(&self.cfg.job, self.cfg.epoch, step, leader);
                self.accuse_leader(leader, step, evidence, Ground::ForeignBasis);
            }
            FromTrainer::StateCheck {
                step,
                leader,
                matches,
            } => match self.divergence.check(step, leader, matches) {
                Conclusion::Agreed => {}
                Conclusion::Suspect { leader } => {
                    self.stats.wrong_state_hashes += 1;
                    self.events.push(NodeEvent::WrongStateHash { step, leader });
                }
                Conclusion::Diverged => self.events.push(NodeEvent::Diverged { step }),
            },
            FromTrainer::AuditTargets { step, targets } => {
                tracing::debug!(me = self.cfg.me, step, members = ?targets.iter().map(|t| t.member).collect::<Vec<_>>(), "auditing");
                for t in targets {
                    self.auditing.insert((step, t.member));
                    self.fetch_momentum(step, t.member, t.hash);
                    if let Some(prev) = t.previous {
                        self.fetch_momentum(step - 1, t.member, prev);
                    }
                    for (s, root) in t.fetch {
                        self.fetch_sent(s, t.member, root);
                    }
                }
            }
            FromTrainer::Samples { step, samples } => {
                for s in samples {
                    self.fetch_sample(step, s);
                }
            }
            FromTrainer::AuditDone {
                step,
                member,
                report,
            } => {
                self.auditing.remove(&(step, member));
                // Done and no longer auditing: say so now, so peers staying
                // for this node's audits can leave before it does.
                if self.done.is_some() && self.auditing.is_empty() {
                    self.heartbeat();
                }
                let Some(report) = report else {
                    return Ok(());
                };
                self.stats.audits += 1;
                self.stats.audit_secs += report.secs;
                if !report.passed {
                    self.stats.audits_failed += 1;
                    self.accuse(&report);
                }
                self.events.push(NodeEvent::Audited(report));
                self.drive();
            }
            FromTrainer::Synced {
                step,
                resumed,
                credits,
            } => {
                self.events.push(NodeEvent::Synced {
                    step,
                    resumed,
                    credits,
                });
            }
            FromTrainer::Done { model_hash, .. } => {
                self.stats.model_hash = model_hash;
                self.stats.applied = self.applied;
                self.done = Some(Instant::now());
                self.heartbeat();
            }
            FromTrainer::Failed(e) => return Err(e),
        }
        Ok(())
    }

    /// Every 10 ms: start once peers are in, sync, redial, retry, and
    /// whether the node may leave now.
    fn on_tick(&mut self, life: &mut Life) -> bool {
        self.expire_requests();
        if life.waiting_start {
            let members = self
                .peers
                .iter()
                .flatten()
                .filter(|p| self.subscribed.contains(p))
                .count();
            if !self.syncing && (members >= life.min_peers || Instant::now() > life.start_deadline)
            {
                life.waiting_start = false;
                // The epoch's first step: nothing applied before it.
                self.machine.resync(self.applied, [0; 32]);
                let _ = self.to_trainer.send(ToTrainer::Start);
            } else if self.syncing {
                life.waiting_start = false;
            }
        }
        if self.syncing
            && let Some(step) = self.sync_buf.as_ref().map(|b| b.step)
            && self
                .sync_requested
                .is_some_and(|t| t.elapsed() > SYNC_STALL)
        {
            tracing::debug!(
                me = self.cfg.me,
                step,
                "state download stalled: asking the next member"
            );
            self.retry_snapshot(step);
        }
        if self.syncing
            && let Some((step, from, at)) = self.sync_retry
            && Instant::now() >= at
        {
            self.sync_retry = None;
            self.request_snapshot(step, from);
            if self.sync_buf.is_none() {
                // Not asked (gone, or this node): the one after it.
                self.retry_snapshot_after(step, from);
            }
        }
        if self.syncing
            && self.sync_buf.is_none()
            && self.sync_retry.is_none()
            && let Some(m) = self.machine.latest_manifest()
        {
            let (step, leader) = (m.step, m.leader);
            self.request_snapshot(step, leader);
            if self.sync_buf.is_none() {
                // Its leader is this node (after a rewind past its kept
                // states) or not connected: nothing else would ask again
                // once the others stop publishing.
                self.retry_snapshot_after(step, leader);
            }
        }
        if life.redial_at.elapsed() > Duration::from_secs(1) {
            life.redial_at = Instant::now();
            self.redial();
        }
        self.retry_unpublished();
        self.retry_reveals();
        self.drive();
        self.may_leave(life.linger)
    }

    /// Signs and gossips this node's announcement, with its history (as
    /// its heartbeat would carry it), and notes when: the beats soon after
    /// it are skipped (`liveness::beat_due`).
    ///
    /// The foreign-basis adversary names a made-up state there, while its
    /// own step machine holds the real one: so it lists itself when it
    /// leads, and applies the very manifest it publishes. (Adding its entry
    /// to the manifest after its machine took the manifest made it apply
    /// another one than the network did, and stall.)
    pub(super) fn publish_announce(&mut self, mut announce: msg::Announce) {
        if self.cfg.defence.adversary == Some(Mode::ForeignBasis) {
            announce.basis = crate::adversary::FOREIGN_BASIS;
        }
        (announce.chain_step, announce.chain) = self.machine.history().unwrap_or((0, [0; 32]));
        let step = announce.step;
        self.publish(msg::sign(&Body::Announce(announce), &self.key));
        self.announced = Some((Instant::now(), step));
    }

    /// How long a peer unheard of still counts as alive for leaving and
    /// for judging a reveal: [`ALIVE_WINDOW`], longer as a large job's
    /// beats thin out (`liveness::alive_window`).
    fn heard_window(&self) -> Duration {
        liveness::alive_window(self.cfg.members.len() as u32, ALIVE_WINDOW)
    }

    /// A finished node leaves once every peer is done too, or after
    /// `linger`; but it stays (up to `AUDIT_PATIENCE`) while a live peer
    /// still trains, up to `AUDIT_PATIENCE + AUDIT_GRACE` while it or a
    /// peer still audits, and longer while a report needs it.
    fn may_leave(&mut self, linger: Duration) -> bool {
        let Some(t) = self.done else {
            return false;
        };
        let n = self.cfg.members.len();
        let all = self.peers_done.len() + 1 >= n;
        // A conviction is reported on chain with the accusers'
        // co-signatures: stay until ours is no longer needed.
        let now = Instant::now();
        self.owed_reports
            .retain(|_, until| until.is_none_or(|u| u > now));
        let reporting = !self.cosigns.is_empty() || !self.owed_reports.is_empty();
        // Nor while a live peer is still training or auditing: a slow
        // member must still find peers to fetch from.
        let now_d = self.now();
        let alive = self.heard_window();
        let slow_peer = (0..n as u32).any(|m| {
            m != self.cfg.me
                && !self.peers_done.contains(&m)
                && !self.machine.is_slashed(m)
                && self.machine.heard_within(now_d, m, alive)
        });
        // A slashed peer's audits count for nothing, so its claim to be
        // auditing keeps nobody; a slashed node itself has nobody to stay for.
        // Nor one no longer heard: it crashed or left, and will not accuse.
        let peer_auditing = self
            .peers_auditing
            .iter()
            .any(|m| !self.machine.is_slashed(*m) && self.machine.heard_within(now_d, *m, alive));
        if self.machine.is_slashed(self.cfg.me) {
            return true;
        }
        // Audits (own or a peer's) wait up to `AUDIT_PATIENCE` for a reveal
        // that may have been asked for just before this node finished, then
        // need the accusations to travel: they keep it a little longer than
        // a slow peer does (seen on CI: witnesses that left at 60 s never
        // saw the silent revealer's conviction).
        let open_audits = !self.auditing.is_empty() || peer_auditing;
        let staying = (slow_peer && t.elapsed() < AUDIT_PATIENCE)
            || (open_audits && t.elapsed() < AUDIT_PATIENCE + AUDIT_GRACE);
        let limit = if reporting { linger * 12 } else { linger };
        (all && !reporting && !staying) || (t.elapsed() > limit && !staying)
    }
}

/// How long relayed dials wait for a public address (`may_dial_relayed`).
const RELAY_DIAL_WAIT: Duration = Duration::from_secs(5);
/// Longest wait between relayed redials of one address: each costs the
/// relay a circuit request, and a member that is down stays down a while.
const RELAY_REDIAL_MAX: Duration = Duration::from_secs(60);

fn is_relayed(a: &libp2p::Multiaddr) -> bool {
    a.iter()
        .any(|p| p == libp2p::multiaddr::Protocol::P2pCircuit)
}

/// The peer ids an address names, in order: a relayed address names the
/// relay first and the peer last (`/p2p/RELAY/p2p-circuit/p2p/PEER`).
fn peer_ids(a: &libp2p::Multiaddr) -> impl Iterator<Item = PeerId> + '_ {
    a.iter().filter_map(|p| match p {
        libp2p::multiaddr::Protocol::P2p(id) => Some(id),
        _ => None,
    })
}

/// The relays named in relayed addresses (the first peer id of each).
fn relays_of<'a>(addrs: impl Iterator<Item = &'a libp2p::Multiaddr>) -> HashSet<PeerId> {
    addrs
        .filter(|a| is_relayed(a))
        .filter_map(|a| peer_ids(a).next())
        .collect()
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
    let mut swarm = swarm::build(&key, cfg.link, cfg.mdns, cfg.gossip_signing)?;
    for a in &cfg.listen {
        swarm.listen_on(a.clone()).map_err(|e| {
            NodeError::Config(format!("cannot listen on {a}: {}", swarm::describe(&e)))
        })?;
    }
    // Relayed addresses are dialed by `redial` (see `may_dial_relayed`).
    for a in cfg.bootstrap.iter().filter(|a| !is_relayed(a)) {
        if let Err(e) = swarm.dial(a.clone()) {
            return Err(NodeError::Config(format!("cannot dial {a}: {e}")));
        }
    }
    let topic = swarm::topic(&cfg.job, cfg.epoch);
    swarm
        .behaviour_mut()
        .gossip
        .subscribe(&topic)
        .map_err(|e| NodeError::Config(format!("gossip subscribe: {e}")))?;
    let (params, thresholds) = swarm::scoring(&topic);
    swarm
        .behaviour_mut()
        .gossip
        .with_peer_score(params, thresholds)
        .map_err(|e| NodeError::Config(format!("gossip scoring: {e}")))?;
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
    let reports = control.is_some();
    let sharded = match cfg.exchange {
        Some(plan) => Some(sharded::Sharded::new(&cfg, plan).map_err(NodeError::Config)?),
        None => None,
    };
    let mut net = Net::new(cfg, key, swarm, topic, to_trainer, reports, sharded);
    let mut life = Life::new(&net.cfg, n);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut beat = tokio::time::interval(liveness::beat_interval(net.cfg.members.len() as u32));
    let mut beats = 0u64;
    let mut trainer_open = true;
    let failed = loop {
        for e in std::mem::take(&mut net.events) {
            on_event(&e);
        }
        tokio::select! {
            ev = net.swarm.select_next_some() => net.on_swarm(ev),
            msg = from_trainer.recv(), if trainer_open => {
                // After `Done` the thread ends and closes the channel; the
                // node lingers to serve peers still finishing.
                let Some(msg) = msg else {
                    trainer_open = false;
                    if net.done.is_none() {
                        break None;
                    }
                    continue;
                };
                if let Err(e) = net.on_trainer(msg) {
                    break Some(e);
                }
            }
            _ = tick.tick() => {
                if net.on_tick(&mut life) {
                    break None;
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
                net.beat();
                beats += 1;
                if beats.is_multiple_of(4) {
                    on_event(&NodeEvent::Links(net.peer_links()));
                }
            }
        }
    };
    // A last heartbeat, given a moment to leave: peers staying for this
    // node's audits learn at once that it is done (without it, one that
    // left before its next beat kept them for the whole patience, 60 s,
    // and the next epoch started without them).
    if failed.is_none() {
        net.heartbeat();
        let flush = tokio::time::sleep(Duration::from_millis(300));
        tokio::pin!(flush);
        loop {
            tokio::select! {
                _ = &mut flush => break,
                ev = net.swarm.select_next_some() => net.on_swarm(ev),
            }
        }
    }
    for e in std::mem::take(&mut net.events) {
        on_event(&e);
    }
    if let Some(e) = failed {
        let _ = worker.join();
        return Err(NodeError::Trainer(e));
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
