//! The sharded exchange in virtual time: every node runs the real
//! [`StepMachine`] for step agreement and the real [`Exchange`] for the
//! data plane; compute, every transfer (pushed slices, fetched slices,
//! sums, a recomputation's slices) and gossip are modelled as in
//! [`super::sim`]: an uplink is shared by what it sends at once, a
//! downlink serves first come, first served, a share of requests fails at
//! the node's request deadline, and the job's gossip takes its share of
//! every link: heartbeats all the time ([`SimConfig::less_gossip`]), and
//! each step's announcements and manifests as a transfer on the uplink
//! and the downlink when the node computed the step
//! ([`super::liveness`]). A seat's signed sum hashes go to every member
//! by request, one transfer on its uplink per shard, each request failing
//! as any does, and every sum served carries the hashes its server holds
//! (message version 9). The libp2p node runs the same machines
//! (`node::sharded`).

use super::exchange::{self, Action as XAction, Exchange, Hash, ManifestId};
use super::msg::{Announce, Manifest};
use super::sim::{Alarm, Events, Rng, SimConfig, SimResult, Uplink};
use super::step::{Action, StepMachine};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct ShardedConfig {
    pub base: SimConfig,
    /// Aggregators per shard.
    pub redundancy: usize,
    /// Shards per step; 0 means one per member (a what-if: the node cuts
    /// [`exchange::shard_count`], which `cohort-bench simulate` passes).
    pub shards: usize,
    /// Nodes, on average, that recompute each shard from its slices every
    /// step ([`exchange::checks`]).
    pub spots: usize,
    /// Nodes, on average, that recompute a shard one of whose aggregators
    /// is silent.
    pub backups: usize,
    /// Sign positions in one payload (its body's bits).
    pub positions: u64,
    /// Bits per position of a published sum.
    pub sum_bits: u32,
    pub timing: exchange::Timing,
    /// Members that announce but never push nor serve a slice (an attack
    /// on the step's liveness).
    pub withholding: Vec<u32>,
    /// What the job's gossip costs the links.
    pub gossip: GossipCost,
    /// Who serves a shard's sum.
    pub sums_from: SumSource,
}

/// Who serves a shard's sum: its seats, as the node does, or, as a
/// what-if that bounds a redesign, any node the sum has already reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SumSource {
    /// The seat the exchange asks.
    #[default]
    Seats,
    /// A node drawn at random among those that hold the sum already (its
    /// seats once they published it, and every node it reached), or the
    /// seat asked while nobody else does. The answer counts as the seat's
    /// (the asker checks it against the seats' signed hashes either way).
    /// Idealised: every node knows at once who holds what, which the
    /// node would have to learn (from a seeded relay tree, say).
    Holders,
}

impl SumSource {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "seats" => Some(Self::Seats),
            "holders" => Some(Self::Holders),
            _ => None,
        }
    }
}

/// What the job's gossip costs the links: the node's, the node's before
/// message version 9, or a what-if that bounds what a redesign of it
/// could gain (the messages still arrive when they would; only their
/// bytes are left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GossipCost {
    /// Heartbeats, announcements and manifests, as the node gossips them
    /// ([`super::liveness`]); the sum hashes go by request.
    #[default]
    Shipped,
    /// The node's gossip with every seat's sum hash gossiped too, as
    /// before message version 9 (and none sent by request nor carried by
    /// a sum).
    HashesGossiped,
    /// No gossip bytes at all (the sum hashes still go by request).
    Free,
}

impl GossipCost {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "shipped" => Some(Self::Shipped),
            "hashes-gossiped" => Some(Self::HashesGossiped),
            "free" => Some(Self::Free),
            _ => None,
        }
    }
}

/// Bytes a signed message carries besides its body (header, signature).
const ENVELOPE: f64 = 100.0;
/// A seat's signed sum hash sent to a member (`msg::Request::Claim`: kind,
/// step, shard, manifest, hash, signature), with a request's [`ENVELOPE`].
pub const CLAIM_BYTES: f64 = 1.0 + 4.0 + 4.0 + 32.0 + 32.0 + 64.0 + ENVELOPE;

impl ShardedConfig {
    pub fn shard_count(&self) -> usize {
        if self.shards == 0 {
            self.base.nodes.max(1) as usize
        } else {
            self.shards
        }
    }

    /// One member's slice of one shard: its signs, the Merkle path to the
    /// root it signed, and the envelope.
    pub fn slice_bytes(&self) -> f64 {
        let s = self.shard_count() as f64;
        let path = 32.0 * s.log2().ceil().max(0.0);
        self.positions as f64 / 8.0 / s + path + ENVELOPE
    }

    /// One shard's published sum.
    pub fn sum_bytes(&self) -> f64 {
        self.positions as f64 * self.sum_bits as f64 / 8.0 / self.shard_count() as f64 + ENVELOPE
    }

    /// Every shard's sum: what each node downloads per step.
    pub fn aggregate_bytes(&self) -> f64 {
        self.sum_bytes() * self.shard_count() as f64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ShardedResult {
    pub run: SimResult,
    /// Bytes sent and received per node per applied step: mean over nodes,
    /// and the most any node moved.
    pub up_mean: f64,
    pub up_max: f64,
    pub down_mean: f64,
    pub down_max: f64,
    /// Of `up_mean` and `down_mean`: the job's gossip (heartbeats,
    /// announcements, manifests, sum hashes), per node per applied step.
    pub gossip: f64,
    /// Recomputations per node per step (spot checks and disputes).
    pub recomputes: f64,
    pub convictions: u64,
    /// Where a step's time goes: mean seconds from a node's compute of a
    /// step ending to each later mark of that step at that node.
    pub phases: Phases,
    /// What `up_mean` carries, per node per applied step.
    pub uploads: Uploads,
}

/// A node's upload per applied step by what it carries (means over nodes).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Uploads {
    /// Its own slices, pushed to each shard's seats.
    pub pushes: f64,
    /// Sums served, as a seat.
    pub sums: f64,
    /// Slices served to recomputations (spot checks and backups).
    pub recomputes: f64,
    /// Slices served to seats that lacked them, to probes and hand-overs.
    pub slices: f64,
    /// The job's gossip: heartbeats, announcements, manifests (and sum
    /// hashes under [`GossipCost::HashesGossiped`]).
    pub gossip: f64,
    /// Its signed sum hashes sent to every member, as a seat.
    pub claims: f64,
}

/// Mean seconds after a node finished computing a step until it reached
/// each mark of that step (over nodes and steps that reached it).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Phases {
    /// Its slices held by a seat of every shard: it announces.
    pub announced: f64,
    /// The step's manifest reached it.
    pub manifest: f64,
    /// The last seat's signed sum hash reached it: a step's sums can be
    /// taken no sooner (unless a silent seat is waited out).
    pub signed: f64,
    /// Every shard's sum accepted.
    pub accepted: f64,
    /// The step applied.
    pub applied: f64,
}

