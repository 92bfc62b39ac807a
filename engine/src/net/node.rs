//! One member of a job on the network: a training thread that owns the
//! [`Trainer`] and a network task that owns the swarm and the
//! [`StepMachine`]. They talk through channels, so training never waits on
//! I/O except where the protocol says it must (the manifest of step t-1
//! before computing step t+1).

use super::diverge::{Conclusion, DivergenceVote};
pub use super::events::*;
use super::guard::Revealed;
use super::msg::{self, Accuse, Body, Drop, Heartbeat, Manifest, Request, Response, Signed};
use super::step::{Action, KEEP, StepMachine, Verdict};
use super::swarm::{self, Behaviour, BehaviourEvent};
use super::train::{FromTrainer, ToTrainer, now_us, train_loop};
use crate::adversary::Mode;
use crate::audit;
use crate::backend::GradientEngine;
use crate::data::Corpus;
use crate::defence::{self, Ground, Policy, Tally};
use crate::trainer::{Identity, Trainer};
use libp2p::futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance};
use libp2p::identity::ed25519;
use libp2p::request_response::{self, OutboundRequestId};
use libp2p::swarm::SwarmEvent;
use libp2p::{PeerId, Swarm, ping};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

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
    done: Option<Instant>,
    peers_done: std::collections::BTreeSet<u32>,
    /// This member's momentum before each of its recent contributions:
    /// what it reveals when audited.
    momenta: BTreeMap<u32, Arc<Vec<u8>>>,
    /// Momentum downloads for audits: (step, member) → progress.
    reveals: BTreeMap<(u32, u32), Reveal>,
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
    /// (served by the leader itself), leaving out the next other member's
    /// contribution. It then signs a second manifest for the same attempt
    /// (see `drive`).
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
            let now = self.now();
            self.machine.on_payload(now, hash);
            entry.1 = hash;
            // And it censors: the next other member is left out.
            let forged = entry.0;
            if let Some(pos) = m
                .entries
                .iter()
                .position(|(who, _)| *who != me && *who != forged)
            {
                m.entries.remove(pos);
            }
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
            // Another epoch's: at an epoch boundary an honest forwarder may
            // still be in it.
            if h.epoch != self.cfg.epoch {
                return Err(Drop::OutOfWindow);
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
                return acceptance(d);
            }
        };
        let now = self.now();
        // Signs of life come from fresh messages only (a heartbeat with a
        // new sequence number, a new announcement or manifest): anyone can
        // re-gossip a dead leader's old ones.
        match signed.body {
            Body::Announce(a) => match self.machine.on_announce(now, &a) {
                Verdict::Accepted => self.stats.accepted += 1,
                Verdict::Duplicate => {
                    self.stats.drop(Drop::Replayed);
                    return acceptance(Drop::Replayed);
                }
                // Not forwarded, not held against the forwarder (which may
                // have seen the other one first).
                Verdict::Equivocation => {
                    self.stats.equivocations += 1;
                    return MessageAcceptance::Ignore;
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
                self.machine.on_alive(now, h.member);
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

    /// A signed manifest: applied, ranked or dropped by the step machine;
    /// a leader's second manifest for one attempt on one history is proof
    /// against it.
    fn on_manifest(&mut self, m: Manifest, raw: Vec<u8>) -> MessageAcceptance {
        let seen = self.machine.evidence.len();
        let verdict = self.rank_manifest(m, raw);
        for o in std::mem::take(&mut self.machine.omissions) {
            *self.stats.omissions.entry(o.leader).or_default() += 1;
            self.events.push(NodeEvent::Omitted {
                step: o.step,
                leader: o.leader,
                member: o.member,
            });
        }
        let fresh: Vec<(u32, u32, u8)> = self.machine.evidence[seen..]
            .iter()
            .filter(|e| e.proves_fraud())
            .map(|e| (e.first.leader, e.first.step, e.first.attempt))
            .collect();
        for (leader, step, attempt) in fresh {
            let evidence = defence::equivocation_evidence(
                &self.cfg.job,
                self.cfg.epoch,
                step,
                attempt,
                leader,
            );
            self.accuse_leader(leader, step, evidence, Ground::Equivocation);
        }
        verdict
    }

    fn rank_manifest(&mut self, m: Manifest, raw: Vec<u8>) -> MessageAcceptance {
        let step = m.step;
        let leader = m.leader;
        let now = self.now();
        let verdict = self.machine.on_manifest(now, m);
        if matches!(
            verdict,
            Verdict::Accepted | Verdict::Superseded | Verdict::Rewind | Verdict::Equivocation
        ) {
            self.machine.on_alive(now, leader);
        }
        match verdict {
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
                acceptance(Drop::Replayed)
            }
            Verdict::WrongLeader => {
                self.stats.drop(Drop::WrongLeader);
                acceptance(Drop::WrongLeader)
            }
            // Forwarded: the second signed manifest is the proof other
            // witnesses need (the machine keeps a bounded number per
            // attempt; past that they are duplicates).
            Verdict::Equivocation => {
                self.stats.equivocations += 1;
                MessageAcceptance::Accept
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
        let id = self.send(&peer, req);
        self.pending.insert(id, what);
        true
    }

    /// Sends a request with a deadline scaled to the answer's size: a peer
    /// that trickles costs that long, not the transport's 20 s.
    fn send(&mut self, peer: &PeerId, req: Request) -> OutboundRequestId {
        let bytes = match &req {
            Request::Payload(_) => self.payload_len,
            Request::Snapshot { .. } | Request::Momentum { .. } => msg::SNAPSHOT_CHUNK as u64,
            Request::Manifest { .. } => msg::MAX_GOSSIP as u64,
            Request::Cosign(_) => 0,
        };
        let deadline = Instant::now() + self.cfg.timing.deadline(bytes);
        let id = self.swarm.behaviour_mut().blobs.send_request(peer, req);
        self.deadlines.insert(id, deadline);
        id
    }

    /// The stalling attacker answers a request for its payload only from
    /// that step's first leader (so the payload gets listed) and leaves
    /// everyone else waiting: an author that trickles.
    fn stalls(&self, from: &PeerId, req: &Request) -> bool {
        let Request::Payload(hash) = req else {
            return false;
        };
        if self.cfg.defence.adversary != Some(Mode::Stalling) {
            return false;
        }
        let asker = self.peers.iter().position(|p| p.as_ref() == Some(from));
        let step = self.own_payloads.get(hash).copied();
        match (asker, step) {
            (Some(asker), Some(step)) => self.machine.leader(step, 0) != asker as u32,
            _ => true,
        }
    }

    /// Requests past their deadline fail now (a late answer is ignored).
    fn expire_requests(&mut self) {
        let now = Instant::now();
        let late: Vec<OutboundRequestId> = self
            .deadlines
            .iter()
            .filter(|(_, d)| now >= **d)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.deadlines.remove(&id);
            self.stats.timed_out += 1;
            self.on_failure(id);
        }
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
        let id = self.send(&peer, Request::Snapshot { step, offset: 0 });
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
        tracing::debug!(
            me = self.cfg.me,
            member,
            step,
            tries = r.tries,
            answered,
            "momentum fetch failed"
        );
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
        self.accuse_with(
            report.member,
            report.step,
            report.evidence,
            report.ground,
            report
                .comparison
                .map_or((0, 0), |c| (bp(c.overlap), bp(c.agreement))),
        );
    }

    /// This witness holds proof against `leader` by itself (two signed
    /// manifests for one attempt on one history, or an entry its member
    /// never signed): it accuses, once per evidence.
    fn accuse_leader(&mut self, leader: u32, step: u32, evidence: [u8; 32], ground: Ground) {
        let me = self.cfg.me;
        if leader == me || !self.policy.witnesses.contains(&me) || !self.proofs.insert(evidence) {
            return;
        }
        tracing::info!(
            me,
            leader,
            step,
            ?ground,
            "accusing a leader on proof it holds"
        );
        self.accuse_with(leader, step, evidence, ground, (0, 0));
    }

    fn accuse_with(
        &mut self,
        accused: u32,
        step: u32,
        evidence: [u8; 32],
        ground: Ground,
        (overlap, agreement): (u16, u16),
    ) {
        let a = Accuse {
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            step,
            accused,
            witness: self.cfg.me,
            evidence,
            overlap,
            agreement,
            ground,
        };
        self.accused_by_me.insert(accused);
        self.events.push(NodeEvent::Accused {
            member: accused,
            step,
            evidence,
            ground,
        });
        self.publish(msg::sign(&Body::Accuse(a.clone()), &self.key));
        self.on_accuse(&a);
    }

    /// Counts an accusation under the defence policy (an auditor of that
    /// contribution, or proof; a quorum on the same evidence convicts), and
    /// confirms another auditor's drawn audit this node is an auditor of.
    fn on_accuse(&mut self, a: &Accuse) -> MessageAcceptance {
        let n = self.cfg.members.len() as u32;
        if a.accused >= n {
            self.stats.drop(Drop::NotMember);
            return acceptance(Drop::NotMember);
        }
        if a.epoch != self.cfg.epoch {
            self.stats.drop(Drop::OutOfWindow);
            return acceptance(Drop::OutOfWindow);
        }
        let accusation = defence::Accusation {
            witness: a.witness,
            accused: a.accused,
            step: a.step,
            evidence: a.evidence,
            ground: a.ground,
        };
        let conviction = match self.tally.add(&self.policy, &accusation) {
            Ok(c) => c,
            Err(why) => {
                // Who counts changes as witnesses are slashed, so a
                // forwarder may still have counted it: not held against it.
                tracing::debug!(me = self.cfg.me, witness = a.witness, accused = a.accused, %why, "accusation not counted");
                self.stats.drop(Drop::NotMember);
                return MessageAcceptance::Ignore;
            }
        };
        let me = self.cfg.me;
        if let Ground::Drawn { by, coin } = a.ground
            && a.witness != me
            && self.policy.is_auditor(me, a.step, a.accused)
        {
            let _ = self.to_trainer.send(ToTrainer::Confirm {
                step: a.step,
                member: a.accused,
                by,
                coin,
            });
        }
        let Some(c) = conviction else {
            return MessageAcceptance::Accept;
        };
        if self.machine.is_slashed(c.accused) {
            return MessageAcceptance::Accept;
        }
        self.machine.slash(c.accused);
        self.policy.slash(c.accused);
        self.stats.slashed.insert(c.accused);
        // Its open audits are moot now: nobody waits for them.
        let accused = c.accused;
        self.auditing.retain(|(_, m)| *m != accused);
        self.reveals.retain(|(_, m), _| *m != accused);
        // Only the first `quorum` accusers sign the report; the first
        // of them sends it.
        let quorum = self.policy.audit.quorum.max(1).min(c.witnesses.len());
        let signers = &c.witnesses[..quorum];
        let owes = if signers.first() == Some(&me) {
            self.reports
        } else {
            signers.contains(&me) && self.cfg.defence.cosigner.is_some()
        };
        if owes {
            self.owed_reports.insert(c.accused, None);
        }
        let _ = self.to_trainer.send(ToTrainer::Slashed(c.accused));
        self.events.push(NodeEvent::Slashed {
            member: c.accused,
            step: c.step,
            witnesses: c.witnesses,
            evidence: c.evidence,
        });
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
        self.deadlines.remove(&id);
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        match (p, resp) {
            (Pending::Payload(hash), Response::Payload(bytes)) => {
                self.stats.bytes_in += bytes.len() as u64;
                if *blake3::hash(&bytes).as_bytes() == hash && bytes.len() <= msg::MAX_RESPONSE {
                    self.payloads.insert(hash, bytes);
                    let now = self.now();
                    self.machine.on_payload(now, hash);
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
                    let offset = buf.len() as u32;
                    let id = self.send(&peer, Request::Snapshot { step, offset });
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
        self.deadlines.remove(&id);
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
            tracing::trace!(me = self.cfg.me, action = ?a);
            match a {
                Action::Fetch { hash, from } => {
                    if !self.ask(from, Request::Payload(hash), Pending::Payload(hash)) {
                        self.machine.on_fetch_failed(hash);
                    }
                }
                Action::RequestManifest { step, from } => {
                    self.ask(from, Request::Manifest { step }, Pending::Manifest);
                }
                // The stalling member leads in silence.
                Action::Publish(_) if self.cfg.defence.adversary == Some(Mode::Stalling) => {}
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
                    self.manifests_raw.insert(m.step, raw.clone());
                    self.publish(raw);
                    if let Some(t) = twin {
                        self.publish(msg::sign(&Body::Manifest(t), &self.key));
                    }
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

    fn heartbeat(&mut self) {
        self.note_scores();
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
/// What gossipsub is told about a dropped message: rejected (and held
/// against the forwarder's score) only when every honest node drops it too.
fn acceptance(d: Drop) -> MessageAcceptance {
    if d.blames_forwarder() {
        MessageAcceptance::Reject
    } else {
        MessageAcceptance::Ignore
    }
}

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
        deadlines: HashMap::new(),
        payload_len: 64 * 1024,
        unanswered: std::collections::VecDeque::new(),
        own_payloads: BTreeMap::new(),
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
        done: None,
        peers_done: Default::default(),
        momenta: BTreeMap::new(),
        reveals: BTreeMap::new(),
        auditing: BTreeSet::new(),
        peers_auditing: BTreeSet::new(),
        policy: Policy {
            audit: cfg.defence.audit,
            witnesses: cfg.defence.witnesses.clone(),
            seed: cfg.seed,
            job: cfg.job,
            epoch: cfg.epoch,
        },
        tally: Tally::default(),
        proofs: BTreeSet::new(),
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
                        // The stalling member never answers for its
                        // payloads: the asker waits out its deadline.
                        if net.stalls(&peer, &request) {
                            net.unanswered.push_back(channel);
                            if net.unanswered.len() > 256 {
                                net.unanswered.pop_front();
                            }
                            continue;
                        }
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
                    tracing::debug!(me = net.cfg.me, %error, "request failed");
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
                        net.payload_len = bytes.len() as u64;
                        net.own_payloads.insert(announce.payload_hash, announce.step);
                        let keep = announce.step.saturating_sub(2 * KEEP);
                        net.own_payloads.retain(|_, s| *s >= keep);
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
                    FromTrainer::ForgedEntry { step, leader, member, hash } => {
                        net.stats.forged_entries += 1;
                        on_event(&NodeEvent::ForgedEntry { step, leader, member });
                        // Proof against the leader only when the member
                        // announced other bytes (and nothing else).
                        if net.machine.leader_forged(step, member, &hash) {
                            let evidence = defence::forged_entry_evidence(&net.cfg.job, net.cfg.epoch, step, leader, member);
                            net.accuse_leader(leader, step, evidence, Ground::ForgedEntry);
                        }
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
                        tracing::debug!(me = net.cfg.me, step, members = ?targets.iter().map(|t| t.member).collect::<Vec<_>>(), "auditing");
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
                net.expire_requests();
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
