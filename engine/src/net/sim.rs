//! Discrete-event simulation of the step protocol in virtual time. Every
//! node runs the real [`StepMachine`]; compute, payload transfers and
//! gossip are modeled. Run once with the modeled network and once with a
//! free network (zero latency, unlimited bandwidth): their ratio is the
//! protocol's throughput efficiency at that scale.
//!
//! A holder's uplink is shared fairly by the payloads it is sending at
//! once (as TCP and yamux streams share a link), not served one after
//! another; a share of fetches fails, and fails only at the node's own
//! request deadline, after which the step machine asks the next holder.

use super::msg::{Announce, Manifest};
use super::step::{Action, StepMachine, Timing, Verdict};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

/// The simulators' event queue, in whole nanoseconds of virtual time.
///
/// Why integers: the time an event is queued at, the `Duration` the
/// machines are shown when it is handled and a node's planned wake-up must
/// be one number. Kept as float seconds truncated to the queue's
/// nanoseconds, a wake-up planned for a machine's deadline landed a
/// nanosecond before it for about a quarter of deadlines; the machine had
/// nothing due yet, the node planned nothing more, and with no other event
/// addressed to it slept for good. That was the sharded simulator's
/// 1,000-node sign-sum "stall": one node never retried a failed sum
/// request, and the run ended when everyone else ran out of events.
pub(super) struct Events<E: Ord> {
    heap: BinaryHeap<Reverse<(u64, u64, E)>>,
    seq: u64,
}

impl<E: Ord> Events<E> {
    pub(super) fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Queues `ev` at `t` seconds, rounded up to the nanosecond.
    pub(super) fn at(&mut self, t: f64, ev: E) {
        self.at_nanos(nanos(t), ev);
    }

    pub(super) fn at_nanos(&mut self, t: u64, ev: E) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    /// The earliest event (ties in the order queued) and its time in
    /// nanoseconds.
    pub(super) fn pop(&mut self) -> Option<(u64, E)> {
        self.heap.pop().map(|Reverse((t, _, ev))| (t, ev))
    }
}

/// Seconds of virtual time as the queue's nanoseconds, rounded up.
pub(super) fn nanos(t: f64) -> u64 {
    (t * 1e9).ceil() as u64
}

/// A node's next wake-up for its machines' deadlines.
#[derive(Debug)]
pub(super) struct Alarm {
    at: u64,
}

impl Default for Alarm {
    fn default() -> Self {
        Self { at: u64::MAX }
    }
}