/// The marks of [`Phases`], in order, after the compute's end (index 0).
const MARKS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum What {
    Push {
        step: u32,
        shard: u32,
    },
    Slice {
        step: u32,
        shard: u32,
        member: u32,
    },
    /// A shard's sum, as if from `seat` (its server may be another
    /// holder under [`SumSource::Holders`]).
    Sum {
        step: u32,
        shard: u32,
        seat: u32,
    },
    Slices {
        step: u32,
        shard: u32,
        manifest: ManifestId,
    },
    /// One step's gossip, relayed by this node (it goes to nobody in
    /// particular: its bytes only share the uplink).
    Gossip {
        step: u32,
    },
    /// This seat's signed hash of a shard's sum, to every other member
    /// (one transfer for all of them).
    Claims {
        step: u32,
        shard: u32,
        manifest: ManifestId,
    },
    /// A member's slice, asked to check a seat's claim that it is withheld.
    Probe {
        step: u32,
        shard: u32,
        member: u32,
    },
    /// A member's slice handed to a seat that claimed it withheld.
    Hand {
        step: u32,
        shard: u32,
        member: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    ComputeDone {
        node: u32,
        step: u32,
    },
    /// `node` is asked by `to` for `what` (or pushes it).
    Request {
        node: u32,
        to: u32,
        what: What,
    },
    UplinkDone {
        node: u32,
        version: u64,
    },
    Arrive {
        node: u32,
        from: u32,
        what: What,
    },
    Pushed {
        node: u32,
        step: u32,
        shard: u32,
        to: u32,
    },
    Failed {
        node: u32,
        from: u32,
        what: What,
    },
    Announce {
        node: u32,
        from: u32,
        step: u32,
    },
    Manifest {
        node: u32,
        idx: usize,
    },
    SumHashes {
        node: u32,
        from: u32,
        step: u32,
        manifest: ManifestId,
        shards: Vec<u32>,
    },
    /// Seat `from` claims `member`'s slice of `shard` withheld.
    Claim {
        node: u32,
        from: u32,
        step: u32,
        shard: u32,
        member: u32,
        manifest: ManifestId,
    },
    Tick {
        node: u32,
    },
    ApplyDone {
        node: u32,
        step: u32,
        /// The node's rewinds when the apply began.
        rewinds: u32,
    },
}

impl Ev {
    fn node(&self) -> u32 {
        match self {
            Ev::ComputeDone { node, .. }
            | Ev::Request { node, .. }
            | Ev::UplinkDone { node, .. }
            | Ev::Arrive { node, .. }
            | Ev::Pushed { node, .. }
            | Ev::Failed { node, .. }
            | Ev::Announce { node, .. }
            | Ev::Manifest { node, .. }
            | Ev::SumHashes { node, .. }
            | Ev::Claim { node, .. }
            | Ev::Tick { node }
            | Ev::ApplyDone { node, .. } => *node,
        }
    }
}

struct Node {
    steps: StepMachine,
    ex: Exchange,
    opened: u32,
    speed: f64,
    up: f64,
    down: f64,
    latency: f64,
    uplink: Uplink<What>,
    down_free: f64,
    applied: u32,
    /// Entries of the manifest this node applied at each step (a rewind
    /// replaces them).
    contributions: BTreeMap<u32, u64>,
    /// Rewinds so far: an apply begun before the latest is void.
    rewinds: u32,
    /// The step being applied, if any.
    applying: Option<u32>,
    next_compute: u32,
    busy: bool,
    ready: BTreeSet<u32>,
    compute_total: f64,
    /// Seconds the compute in flight takes (what the node measures).
    computing: f64,
    done_at: Option<f64>,
    /// When the node next wakes for its machines' deadlines.
    alarm: Alarm,
    up_bytes: f64,
    down_bytes: f64,
    /// Of them, each way: the job's gossip.
    gossip_bytes: f64,
    /// Of `up_bytes`: pushes, sums, recomputations' slices, other slices,
    /// claims (as [`Uploads`]).
    up_kinds: [f64; 5],
    recomputes: u64,
    /// The step machine's next deadline when it was last polled.
    steps_deadline: Option<Duration>,
    /// Per step, when each of its marks ([`Phases`]) was first reached.
    marks: BTreeMap<u32, [Option<f64>; MARKS]>,
    /// Per step, when its last sum hash came.
    last_hash: BTreeMap<u32, f64>,
}

impl Node {
    /// `bytes` sent to this node reach it: no sooner than `at`, and after
    /// what its downlink is still receiving (first come, first served).
    /// When they are in.
    fn receive(&mut self, at: f64, bytes: f64) -> f64 {
        self.down_bytes += bytes;
        self.down_free = at.max(self.down_free + bytes / self.down);
        self.down_free
    }

    fn mark(&mut self, step: u32, which: usize, now: f64) {
        let m = self.marks.entry(step).or_default();
        m[which].get_or_insert(now);
    }
}

const TRUE_SUM: Hash = [1; 32];

fn hash_of(step: u32, member: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..4].copy_from_slice(&step.to_le_bytes());
    h[4..8].copy_from_slice(&member.to_le_bytes());
    h[8] = 2;
    h
}

/// Runs the sharded exchange; `free_network` removes every transfer cost.
pub fn simulate_sharded(cfg: &ShardedConfig, free_network: bool) -> ShardedResult {
    let base = &cfg.base;
    let mut rng = Rng::new(base.seed);
    let n = base.nodes.max(1);
    let job = [9u8; 32];
    let shards = cfg.shard_count();
    let members: Vec<u32> = (0..n).collect();
    let seating: Vec<_> = (0..base.steps)
        .map(|t| {
            exchange::seating(&job, t, &members, shards, cfg.redundancy.min(n as usize))
                .expect("redundancy within the member count")
        })
        .collect();
    let huge = 1e30;
    // The job's gossip: heartbeats all the time, and each step's
    // announcements and manifests (and before message version 9 sum
    // hashes) sent and received with it.
    let gossiped = cfg.gossip == GossipCost::HashesGossiped;
    let (heartbeats, step_gossip) = match cfg.gossip {
        GossipCost::Shipped => (
            super::liveness::heartbeat_bytes_per_sec(n),
            super::liveness::step_gossip_bytes(n, 0),
        ),
        GossipCost::HashesGossiped => (
            super::liveness::heartbeat_bytes_per_sec(n),
            super::liveness::step_gossip_bytes(n, (shards * cfg.redundancy) as u64),
        ),
        GossipCost::Free => (0.0, 0.0),
    };
    // What a sum answer carries besides the sum: its seats' signed hashes.
    let attached = if gossiped {
        0.0
    } else {
        (cfg.redundancy * super::msg::CLAIM_BYTES) as f64
    };
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| {
            let (up, down, latency) = (
                rng.uniform(base.up_mbit) * 1e6 / 8.0,
                rng.uniform(base.down_mbit) * 1e6 / 8.0,
                rng.uniform(base.latency_ms) / 1e3,
            );
            let (up, down) = base.less_gossip(up, down, heartbeats);
            Node {
                steps: StepMachine::new(
                    job,
                    0,
                    [7; 32],
                    n,
                    i,
                    super::sim::heard(base.timing),
                    Some(0),
                ),
                ex: Exchange::new(i, cfg.timing),
                opened: 0,
                speed: rng.uniform((1.0 - base.speed_spread, 1.0 + base.speed_spread)),
                up: if free_network { huge } else { up },
                down: if free_network { huge } else { down },
                latency: if free_network { 0.0 } else { latency },
                uplink: Uplink::default(),
                down_free: 0.0,
                applied: 0,
                contributions: BTreeMap::new(),
                rewinds: 0,
                applying: None,
                next_compute: 0,
                busy: false,
                ready: BTreeSet::new(),
                compute_total: 0.0,
                computing: 0.0,
                done_at: None,
                alarm: Alarm::default(),
                up_bytes: 0.0,
                down_bytes: 0.0,
                gossip_bytes: 0.0,
                up_kinds: [0.0; 5],
                recomputes: 0,
                steps_deadline: None,
                marks: BTreeMap::new(),
                last_hash: BTreeMap::new(),
            }
        })
        .collect();
    // Opens every step up to `step` at a node, with its secret spot checks.
    let open = |x: &mut Node, node: u32, step: u32| {
        while x.opened <= step && (x.opened as usize) < seating.len() {
            let t = x.opened;
            let mut pick =
                Rng(base.seed ^ ((node as u64) << 32) ^ t as u64 ^ 0x9e37_79b9_7f4a_7c15);
            let (spots, backups) =
                exchange::checks(shards, cfg.spots, cfg.backups, n as usize, || pick.next());
            x.ex.open(
                t,
                seating[t as usize].0.clone(),
                seating[t as usize].1.clone(),
                &spots,
                &backups,
            );
            x.opened += 1;
        }
    };
    let withholds = |x: u32| cfg.withholding.contains(&x);
    let honest: Vec<u32> = (0..n).filter(|&i| !withholds(i)).collect();
    let bytes = |w: &What, listed: usize| match w {
        What::Push { .. } | What::Slice { .. } | What::Probe { .. } | What::Hand { .. } => {
            cfg.slice_bytes()
        }
        What::Sum { .. } => cfg.sum_bytes() + attached,
        What::Slices { .. } => cfg.slice_bytes() * listed as f64,
        What::Gossip { .. } => step_gossip,
        What::Claims { .. } => CLAIM_BYTES * n.saturating_sub(1) as f64,
    };
    let failure = if free_network {
        0.0
    } else {
        base.fetch_failure
    };
    let mut manifests: Vec<Manifest> = Vec::new();
    // Sums published: (step, shard, aggregator).
    let mut published: HashSet<(u32, u32, u32)> = HashSet::new();
    // Who holds each (step, shard)'s sum, under [`SumSource::Holders`].
    let mut holders: HashMap<(u32, u32), Vec<u32>> = HashMap::new();
    let mut held: HashSet<(u32, u32, u32)> = HashSet::new();
    // Its own draws, so that the run's other draws stay those of `Seats`.
    let mut pick = Rng::new(base.seed ^ 0x686f_6c64_6572_7321);
    // Which sent claims fail, drawn apart for the same reason.
    let mut lost = Rng::new(base.seed ^ 0x636c_6169_6d73_2121);
    // The signed hashes a sum answer carries: (server, asker, step, shard)
    // → (seat, manifest), as the server held them when asked.
    type Carried = HashMap<(u32, u32, u32, u32), Vec<(u32, ManifestId)>>;
    let mut carried = Carried::new();
    let mut queue = Events::new();
    let mut contributors = (0u64, 0u64);
    let mut convictions = 0u64;
    for i in 0..n {
        nodes[i as usize].steps.on_applied(0, [0; 32], [0; 32]);
        queue.at(0.0, Ev::Tick { node: i });
    }
    let link =
        |nodes: &[Node], a: u32, b: u32| nodes[a as usize].latency + nodes[b as usize].latency;
    let announce = |step: u32, member: u32| Announce {
        job,
        epoch: 0,
        step,
        member,
        payload_hash: hash_of(step, member),
        momentum_hash: [0; 32],
        // The state the simulated trainer reached before step - 1.
        basis: [step.saturating_sub(1) as u8; 32],
        len: base.payload_bytes as u32,
        produced_us: 0,
        chain_step: 0,
        chain: [0; 32],
    };
    // Listed members per step, as the manifest a node applies says (the
    // same everywhere in an honest run).
    let mut listed: Vec<usize> = vec![n as usize; base.steps as usize];
    let mut now = 0.0f64;
    let mut finished = 0usize;
    // A run that stalls ends here, with the steps every node applied.
    let horizon = base.steps as f64 * (10.0 * base.compute_secs + 600.0);
    while let Some((t, ev)) = queue.pop() {
        now = t as f64 / 1e9;
        if now > horizon {
            break;
        }
        // When a gossip message sent now reaches `to` (itself at once).
        let gossip_at = move |nodes: &[Node], from: u32, to: u32| {
            if to == from {
                now
            } else {
                now + link(nodes, from, to)
            }
        };
        let d = Duration::from_nanos(t);
        let node = ev.node();
        tracing::trace!(t = now, ?ev, "sharded sim event");
        let ev_kind = if matches!(
            ev,
            Ev::Announce { .. } | Ev::Manifest { .. } | Ev::Tick { .. } | Ev::ApplyDone { .. }
        ) {
            Kind::Steps
        } else {
            Kind::Data
        };
        match ev {
            Ev::ComputeDone { step, .. } => {
                let me = &mut nodes[node as usize];
                me.busy = false;
                me.mark(step, 0, now);
                me.steps.on_compute(Duration::from_secs_f64(me.computing));
                open(me, node, step);
                me.ex.on_computed(step);
                // The step's gossip, each way, from now on.
                if !free_network {
                    me.down_free = me.down_free.max(now) + step_gossip / me.down;
                    me.down_bytes += step_gossip;
                    me.gossip_bytes += step_gossip;
                    me.uplink.advance(now, me.up);
                    me.uplink.send(node, What::Gossip { step }, step_gossip);
                    if let Some((t, version)) = me.uplink.next_done(now, me.up) {
                        queue.at(t, Ev::UplinkDone { node, version });
                    }
                }
            }
            Ev::Request { to, what, .. } => {
                // A server that cannot serve says so at once.
                let can = match what {
                    What::Push { .. }
                    | What::Hand { .. }
                    | What::Gossip { .. }
                    | What::Claims { .. } => true,
                    What::Slice { .. } | What::Probe { .. } if withholds(node) => false,
                    What::Slice {
                        step,
                        shard,
                        member,
                    }
                    | What::Probe {
                        step,
                        shard,
                        member,
                    } => member == node || nodes[node as usize].ex.holds(step, shard, member),
                    What::Sum { step, shard, .. } => {
                        published.contains(&(step, shard, node))
                            || held.contains(&(step, shard, node))
                    }
                    What::Slices { step, shard, .. } => published.contains(&(step, shard, node)),
                };
                if !can {
                    let at = now + link(&nodes, node, to);
                    queue.at(
                        at,
                        Ev::Failed {
                            node: to,
                            from: node,
                            what,
                        },
                    );
                    continue;
                }
                if let What::Sum { step, shard, .. } = what
                    && !gossiped
                {
                    let held = nodes[node as usize].ex.signed(step, shard);
                    carried.insert(
                        (node, to, step, shard),
                        held.into_iter().map(|(a, m, _)| (a, m)).collect(),
                    );
                }
                let b = bytes(&what, listed[step_of(&what) as usize]);
                let src = &mut nodes[node as usize];
                src.uplink.advance(now, src.up);
                src.uplink.send(to, what, b);
                if let Some((t, version)) = src.uplink.next_done(now, src.up) {
                    queue.at(t, Ev::UplinkDone { node, version });
                }
            }
            Ev::UplinkDone { version, .. } if version == nodes[node as usize].uplink.version => {
                let src = &mut nodes[node as usize];
                src.uplink.advance(now, src.up);
                let done = src.uplink.take_done(src.up);
                if let Some((t, version)) = src.uplink.next_done(now, src.up) {
                    queue.at(t, Ev::UplinkDone { node, version });
                }
                for (to, what) in done {
                    let b = bytes(&what, listed[step_of(&what) as usize]);
                    nodes[node as usize].up_bytes += b;
                    if let What::Claims {
                        step,
                        shard,
                        manifest,
                    } = what
                    {
                        // Sent to each other member in turn; each request
                        // fails as any does (the sums carry the hashes too).
                        nodes[node as usize].up_kinds[4] += b;
                        for j in (0..n).filter(|&j| j != node) {
                            if lost.next() < failure {
                                continue;
                            }
                            let at = now + link(&nodes, node, j);
                            let recv = nodes[j as usize].receive(at, CLAIM_BYTES);
                            queue.at(
                                recv,
                                Ev::SumHashes {
                                    node: j,
                                    from: node,
                                    step,
                                    manifest,
                                    shards: vec![shard],
                                },
                            );
                        }
                        continue;
                    }
                    let kind = match what {
                        What::Gossip { .. } | What::Claims { .. } => continue,
                        What::Push { .. } => 0,
                        What::Sum { .. } => 1,
                        What::Slices { .. } => 2,
                        What::Slice { .. } | What::Probe { .. } | What::Hand { .. } => 3,
                    };
                    nodes[node as usize].up_kinds[kind] += b;
                    let at = now + link(&nodes, node, to);
                    let recv = nodes[to as usize].receive(at, b);
                    queue.at(
                        recv,
                        Ev::Arrive {
                            node: to,
                            from: node,
                            what,
                        },
                    );
                }
            }
            Ev::UplinkDone { .. } => {}
            Ev::Arrive { from, what, .. } => {
                let me = &mut nodes[node as usize];
                match what {
                    // (Never sent: gossip only shares the links; claims
                    // arrive as `SumHashes`.)
                    What::Gossip { .. } | What::Claims { .. } => {}
                    What::Push { step, shard } => {
                        open(me, node, step);
                        me.ex.on_slice(step, shard, from);
                        let at = now + link(&nodes, node, from);
                        queue.at(
                            at,
                            Ev::Pushed {
                                node: from,
                                step,
                                shard,
                                to: node,
                            },
                        );
                    }
                    What::Slice {
                        step,
                        shard,
                        member,
                    }
                    | What::Probe {
                        step,
                        shard,
                        member,
                    }
                    | What::Hand {
                        step,
                        shard,
                        member,
                    } => {
                        me.ex.on_slice(step, shard, member);
                    }
                    What::Sum { step, shard, seat } => {
                        for (a, m) in carried
                            .remove(&(from, node, step, shard))
                            .unwrap_or_default()
                        {
                            let v = me.ex.on_sum_hash(d, step, shard, a, m, TRUE_SUM);
                            if v == exchange::Verdict::Accepted {
                                me.last_hash.insert(step, now);
                            }
                        }
                        me.ex.on_sum(d, step, shard, seat, TRUE_SUM);
                        if cfg.sums_from == SumSource::Holders && held.insert((step, shard, node)) {
                            holders.entry((step, shard)).or_default().push(node);
                        }
                    }
                    What::Slices {
                        step,
                        shard,
                        manifest,
                    } => {
                        me.ex.on_recomputed(step, shard, manifest, TRUE_SUM);
                    }
                }
            }
            Ev::Pushed {
                step, shard, to, ..
            } => {
                nodes[node as usize].ex.on_pushed(step, shard, to);
            }
            Ev::Failed { from, what, .. } => {
                let ex = &mut nodes[node as usize].ex;
                match what {
                    What::Gossip { .. } | What::Claims { .. } => {}
                    What::Push { step, shard } => ex.on_push_failed(d, step, shard, from),
                    What::Slice {
                        step,
                        shard,
                        member,
                    } => ex.on_slice_failed(d, step, shard, member),
                    What::Sum { step, shard, .. } => ex.on_fetch_failed(d, step, shard),
                    What::Slices { step, shard, .. } => ex.on_recompute_failed(d, step, shard),
                    What::Probe {
                        step,
                        shard,
                        member,
                    } => ex.on_probe_failed(d, step, shard, member),
                    What::Hand { .. } => {}
                }
            }
            Ev::Announce { from, step, .. } => {
                let m = &mut nodes[node as usize].steps;
                // The contribution is held by aggregators, not fetched: to
                // the step machine it is in hand once announced.
                m.on_announce(d, &announce(step, from));
                let _ = m.on_payload(d, hash_of(step, from));
            }
            Ev::Manifest { idx, .. } => {
                // A rewind (a better-ranked manifest for a step already
                // taken) reaches the trainer through the exchange, which
                // is told of the new manifest when the machine delivers it.
                nodes[node as usize]
                    .steps
                    .on_manifest(d, manifests[idx].clone());
            }
            Ev::SumHashes {
                from,
                step,
                manifest,
                shards,
                ..
            } => {
                let me = &mut nodes[node as usize];
                open(me, node, step);
                me.last_hash.insert(step, now);
                for s in shards {
                    me.ex.on_sum_hash(d, step, s, from, manifest, TRUE_SUM);
                }
            }
            Ev::Claim {
                from,
                step,
                shard,
                member,
                manifest,
                ..
            } => {
                let me = &mut nodes[node as usize];
                open(me, node, step);
                me.ex.on_withheld_claim(step, shard, from, manifest, member);
            }
            Ev::Tick { .. } => {}
            Ev::ApplyDone { step, rewinds, .. } => {
                let me = &mut nodes[node as usize];
                me.busy = false;
                me.applying = None;
                // (An apply a rewind overtook counts for nothing.)
                if step == me.applied && rewinds == me.rewinds {
                    me.applied += 1;
                    me.mark(step, 4, now);
                    let applied = me.applied;
                    me.steps.on_applied(
                        applied,
                        [applied as u8; 32],
                        [applied.saturating_sub(1) as u8; 32],
                    );
                    me.ex.forget_before(applied.saturating_sub(4));
                }
            }
        }
        // The step machine only when something concerned it (polling it
        // after every transfer made 1,000 nodes take minutes); the exchange
        // after every event, and again while either gives the other work.
        let mut touch_steps = matches!(ev_kind, Kind::Steps);
        let mut sums: Vec<(u32, ManifestId, u32)> = Vec::new();
        loop {
            // Step agreement.
            if touch_steps {
                touch_steps = false;
                for a in nodes[node as usize].steps.poll(d) {
                    tracing::trace!(t = now, node, ?a, "step machine");
                    match a {
                        Action::Fetch { hash, .. } => {
                            let _ = nodes[node as usize].steps.on_payload(d, hash);
                        }
                        Action::Publish(m) => {
                            contributors.0 += m.entries.len() as u64;
                            contributors.1 += 1;
                            manifests.push(m);
                            let idx = manifests.len() - 1;
                            let g = base.gossip_bytes as f64 / nodes[node as usize].up;
                            for j in (0..n).filter(|&j| j != node) {
                                let at = now + link(&nodes, node, j) + g;
                                queue.at(at, Ev::Manifest { node: j, idx });
                            }
                        }
                        Action::Apply { manifest, .. } => {
                            let members: Vec<u32> = manifest.entries.iter().map(|e| e.0).collect();
                            let me = &mut nodes[node as usize];
                            me.mark(manifest.step, 2, now);
                            me.contributions.insert(manifest.step, members.len() as u64);
                            if let Some(l) = listed.get_mut(manifest.step as usize) {
                                *l = members.len();
                            }
                            open(me, node, manifest.step);
                            me.ex
                                .on_manifest(d, manifest.step, manifest_id(&manifest), &members);
                        }
                        Action::RequestManifest { .. } => {}
                    }
                }
                nodes[node as usize].steps_deadline = nodes[node as usize].steps.next_deadline(d);
            }
            // The data plane.
            for a in nodes[node as usize].ex.poll(d) {
                tracing::trace!(t = now, node, ?a, "exchange");
                let request =
                    |q: &mut Events<Ev>, rng: &mut Rng, nodes: &[Node], server: u32, what: What| {
                        if rng.next() < failure {
                            let b = bytes(&what, listed[step_of(&what) as usize]);
                            let wait = base
                                .timing
                                .deadline((b as u64).min(super::msg::PART as u64));
                            q.at(
                                now + wait.as_secs_f64(),
                                Ev::Failed {
                                    node,
                                    from: server,
                                    what,
                                },
                            );
                        } else if matches!(what, What::Push { .. } | What::Hand { .. }) {
                            q.at(
                                now,
                                Ev::Request {
                                    node,
                                    to: server,
                                    what,
                                },
                            );
                        } else {
                            let at = now + link(nodes, node, server);
                            q.at(
                                at,
                                Ev::Request {
                                    node: server,
                                    to: node,
                                    what,
                                },
                            );
                        }
                    };
                match a {
                    // A withholding member's slices go nowhere, yet it
                    // announces as if they had.
                    XAction::Push { step, shard, to } if withholds(node) => {
                        nodes[node as usize].ex.on_pushed(step, shard, to);
                    }
                    XAction::Push { step, shard, to } => {
                        request(&mut queue, &mut rng, &nodes, to, What::Push { step, shard })
                    }
                    XAction::ClaimWithheld {
                        step,
                        shard,
                        member,
                        manifest,
                    } => {
                        for j in 0..n {
                            queue.at(
                                gossip_at(&nodes, node, j),
                                Ev::Claim {
                                    node: j,
                                    from: node,
                                    step,
                                    shard,
                                    member,
                                    manifest,
                                },
                            );
                        }
                    }
                    XAction::Probe {
                        step,
                        shard,
                        member,
                        from,
                    } => request(
                        &mut queue,
                        &mut rng,
                        &nodes,
                        from,
                        What::Probe {
                            step,
                            shard,
                            member,
                        },
                    ),
                    XAction::Forward { .. } if withholds(node) => {}
                    XAction::Forward {
                        step,
                        shard,
                        member,
                        to,
                    } => request(
                        &mut queue,
                        &mut rng,
                        &nodes,
                        to,
                        What::Hand {
                            step,
                            shard,
                            member,
                        },
                    ),
                    XAction::Withheld { step, member } => {
                        touch_steps = true;
                        // A step already handed over goes back through the
                        // exchange, told of the new manifest.
                        let _ = nodes[node as usize].steps.on_withheld(step, member);
                    }
                    XAction::Served { step, member } => {
                        touch_steps = true;
                        let _ = nodes[node as usize].steps.on_served(d, step, member);
                    }
                    XAction::Announce { step } => {
                        touch_steps = true;
                        nodes[node as usize].mark(step, 1, now);
                        let m = &mut nodes[node as usize].steps;
                        m.on_local(d, &announce(step, node));
                        let _ = m.on_payload(d, hash_of(step, node));
                        for j in (0..n).filter(|&j| j != node) {
                            let at = now + link(&nodes, node, j);
                            queue.at(
                                at,
                                Ev::Announce {
                                    node: j,
                                    from: node,
                                    step,
                                },
                            );
                        }
                    }
                    XAction::FetchSlice {
                        step,
                        shard,
                        member,
                        from,
                    } => request(
                        &mut queue,
                        &mut rng,
                        &nodes,
                        from,
                        What::Slice {
                            step,
                            shard,
                            member,
                        },
                    ),
                    XAction::PublishSum {
                        step,
                        shard,
                        manifest,
                    } => {
                        published.insert((step, shard, node));
                        if cfg.sums_from == SumSource::Holders && held.insert((step, shard, node)) {
                            holders.entry((step, shard)).or_default().push(node);
                        }
                        sums.push((step, manifest, shard));
                    }
                    XAction::FetchSum { step, shard, from } => {
                        let server = match holders.get(&(step, shard)) {
                            Some(h) if cfg.sums_from == SumSource::Holders && !h.is_empty() => {
                                let i = ((pick.next() * h.len() as f64) as usize).min(h.len() - 1);
                                if h[i] == node { from } else { h[i] }
                            }
                            _ => from,
                        };
                        request(
                            &mut queue,
                            &mut rng,
                            &nodes,
                            server,
                            What::Sum {
                                step,
                                shard,
                                seat: from,
                            },
                        )
                    }
                    XAction::Recompute {
                        step,
                        shard,
                        from,
                        manifest,
                    } => {
                        nodes[node as usize].recomputes += 1;
                        if from == node {
                            let ex = &mut nodes[node as usize].ex;
                            ex.on_recomputed(step, shard, manifest, TRUE_SUM);
                        } else {
                            request(
                                &mut queue,
                                &mut rng,
                                &nodes,
                                from,
                                What::Slices {
                                    step,
                                    shard,
                                    manifest,
                                },
                            )
                        }
                    }
                    XAction::Convict { .. } => convictions += 1,
                    XAction::Apply { step } => {
                        nodes[node as usize].mark(step, 3, now);
                        nodes[node as usize].ready.insert(step);
                    }
                    XAction::Rewind { step } => {
                        // Back to the state before `step`; the steps after
                        // it that were applied are applied again (their
                        // sums stand).
                        let me = &mut nodes[node as usize];
                        for s in step + 1..me.applied {
                            me.ready.insert(s);
                        }
                        // An apply in flight of this step or a later one is
                        // void, and a later one is applied again (the
                        // exchange delivers only `step` again); one of an
                        // earlier step stands.
                        if let Some(k) = me.applying.filter(|&k| k >= step) {
                            me.rewinds += 1;
                            if k > step {
                                me.ready.insert(k);
                            }
                        }
                        me.applied = me.applied.min(step);
                        me.ready.remove(&step);
                    }
                }
            }
            if !touch_steps {
                break;
            }
        }
        // Sum hashes: the seat's own at once; to every other member by
        // request, one transfer a shard on its uplink (before message
        // version 9, gossiped: one message per step from each poll).
        let mut by_step: BTreeMap<(u32, ManifestId), Vec<u32>> = BTreeMap::new();
        for (step, manifest, shard) in sums {
            by_step.entry((step, manifest)).or_default().push(shard);
        }
        for ((step, manifest), shards) in by_step {
            if !gossiped {
                let src = &mut nodes[node as usize];
                src.uplink.advance(now, src.up);
                for &shard in &shards {
                    let what = What::Claims {
                        step,
                        shard,
                        manifest,
                    };
                    // One request a member, each its own stream.
                    src.uplink
                        .send_streams(node, what, CLAIM_BYTES, n.saturating_sub(1));
                }
                if let Some((t, version)) = src.uplink.next_done(now, src.up) {
                    queue.at(t, Ev::UplinkDone { node, version });
                }
            }
            let to: Vec<u32> = if gossiped {
                (0..n).collect()
            } else {
                vec![node]
            };
            for j in to {
                queue.at(
                    gossip_at(&nodes, node, j),
                    Ev::SumHashes {
                        node: j,
                        from: node,
                        step,
                        manifest,
                        shards: shards.clone(),
                    },
                );
            }
        }
        // The node's trainer: apply in order, compute one step ahead.
        let me = &mut nodes[node as usize];
        if !me.busy {
            if me.ready.first() == Some(&me.applied) {
                me.ready.pop_first();
                me.busy = true;
                let (step, rewinds) = (me.applied, me.rewinds);
                me.applying = Some(step);
                queue.at(
                    now + base.apply_secs,
                    Ev::ApplyDone {
                        node,
                        step,
                        rewinds,
                    },
                );
            } else if me.next_compute < base.steps && me.next_compute <= me.applied + 1 {
                let jitter = rng.uniform((-base.step_jitter, base.step_jitter));
                let c = base.compute_secs * me.speed * (1.0 + jitter);
                me.compute_total += c;
                me.computing = c;
                me.busy = true;
                let step = me.next_compute;
                me.next_compute += 1;
                queue.at(now + c, Ev::ComputeDone { node, step });
            } else if me.applied >= base.steps && me.done_at.is_none() {
                me.done_at = Some(now);
                finished += usize::from(!withholds(node));
            }
        }
        let next = [me.steps_deadline, me.ex.next_deadline()]
            .into_iter()
            .flatten()
            .min();
        if let Some(deadline) = next
            && me.done_at.is_none()
            && let Some(at) = me.alarm.plan(t, deadline)
        {
            queue.at_nanos(at, Ev::Tick { node });
        }
        if finished == honest.len() {
            break;
        }
    }
    // The job's gossip took its share of every link all along: counted in
    // the traffic as well. The links lost every heartbeat (the rate with
    // none skipped, above: the steps' length is not known beforehand),
    // but a member that announces every step skips most of its beats
    // (`liveness::beat_due`): the bytes counted are those of the beats due
    // at its own pace.
    if !free_network {
        for x in &mut nodes {
            let secs = x.done_at.unwrap_or(now);
            let beats = match cfg.gossip {
                GossipCost::Free => 0.0,
                _ => super::liveness::heartbeat_bytes_per_sec_announcing(
                    n,
                    base.timing.alive,
                    secs / base.steps.max(1) as f64,
                ),
            } * secs;
            x.up_bytes += beats;
            x.down_bytes += beats;
            x.gossip_bytes += beats;
        }
    }
    // What the run did for its honest members (a withholder may never
    // apply what it stalls).
    let nodes: Vec<&Node> = honest.iter().map(|&i| &nodes[i as usize]).collect();
    let k = nodes.len().max(1) as f64;
    let total = nodes
        .iter()
        .map(|x| x.done_at.unwrap_or(now))
        .fold(0.0, f64::max);
    let steps = base.steps.max(1) as f64;
    let per = |f: fn(&Node) -> f64| {
        let v: Vec<f64> = nodes.iter().map(|x| f(x) / steps).collect();
        (
            v.iter().sum::<f64>() / k,
            v.iter().copied().fold(0.0, f64::max),
        )
    };
    let (up_mean, up_max) = per(|x| x.up_bytes);
    let (gossip, _) = per(|x| x.gossip_bytes);
    let (down_mean, down_max) = per(|x| x.down_bytes);
    let per_kind = |i: usize| nodes.iter().map(|x| x.up_kinds[i]).sum::<f64>() / k / steps;
    ShardedResult {
        run: SimResult {
            secs: total,
            steps: nodes.iter().map(|x| x.applied).min().unwrap_or(0),
            busy: nodes
                .iter()
                .map(|x| x.compute_total / total.max(1e-9))
                .sum::<f64>()
                / k,
            contributors: contributors.0 as f64 / contributors.1.max(1) as f64,
            applied_contributions: nodes
                .iter()
                .map(|x| x.contributions.values().sum::<u64>() as f64)
                .sum::<f64>()
                / k,
        },
        up_mean,
        up_max,
        down_mean,
        down_max,
        gossip,
        recomputes: nodes.iter().map(|x| x.recomputes as f64).sum::<f64>() / k / steps,
        convictions,
        phases: phases(&nodes),
        uploads: Uploads {
            pushes: per_kind(0),
            sums: per_kind(1),
            recomputes: per_kind(2),
            slices: per_kind(3),
            gossip,
            claims: per_kind(4),
        },
    }
}