impl Alarm {
    /// At `now` (nanoseconds) the machines' earliest deadline is
    /// `deadline`: the time to queue a wake-up at, exactly the deadline
    /// (at least a microsecond from now), or `None` when the wake-up
    /// already planned comes no later.
    pub(super) fn plan(&mut self, now: u64, deadline: Duration) -> Option<u64> {
        let t = u64::try_from(deadline.as_nanos())
            .unwrap_or(u64::MAX)
            .max(now + 1_000);
        (t < self.at || self.at <= now).then(|| {
            self.at = t;
            t
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub nodes: u32,
    pub steps: u32,
    /// Mean compute seconds per step per node, and the spread of per-node
    /// speed (uniform in mean × [1 − s, 1 + s]) and per-step jitter
    /// (uniform ± j).
    pub compute_secs: f64,
    pub speed_spread: f64,
    pub step_jitter: f64,
    /// Seconds to aggregate and apply one step.
    pub apply_secs: f64,
    pub payload_bytes: u64,
    /// Per-node uplink and downlink (Mbit/s), uniform in [lo, hi].
    pub up_mbit: (f64, f64),
    pub down_mbit: (f64, f64),
    /// Per-node one-way latency to the internet core (ms), uniform in
    /// [lo, hi]; node-to-node latency is the sum of both ends.
    pub latency_ms: (f64, f64),
    /// Bytes of an announcement or manifest on the wire.
    pub gossip_bytes: u64,
    /// Share of payload requests that never get an answer (a dropped
    /// connection, a holder gone or overloaded): the asker learns only at
    /// its request deadline for the payload's first part ([`Timing::deadline`]).
    pub fetch_failure: f64,
    pub seed: u64,
    pub timing: Timing,
}

impl SimConfig {
    /// A node's uplink and downlink (bytes/s) less what the job's gossip
    /// takes of them all the time: `rate` bytes a second (the heartbeats;
    /// on the all-to-all exchange also each step's announcements and
    /// manifests, spread over compute and apply time: an upper bound where
    /// steps take longer, negligible there next to the payloads). A link
    /// keeps a twentieth of itself at least.
    pub fn less_gossip(&self, up: f64, down: f64, rate: f64) -> (f64, f64) {
        ((up - rate).max(up / 20.0), (down - rate).max(down / 20.0))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SimResult {
    pub secs: f64,
    pub steps: u32,
    /// Mean over nodes of the fraction of time spent computing.
    pub busy: f64,
    /// Mean contributions per applied manifest.
    pub contributors: f64,
    /// Contributions in the manifests the nodes applied, mean over nodes:
    /// the work that reached the model (each is one member's tokens for
    /// one step). A payload left out of its step's manifest was computed
    /// for nothing.
    pub applied_contributions: f64,
}

impl SimResult {
    /// Contributed-token efficiency: contributions applied per second, as
    /// a share of the same in `free` (the run with no network cost).
    pub fn contributed_efficiency(&self, free: &SimResult) -> f64 {
        let rate = |r: &SimResult| r.applied_contributions / r.secs.max(1e-9);
        rate(self) / rate(free).max(1e-12)
    }
}

/// Deterministic xorshift: a simulation must be repeatable from its seed.
pub(super) struct Rng(pub(super) u64);
impl Rng {
    /// A generator for `seed`, mixed first (SplitMix64's finaliser) so that
    /// every seed draws its own run: xorshift's state must not be zero, and
    /// forcing its low bit on had made seeds 42 and 43 draw the same one.
    pub(super) fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)).max(1))
    }
    pub(super) fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    pub(super) fn uniform(&mut self, (lo, hi): (f64, f64)) -> f64 {
        lo + (hi - lo) * self.next()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    ComputeDone {
        node: u32,
        step: u32,
    },
    Announce {
        node: u32,
        from: u32,
        step: u32,
    },
    Payload {
        node: u32,
        hash: [u8; 32],
    },
    /// A request for `hash` reaches its holder `node`, for `to`.
    Request {
        node: u32,
        to: u32,
        hash: [u8; 32],
    },
    /// The earliest of `node`'s uploads may be done (stale unless
    /// `version` is the uplink's current one).
    UplinkDone {
        node: u32,
        version: u64,
    },
    FetchFailed {
        node: u32,
        hash: [u8; 32],
    },
    Manifest {
        node: u32,
        step: u32,
        idx: usize,
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

struct Node {
    machine: StepMachine,
    speed: f64,
    up: f64,
    down: f64,
    latency: f64,
    uplink: Uplink,
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
    ready: VecDeque<u32>,
    compute_total: f64,
    /// Seconds the compute in flight takes (what the node measures).
    computing: f64,
    done_at: Option<f64>,
    /// When the node next wakes for its machines' deadlines.
    alarm: Alarm,
}

/// What a holder is sending at once, each transfer getting an equal share
/// of its uplink (processor sharing). A transfer may stand for several
/// streams of equal size started together (a seat's signed hash to every
/// member): each gets a stream's share, and they all end together.
pub(super) struct Uplink<T = [u8; 32]> {
    /// (receiver, what, bytes left to send per stream, streams).
    active: Vec<(u32, T, f64, f64)>,
    /// Streams in `active`, all told.
    streams: f64,
    /// When `active`'s bytes left were last brought up to date.
    last: f64,
    pub(super) version: u64,
}

impl<T> Default for Uplink<T> {
    fn default() -> Self {
        Self {
            active: Vec::new(),
            streams: 0.0,
            last: 0.0,
            version: 0,
        }
    }
}

impl<T> Uplink<T> {
    /// Starts sending `bytes` to `to` (bring it up to date with `advance`
    /// first).
    pub(super) fn send(&mut self, to: u32, what: T, bytes: f64) {
        self.send_streams(to, what, bytes, 1);
    }

    /// Starts `streams` transfers of `bytes` each, counted as one.
    pub(super) fn send_streams(&mut self, to: u32, what: T, bytes: f64, streams: u32) {
        let k = f64::from(streams.max(1));
        self.active.push((to, what, bytes, k));
        self.streams += k;
    }

    /// Sends at `rate` bytes/s, shared, from `last` until `now`.
    pub(super) fn advance(&mut self, now: f64, rate: f64) {
        if !self.active.is_empty() {
            let each = (now - self.last) * rate / self.streams;
            for t in &mut self.active {
                t.2 -= each;
            }
        }
        self.last = now;
    }

    /// When the transfer nearest to done will be, at today's sharing.
    pub(super) fn next_done(&mut self, now: f64, rate: f64) -> Option<(f64, u64)> {
        self.version += 1;
        let least = self
            .active
            .iter()
            .map(|t| t.2)
            .fold(f64::INFINITY, f64::min);
        least
            .is_finite()
            .then(|| (now + least.max(0.0) * self.streams / rate, self.version))
    }

    /// Takes the transfers that are done, or would be within a microsecond
    /// at `rate`: event times are rounded down to the nanosecond, so a
    /// transfer's last bytes must not need an event of their own (that
    /// event could fall at the same instant, forever).
    pub(super) fn take_done(&mut self, rate: f64) -> Vec<(u32, T)> {
        let n = self.streams;
        let (done, left): (Vec<_>, Vec<_>) =
            self.active.drain(..).partition(|t| t.2 * n / rate <= 1e-6);
        self.active = left;
        self.streams = self.active.iter().map(|t| t.3).sum();
        done.into_iter().map(|t| (t.0, t.1)).collect()
    }
}

/// The node's timing as the simulator drives it: nobody dies in these runs,
/// and the node sends a heartbeat every 0.5 s, so every member is heard
/// from within `alive` all the time. The simulator does not send those
/// heartbeats (at 1,000 members they would be most of its events); a member
/// is instead never presumed gone, which is what they would show. Without
/// this, a leader waiting out a long collect window looked gone to its
/// fall-back after `alive`, and the two raced. (A first try at this left a
/// node waiting a year of simulated time: a leader slept through its
/// publish deadline, see [`Events`], and its fall-back, hearing it alive,
/// waited for it.)
pub(super) fn heard(timing: Timing) -> Timing {
    Timing {
        alive: Duration::from_secs(365 * 24 * 3600),
        ..timing
    }
}

fn hash_of(step: u32, member: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..4].copy_from_slice(&step.to_le_bytes());
    h[4..8].copy_from_slice(&member.to_le_bytes());
    h[8] = 1;
    h
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Runs the simulation; `free_network` removes every transfer cost.
pub fn simulate(cfg: &SimConfig, free_network: bool) -> SimResult {
    let mut rng = Rng::new(cfg.seed);
    let n = cfg.nodes.max(1);
    let job = [9u8; 32];
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| Node {
            machine: StepMachine::new(job, 0, [7; 32], n, i, heard(cfg.timing), Some(0)),
            speed: rng.uniform((1.0 - cfg.speed_spread, 1.0 + cfg.speed_spread)),
            up: rng.uniform(cfg.up_mbit) * 1e6 / 8.0,
            down: rng.uniform(cfg.down_mbit) * 1e6 / 8.0,
            latency: rng.uniform(cfg.latency_ms) / 1e3,
            uplink: Uplink::default(),
            down_free: 0.0,
            applied: 0,
            contributions: BTreeMap::new(),
            rewinds: 0,
            applying: None,
            next_compute: 0,
            busy: false,
            ready: VecDeque::new(),
            compute_total: 0.0,
            computing: 0.0,
            done_at: None,
            alarm: Alarm::default(),
        })
        .collect();
    if !free_network {
        let rate =
            super::liveness::gossip_bytes_per_sec(cfg.nodes, cfg.compute_secs + cfg.apply_secs, 0);
        for x in &mut nodes {
            (x.up, x.down) = cfg.less_gossip(x.up, x.down, rate);
        }
    }
    let mut manifests: Vec<Manifest> = Vec::new();
    let mut queue = Events::new();
    let mut contributors = (0u64, 0u64);
    for i in 0..n {
        nodes[i as usize].machine.on_applied(0, [0; 32], [0; 32]);
        queue.at(0.0, Ev::Tick { node: i });
    }
    let link = |nodes: &[Node], a: u32, b: u32| -> f64 {
        if free_network {
            0.0
        } else {
            nodes[a as usize].latency + nodes[b as usize].latency
        }
    };
    let announce = |step: u32, member: u32| Announce {
        job,
        epoch: 0,
        step,
        member,
        payload_hash: hash_of(step, member),
        momentum_hash: [0; 32],
        // The state the simulated trainer reached before step - 1.
        basis: [step.saturating_sub(1) as u8; 32],
        len: cfg.payload_bytes as u32,
        produced_us: 0,
        chain_step: 0,
        chain: [0; 32],
    };
    let mut now = 0.0f64;
    let mut counted = vec![false; n as usize];
    let mut finished = 0usize;
    while let Some((t, ev)) = queue.pop() {
        now = t as f64 / 1e9;
        let d = Duration::from_nanos(t);
        let node = match &ev {
            Ev::ComputeDone { node, .. }
            | Ev::Announce { node, .. }
            | Ev::Payload { node, .. }
            | Ev::Request { node, .. }
            | Ev::UplinkDone { node, .. }
            | Ev::FetchFailed { node, .. }
            | Ev::Manifest { node, .. }
            | Ev::Tick { node }
            | Ev::ApplyDone { node, .. } => *node,
        };
        tracing::trace!(t = now, ?ev, "all-to-all sim event");
        match ev {
            Ev::ComputeDone { step, .. } => {
                let me = &mut nodes[node as usize];
                me.busy = false;
                me.machine.on_compute(Duration::from_secs_f64(me.computing));
                me.machine.on_local(d, &announce(step, node));
                for j in 0..n {
                    if j != node {
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
            }
            Ev::Announce { from, step, .. } => {
                nodes[node as usize]
                    .machine
                    .on_announce(d, &announce(step, from));
            }
            Ev::Payload { hash, .. } => {
                let _ = nodes[node as usize].machine.on_payload(d, hash);
            }
            Ev::FetchFailed { hash, .. } => nodes[node as usize].machine.on_fetch_failed(hash),
            Ev::Request { to, hash, .. } => {
                let src = &mut nodes[node as usize];
                src.uplink.advance(now, src.up);
                src.uplink.send(to, hash, cfg.payload_bytes as f64);
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
                // Sent: it crosses the network, then the receiver's
                // downlink (first come, first served).
                for (to, hash) in done {
                    let lat = link(&nodes, node, to);
                    let dst = &mut nodes[to as usize];
                    let bytes = cfg.payload_bytes as f64;
                    let recv = (now + lat).max(dst.down_free + bytes / dst.down);
                    dst.down_free = recv;
                    queue.at(recv, Ev::Payload { node: to, hash });
                }
            }
            Ev::UplinkDone { .. } => {}
            Ev::Manifest { idx, .. } => {
                let me = &mut nodes[node as usize];
                let step = manifests[idx].step;
                if me.machine.on_manifest(d, manifests[idx].clone()) == Verdict::Rewind {
                    // A better-ranked manifest for a step this node had
                    // taken another for: back to the state before it (the
                    // node keeps its recent states); the machine delivers
                    // the step again.
                    me.applied = me.applied.min(step);
                    me.ready.retain(|&s| s < step);
                    // An apply in flight of this step or a later one is
                    // void (the machine delivers them again); one of an
                    // earlier step stands.
                    if me.applying.is_some_and(|k| k >= step) {
                        me.rewinds += 1;
                    }
                }
            }
            Ev::Tick { .. } => {}
            Ev::ApplyDone { step, rewinds, .. } => {
                let me = &mut nodes[node as usize];
                me.busy = false;
                me.applying = None;
                // (An apply a rewind overtook counts for nothing.)
                if step == me.applied && rewinds == me.rewinds {
                    me.applied += 1;
                    let applied = me.applied;
                    me.machine.on_applied(
                        applied,
                        [applied as u8; 32],
                        [applied.saturating_sub(1) as u8; 32],
                    );
                }
            }
        }
        // Protocol actions.
        let actions = nodes[node as usize].machine.poll(d);
        for a in actions {
            tracing::trace!(t = now, node, ?a, "step machine");
            match a {
                Action::Fetch { hash, from } => {
                    if free_network {
                        queue.at(now, Ev::Payload { node, hash });
                    } else if rng.next() < cfg.fetch_failure {
                        // A holder that never answers fails the first part's request.
                        let first_part = cfg.payload_bytes.min(super::msg::PART as u64);
                        let wait = secs(cfg.timing.deadline(first_part));
                        queue.at(now + wait, Ev::FetchFailed { node, hash });
                    } else {
                        // The request reaches the holder, whose uplink
                        // sends the payload alongside its other uploads.
                        let at = now + link(&nodes, node, from);
                        queue.at(
                            at,
                            Ev::Request {
                                node: from,
                                to: node,
                                hash,
                            },
                        );
                    }
                }
                Action::Publish(m) => {
                    contributors.0 += m.entries.len() as u64;
                    contributors.1 += 1;
                    manifests.push(m);
                    let idx = manifests.len() - 1;
                    for j in 0..n {
                        if j != node {
                            let g = if free_network {
                                0.0
                            } else {
                                cfg.gossip_bytes as f64 / nodes[node as usize].up
                            };
                            let at = now + link(&nodes, node, j) + g;
                            queue.at(
                                at,
                                Ev::Manifest {
                                    node: j,
                                    step: 0,
                                    idx,
                                },
                            );
                        }
                    }
                }
                Action::Apply { manifest, .. } => {
                    let me = &mut nodes[node as usize];
                    me.contributions
                        .insert(manifest.step, manifest.entries.len() as u64);
                    me.ready.push_back(manifest.step)
                }
                Action::RequestManifest { .. } => {}
            }
        }
        // The node's trainer: apply in order, compute one step ahead.
        let me = &mut nodes[node as usize];
        if !me.busy {
            if me.ready.front() == Some(&me.applied) {
                me.ready.pop_front();
                me.busy = true;
                let (step, rewinds) = (me.applied, me.rewinds);
                me.applying = Some(step);
                queue.at(
                    now + cfg.apply_secs,
                    Ev::ApplyDone {
                        node,
                        step,
                        rewinds,
                    },
                );
            } else if me.next_compute < cfg.steps && me.next_compute <= me.applied + 1 {
                let jitter = rng.uniform((-cfg.step_jitter, cfg.step_jitter));
                let c = cfg.compute_secs * me.speed * (1.0 + jitter);
                me.compute_total += c;
                me.computing = c;
                me.busy = true;
                let step = me.next_compute;
                me.next_compute += 1;
                queue.at(now + c, Ev::ComputeDone { node, step });
            } else if me.applied >= cfg.steps && me.done_at.is_none() {
                me.done_at = Some(now);
            }
        }
        if me.done_at.is_some() && !counted[node as usize] {
            counted[node as usize] = true;
            finished += 1;
        }
        if let Some(deadline) = me.machine.next_deadline(d)
            && me.done_at.is_none()
            && let Some(at) = me.alarm.plan(t, deadline)
        {
            queue.at_nanos(at, Ev::Tick { node });
        }
        if finished == n as usize {
            break;
        }
    }
    let total = nodes
        .iter()
        .map(|x| x.done_at.unwrap_or(now))
        .fold(0.0, f64::max);
    SimResult {
        secs: total,
        steps: nodes.iter().map(|x| x.applied).min().unwrap_or(0),
        busy: nodes
            .iter()
            .map(|x| x.compute_total / total.max(1e-9))
            .sum::<f64>()
            / n as f64,
        contributors: contributors.0 as f64 / contributors.1.max(1) as f64,
        applied_contributions: nodes
            .iter()
            .map(|x| x.contributions.values().sum::<u64>() as f64)
            .sum::<f64>()
            / n as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(nodes: u32) -> SimConfig {
        SimConfig {
            nodes,
            steps: 12,
            compute_secs: 2.0,
            speed_spread: 0.1,
            step_jitter: 0.05,
            apply_secs: 0.05,
            payload_bytes: 200_000,
            up_mbit: (20.0, 50.0),
            down_mbit: (100.0, 300.0),
            latency_ms: (5.0, 40.0),
            gossip_bytes: 300,
            fetch_failure: 0.0,
            seed: 1,
            timing: Timing::default(),
        }
    }

    #[test]
    fn every_node_applies_every_step_with_everyone_contributing() {
        for free in [true, false] {
            let r = simulate(&cfg(8), free);
            assert_eq!(r.steps, 12);
            // Nobody waits out a member heard from but stalled: 12 steps
            // of about 2 s, plus the transfers.
            assert!(r.secs < 12.0 * 4.0, "{r:?}");
            assert!((r.contributors - 8.0).abs() < 1e-9, "{r:?}");
            assert!((r.applied_contributions - 8.0 * 12.0).abs() < 1e-9, "{r:?}");
        }
    }

    #[test]
    fn a_collect_window_shorter_than_the_transfers_applies_fewer_contributions() {
        // 200 kB from 8 authors over 0.2 Mbit/s uplinks: seconds per
        // payload, against a 3 s collect window.
        let mut c = cfg(8);
        c.up_mbit = (0.2, 0.3);
        let free = simulate(&c, true);
        let slow = simulate(&c, false);
        assert_eq!(slow.steps, 12);
        assert!(slow.contributors < 8.0, "{slow:?}");
        let e = slow.contributed_efficiency(&free);
        let step_time_ratio = free.secs / slow.secs;
        assert!(e < step_time_ratio, "{e} {step_time_ratio}");
        assert!((free.contributed_efficiency(&free) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_slower_network_never_makes_training_faster() {
        let c = cfg(8);
        let free = simulate(&c, true);
        let net = simulate(&c, false);
        let mut slow = c.clone();
        slow.up_mbit = (1.0, 2.0);
        let slow = simulate(&slow, false);
        assert!(
            free.secs <= net.secs && net.secs <= slow.secs,
            "{free:?} {net:?} {slow:?}"
        );
    }

    #[test]
    fn hundreds_of_members_finish_and_agree_on_every_step() {
        // Guards the per-event cost: before it was bounded, fall-back
        // leaders spun on passed deadlines and 1,000 members never finished.
        let mut c = cfg(300);
        c.steps = 3;
        let r = simulate(&c, false);
        assert_eq!(r.steps, 3);
        assert!(r.contributors >= 1.0, "{r:?}");
    }

    #[test]
    fn an_uplink_is_shared_by_the_payloads_it_sends_at_once() {
        // Two equal transfers started together on a 100 B/s link both
        // finish at 2 s, not one at 1 s and the other at 2 s.
        let mut u = Uplink::default();
        u.send(1, [1; 32], 100.0);
        u.send(2, [2; 32], 100.0);
        let (t, _) = u.next_done(0.0, 100.0).unwrap();
        assert!((t - 2.0).abs() < 1e-9, "{t}");
        // A third joins at 1 s with 100 bytes: the first two have 50 left,
        // so they finish at 2.5 s and the newcomer after them, at 3 s.
        u.advance(1.0, 100.0);
        u.send(3, [3; 32], 100.0);
        let (t, v) = u.next_done(1.0, 100.0).unwrap();
        assert!((t - 2.5).abs() < 1e-9, "{t}");
        u.advance(t, 100.0);
        assert_eq!(u.take_done(100.0).len(), 2);
        let (t, v2) = u.next_done(2.5, 100.0).unwrap();
        assert!((t - 3.0).abs() < 1e-9 && v2 > v, "{t}");
        // Four streams of 25 bytes counted as one transfer take four
        // shares: beside one 100-byte transfer on a 100 B/s link they end
        // at 1.25 s (each stream has had 100/5 B/s), and it at 2 s.
        let mut u = Uplink::default();
        u.send(1, [1; 32], 100.0);
        u.send_streams(2, [2; 32], 25.0, 4);
        let (t, _) = u.next_done(0.0, 100.0).unwrap();
        assert!((t - 1.25).abs() < 1e-9, "{t}");
        u.advance(t, 100.0);
        assert_eq!(u.take_done(100.0), vec![(2, [2; 32])]);
        let (t, _) = u.next_done(1.25, 100.0).unwrap();
        assert!((t - 2.0).abs() < 1e-9, "{t}");
    }

    #[test]
    fn failed_fetches_cost_contributions() {
        let c = cfg(8);
        let base = simulate(&c, false);
        let mut lossy = c.clone();
        lossy.fetch_failure = 0.3;
        let r = simulate(&lossy, false);
        assert!(
            r.applied_contributions < base.applied_contributions,
            "{base:?} {r:?}"
        );
        // (A node that gave up on a manifest the others applied heals in
        // the real node by heartbeats and a state download, which are not
        // simulated: here it stays behind, and `steps` shows it.)
    }

    #[test]
    fn a_wake_up_planned_for_a_deadline_is_handled_no_earlier_than_the_deadline() {
        // The deadline the stalled sharded run's last node never woke for
        // (a retry 0.5 s after a failed sum request): in float seconds
        // truncated to nanoseconds, the old arithmetic, it came out a
        // nanosecond early, and so did 228 of the 1,000 nanoseconds after
        // 16.997934 s.
        let deadline = Duration::from_nanos(16_997_934_658);
        assert_eq!((deadline.as_secs_f64() * 1e9) as u64, 16_997_934_657);
        let early = (16_997_934_000u64..16_997_935_000)
            .filter(|&n| {
                let d = Duration::from_nanos(n);
                ((d.as_secs_f64() * 1e9) as u64) < n
            })
            .count();
        assert_eq!(early, 228);
        for n in 16_997_934_000u64..16_997_935_000 {
            let deadline = Duration::from_nanos(n);
            let mut q = Events::new();
            let mut alarm = Alarm::default();
            let at = alarm
                .plan(nanos(16.5), deadline)
                .expect("nothing planned yet");
            q.at_nanos(at, ());
            // A second look before it rings plans nothing new.
            assert_eq!(alarm.plan(nanos(16.6), deadline), None);
            let (t, ()) = q.pop().expect("queued");
            assert!(Duration::from_nanos(t) >= deadline, "{n}");
            // Once it rang, the next deadline is planned again.
            assert!(alarm.plan(t, deadline + Duration::from_secs(1)).is_some());
        }
    }

    #[test]
    fn events_at_one_time_are_handled_in_the_order_they_were_queued() {
        let mut q = Events::new();
        q.at(2.0, 'c');
        q.at(1.0, 'a');
        q.at(1.0, 'b');
        let order: Vec<char> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, ['a', 'b', 'c']);
    }

    #[test]
    fn simulation_is_repeatable() {
        assert_eq!(simulate(&cfg(5), false), simulate(&cfg(5), false));
    }

    #[test]
    fn neighbouring_seeds_draw_different_runs() {
        // Forcing the state's low bit on had merged each even seed with
        // the odd one after it (42 and 43 drew the same 1,000-node run).
        let draws: std::collections::BTreeSet<u64> = (0..64).map(|seed| Rng::new(seed).0).collect();
        assert_eq!(draws.len(), 64);
        let run = |seed| {
            let mut c = cfg(5);
            c.seed = seed;
            simulate(&c, false)
        };
        assert_ne!(run(42), run(43));
    }
}