fn phases(nodes: &[&Node]) -> Phases {
    let average = |xs: &mut dyn Iterator<Item = f64>| {
        let (sum, count) = xs.fold((0.0, 0u64), |(s, c), v| (s + v, c + 1));
        sum / count.max(1) as f64
    };
    let mean = |which: usize| {
        average(
            &mut nodes
                .iter()
                .flat_map(|x| x.marks.values())
                .filter_map(|m| Some(m[which]? - m[0]?)),
        )
    };
    let signed = average(&mut nodes.iter().flat_map(|x| {
        x.last_hash
            .iter()
            .filter_map(|(step, t)| Some(t - x.marks.get(step)?[0]?))
    }));
    Phases {
        announced: mean(1),
        manifest: mean(2),
        signed,
        accepted: mean(3),
        applied: mean(4),
    }
}

/// Whether an event concerns the step machine.
enum Kind {
    Steps,
    Data,
}

/// Who published a manifest, and as which attempt: what tells a step's
/// manifests apart here (nobody equivocates in these runs).
fn manifest_id(m: &Manifest) -> ManifestId {
    let mut id = [0u8; 32];
    id[..4].copy_from_slice(&m.step.to_le_bytes());
    id[4..8].copy_from_slice(&m.leader.to_le_bytes());
    id[8] = m.attempt;
    id
}

fn step_of(w: &What) -> u32 {
    match *w {
        What::Push { step, .. }
        | What::Slice { step, .. }
        | What::Sum { step, .. }
        | What::Slices { step, .. }
        | What::Probe { step, .. }
        | What::Hand { step, .. }
        | What::Claims { step, .. }
        | What::Gossip { step } => step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::step::Timing;

    fn cfg(nodes: u32) -> ShardedConfig {
        ShardedConfig {
            base: SimConfig {
                nodes,
                steps: 6,
                compute_secs: 8.0,
                speed_spread: 0.15,
                step_jitter: 0.05,
                apply_secs: 0.25,
                payload_bytes: 2_340_000,
                up_mbit: (20.0, 100.0),
                down_mbit: (100.0, 1000.0),
                latency_ms: (5.0, 40.0),
                gossip_bytes: 200 + 36 * nodes as u64,
                fetch_failure: 0.01,
                seed: 3,
                timing: Timing::default(),
            },
            redundancy: 2,
            shards: 0,
            spots: 1,
            backups: 4,
            positions: 18_000_000,
            sum_bits: 2,
            timing: exchange::Timing::default(),
            withholding: Vec::new(),
            gossip: GossipCost::Shipped,
            sums_from: SumSource::Seats,
        }
    }

    #[test]
    fn sums_served_by_their_holders_take_the_load_off_the_seats_and_every_step_still_applies() {
        let seats = cfg(48);
        let holders = ShardedConfig {
            sums_from: SumSource::Holders,
            ..seats.clone()
        };
        let (a, b) = (
            simulate_sharded(&seats, false),
            simulate_sharded(&holders, false),
        );
        for r in [&a, &b] {
            assert_eq!(r.run.steps, 6, "{r:?}");
            assert_eq!(r.convictions, 0, "{r:?}");
        }
        // The same sums are served, by more nodes: the most any node
        // uploads falls, the mean does not move much.
        assert!(b.up_max < a.up_max, "{a:?}\n{b:?}");
        assert!(
            (b.uploads.sums - a.uploads.sums).abs() < 0.2 * a.uploads.sums,
            "{a:?}\n{b:?}"
        );
    }

    #[test]
    fn sum_hashes_sent_by_request_cost_a_fraction_of_their_gossip_and_a_lost_one_costs_no_wait() {
        let sent = cfg(48);
        let gossiped = ShardedConfig {
            gossip: GossipCost::HashesGossiped,
            ..sent.clone()
        };
        let (a, b) = (
            simulate_sharded(&sent, false),
            simulate_sharded(&gossiped, false),
        );
        for r in [&a, &b] {
            assert_eq!(r.run.steps, 6, "{r:?}");
        }
        assert_eq!(b.uploads.claims, 0.0);
        assert!(a.uploads.claims > 0.0);
        // Each member gets a seat's hash once, not once per mesh peer.
        let gossiped_hashes = b.uploads.gossip - a.uploads.gossip;
        assert!(a.uploads.claims < 0.25 * gossiped_hashes, "{a:?}\n{b:?}");
        // One request in ten lost: a node whose claims from both seats of
        // a shard were lost learns of the shard's sum from the sums that
        // carry them, or asks a seat without a hash once the step's other
        // hashes have come (`exchange`'s unheard shards). Every step
        // applies, at the pace of the gossiped hashes (over three seeds:
        // without the unheard shards' requests a node waited for ever).
        let lossy = |c: &ShardedConfig, seed: u64| ShardedConfig {
            base: SimConfig {
                fetch_failure: 0.1,
                seed,
                ..c.base.clone()
            },
            ..c.clone()
        };
        let (mut took, mut gossip_took) = (0.0, 0.0);
        for seed in 3..6 {
            let x = simulate_sharded(&lossy(&sent, seed), false);
            let y = simulate_sharded(&lossy(&gossiped, seed), false);
            assert_eq!(x.run.steps, 6, "seed {seed}: {x:?}");
            assert_eq!(y.run.steps, 6, "seed {seed}: {y:?}");
            took += x.run.secs;
            gossip_took += y.run.secs;
        }
        assert!(
            took < 1.15 * gossip_took,
            "{took} s against {gossip_took} s"
        );
    }

    #[test]
    fn every_node_applies_every_step_through_the_aggregators() {
        let c = cfg(24);
        let r = simulate_sharded(&c, false);
        assert_eq!(r.run.steps, 6);
        // Six steps of about 8 s, not a wait for a member heard from but
        // stalled.
        assert!(r.run.secs < 6.0 * 20.0, "{r:?}");
        assert!(
            r.run.applied_contributions >= 6.0 * r.run.contributors - 1e-9,
            "{r:?}"
        );
        assert_eq!(r.convictions, 0);
        // One spot check per node per step, and few recomputations beyond.
        assert!((1.0..2.0).contains(&r.recomputes), "{r:?}");
    }

    #[test]
    fn what_a_node_sends_per_step_does_not_grow_with_the_member_count() {
        let small = simulate_sharded(&cfg(16), false);
        let large = simulate_sharded(&cfg(96), false);
        // r pushed payloads, one aggregate served and one spot check: the
        // same bound at 16 and 96 members (give or take the Merkle paths).
        // (The data plane: the gossip, counted apart, grows with members.)
        for r in [&small, &large] {
            let c = cfg(16);
            let bound = 3.0 * c.base.payload_bytes as f64 + c.aggregate_bytes();
            assert!(r.up_mean - r.gossip < bound * 1.2, "{r:?}");
            assert!(r.down_mean - r.gossip < bound * 1.2, "{r:?}");
        }
        assert!(
            large.up_mean - large.gossip < (small.up_mean - small.gossip) * 1.5,
            "{small:?} {large:?}"
        );
        assert!(large.gossip > small.gossip);
        // The breakdown accounts for every byte sent, and each node pushes
        // about r payloads of its own.
        for r in [&small, &large] {
            let u = r.uploads;
            let sum = u.pushes + u.sums + u.recomputes + u.slices + u.claims + u.gossip;
            assert!((sum - r.up_mean).abs() < 1e-6 * r.up_mean, "{u:?} {r:?}");
            let pushed = u.pushes / cfg(16).base.payload_bytes as f64;
            assert!((1.5..3.0).contains(&pushed), "{pushed} payloads pushed");
            assert!(u.sums > 0.0 && u.recomputes > 0.0, "{u:?}");
        }
    }

    #[test]
    fn a_slower_network_never_makes_training_faster() {
        let c = cfg(16);
        let free = simulate_sharded(&c, true);
        let net = simulate_sharded(&c, false);
        assert!(net.run.secs >= free.run.secs);
    }

    #[test]
    fn a_member_that_announces_but_serves_no_slice_is_left_out_and_every_step_applies() {
        let mut c = cfg(16);
        c.withholding = vec![5];
        let r = simulate_sharded(&c, false);
        assert_eq!(r.run.steps, 6, "{r:?}");
        // Every step applied without it: 15 contributions a step.
        assert!(r.run.applied_contributions <= 6.0 * 15.0 + 1e-9, "{r:?}");
        assert!(r.run.applied_contributions >= 6.0 * 14.0, "{r:?}");
        assert_eq!(r.convictions, 0);
        // Each step waits for the look, not for ever (the honest run
        // takes about 57 s).
        assert!(r.run.secs < 6.0 * 20.0, "{r:?}");
    }

    #[test]
    fn simulation_is_repeatable() {
        let c = cfg(12);
        assert_eq!(simulate_sharded(&c, false), simulate_sharded(&c, false));
    }
}
