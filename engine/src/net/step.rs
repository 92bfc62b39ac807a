//! Step agreement as a pure state machine: no I/O, no clock of its own.
//! The libp2p node drives it in real time; the simulator drives the same
//! code in virtual time, so what the benchmark measures is what ships.
//!
//! Per step t: members announce contributions; the seeded leader of t waits
//! until every expected member's payload is held (or its collect window,
//! which grows with its compute time per step, has passed since the step
//! opened) and signs a manifest listing them; every node
//! applies exactly the manifest's contributions, in step order. If no
//! manifest arrives, the n-th fall-back leader publishes after a further
//! `n × fallback`.
//!
//! Timeouts cannot tell a dead leader from a slow one, so a fall-back's
//! manifest and a late leader's can both exist for one step, and nodes may
//! apply either. Every node therefore keeps the same one in the end, the
//! lowest by [`Manifest::rank`] (lower attempt, then lower id), and a node
//! that applied the other one *rewinds*: it goes back to its state before
//! that step and applies again from there ([`Verdict::Rewind`]). Manifests
//! carry the leader's history id, so a node that never saw the better
//! manifest learns of the fork from the next one and asks for it. Two
//! different manifests signed by one leader for one (step, attempt) are
//! also kept as equivocation evidence.

use super::msg::{self, Announce, Manifest};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Steps of manifests and payloads kept behind the applied step, for peers
/// that are catching up.
pub const KEEP: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Longest a leader waits for expected contributions after a step
    /// opens, at the least (see `collect_share`).
    pub collect: Duration,
    /// The leader waits this share of its own compute time per step
    /// instead, when that is longer ([`StepMachine::collect_window`]):
    /// members' compute times spread with their GPUs by a share of the
    /// step, so a fixed window lists only the fastest members of a job
    /// whose steps take many seconds, and the rest computed for nothing.
    pub collect_share: f64,
    /// Extra wait before each successive fall-back leader steps in.
    pub fallback: Duration,
    /// Interval between retries of a missing manifest or payload.
    pub retry: Duration,
    /// A member unheard of for this long is presumed gone. A fall-back
    /// leader steps in early only when every leader before it is gone: a
    /// live but slow leader is waited for, since two valid manifests for one
    /// step could split the nodes.
    pub alive: Duration,
    /// A live leader that stays silent this long is replaced anyway.
    pub silent: Duration,
    /// A request is given up after `request` plus its expected bytes at
    /// `floor_rate` bytes per second ([`Timing::deadline`]): a peer that
    /// trickles its answer costs that much, then the next holder is asked.
    pub request: Duration,
    pub floor_rate: u64,
}

impl Timing {
    /// How long to wait for an answer of about `bytes` bytes.
    pub fn deadline(&self, bytes: u64) -> Duration {
        self.request + Duration::from_secs_f64(bytes as f64 / self.floor_rate.max(1) as f64)
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            collect: Duration::from_secs(3),
            collect_share: 1.25,
            fallback: Duration::from_secs(2),
            retry: Duration::from_millis(500),
            alive: Duration::from_secs(2),
            silent: Duration::from_secs(10),
            request: Duration::from_secs(5),
            floor_rate: 256 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Fetch a payload by hash from this member.
    Fetch { hash: [u8; 32], from: u32 },
    /// Sign and gossip this manifest (already accepted locally).
    Publish(Manifest),
    /// Every payload of this manifest is held: apply it (in step order).
    /// `same_history`: its leader had applied exactly the manifests this
    /// node has, so its state hash must equal this node's.
    Apply {
        manifest: Manifest,
        same_history: bool,
    },
    /// Ask this member for a manifest we have not seen.
    RequestManifest { step: u32, from: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Already had this exact manifest.
    Duplicate,
    /// For a step already applied.
    Stale,
    WrongLeader,
    /// A second, different manifest from one leader for one attempt; or a
    /// member's second, different announcement for one step (forwarded
    /// once, as proof, so that every node learns the member announced
    /// twice: a member that showed each half of the job another
    /// announcement could otherwise have witnesses that heard one judge a
    /// leader that listed the other a forger).
    Equivocation,
    /// A further announcement from a member already seen announcing twice
    /// for the step: ignored (the proof went out with the first).
    Equivocated,
    /// Valid but a better-ranked manifest already holds the step.
    Superseded,
    /// Better than the manifest this node applied for this step: the node
    /// must go back to its state before the step (the machine already
    /// re-applies from there).
    Rewind,
    /// For a step beyond the window this node keeps state for (or past the
    /// epoch's end): ignored, so a member flooding far-future steps
    /// creates no state and no fetches.
    TooFar,
}

/// Steps ahead of the next one to apply that a node keeps state for; a
/// node that has not synced yet tracks at most twice this many steps.
pub const STEP_WINDOW: u32 = 16;

/// Two manifests one leader signed for the same step and attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Equivocation {
    pub first: Manifest,
    pub second: Manifest,
}

/// A contribution a leader's manifest left out although this node had held
/// it for half its collect window before the manifest came, or that an
/// early manifest (within that half of the step opening here) left out although its
/// member was expected and had announced it: a sign of censorship, not
/// proof (the leader may have heard of it later than this node did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Omission {
    pub step: u32,
    pub leader: u32,
    pub member: u32,
}

impl Equivocation {
    /// Two manifests on the same history: no rewind explains them, so they
    /// are proof against their leader. (After a rewind an honest leader's
    /// next manifests have another parent.)
    pub fn proves_fraud(&self) -> bool {
        self.first.parent == self.second.parent && self.first != self.second
    }
}

#[derive(Debug, Default)]
struct StepState {
    opened: Option<Duration>,
    announced: BTreeMap<u32, [u8; 32]>,
    /// What each member's announcement of a payload committed to beside
    /// it (its momentum's hash and the state it computed on), for its
    /// first announcement and the first one contradicting it (the proof
    /// of equivocation); None when one payload came under two commitments.
    committed: BTreeMap<(u32, [u8; 32]), Option<Committed>>,
    /// Members that announced two contributions for this step.
    equivocated: BTreeSet<u32>,
    /// Members whose first announcement this node held came after a
    /// manifest listed another payload under their name: whether that
    /// listing was forged or the member showed the leader another
    /// announcement, this node cannot tell, so it judges neither.
    listed_first: BTreeSet<u32>,
    manifest: Option<Manifest>,
    /// Entries of `manifest` whose payload is not held yet.
    missing: BTreeSet<[u8; 32]>,
    /// Every valid manifest seen, per (leader, attempt); more than one is
    /// equivocation.
    by_leader: BTreeMap<(u32, u8), Vec<Manifest>>,
    last_produced_us: u64,
    /// History id after applying `manifest` (set once it is applied).
    chain: Option<[u8; 32]>,
    /// Manifests (leader, attempt) that list a payload no member could
    /// serve: disqualified, so a fall-back can replace them.
    unservable: BTreeSet<(u32, u8)>,
}

impl StepState {
    /// The best-ranked manifest seen for the step that is not disqualified
    /// as unservable.
    fn best_servable(&self) -> Option<Manifest> {
        self.by_leader
            .iter()
            .filter(|(k, _)| !self.unservable.contains(k))
            .filter_map(|(_, ms)| ms.first())
            .min_by_key(|m| m.rank())
            .cloned()
    }
}

/// What an announcement commits to beside the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The hash of the author's momentum before the step (for audits).
    pub momentum: [u8; 32],
    /// The state the contribution was computed on.
    pub basis: [u8; 32],
}

#[derive(Debug)]
struct Pending {
    step: u32,
    member: u32,
    tries: u32,
    /// None until first asked.
    asked_at: Option<Duration>,
}

#[derive(Debug)]
pub struct StepMachine {
    pub job: [u8; 32],
    pub epoch: u32,
    seed: [u8; 32],
    n: u32,
    me: u32,
    timing: Timing,
    steps: BTreeMap<u32, StepState>,
    /// Payloads held, and since when (what the censorship check reads).
    held: BTreeMap<[u8; 32], Duration>,
    pending: BTreeMap<[u8; 32], Pending>,
    failed: BTreeSet<[u8; 32]>,
    /// Contributions the sharded exchange found nobody serves
    /// ([`Self::on_withheld`]): not fetched, not listed by this node, and
    /// a manifest listing one is disqualified, until it turns up.
    withheld: BTreeSet<[u8; 32]>,
    /// None while a joiner has not caught up yet.
    next_apply: Option<u32>,
    /// This node's state hash at step s (before applying step s), and the
    /// state step s's contributions were computed on, as its trainer
    /// reported both ([`Self::on_applied`]).
    state_hashes: BTreeMap<u32, ([u8; 32], [u8; 32])>,
    /// Rejoiners: member → first step it will contribute to.
    ready: BTreeMap<u32, u32>,
    manifest_asked: BTreeMap<u32, (Duration, u32)>,
    /// When each member was last heard from (any valid message).
    last_seen: BTreeMap<u32, Duration>,
    pub evidence: Vec<Equivocation>,
    /// Omissions seen, oldest first, until the node takes them (bounded).
    pub omissions: Vec<Omission>,
    pruned_to: Option<u32>,
    /// The first step this node applied from, and its history id before
    /// it: zeros at the epoch's start, the manifest's parent after a sync.
    base: (u32, [u8; 32]),
    /// Members a quorum of witnesses convicted: their announcements are
    /// refused, nobody waits for them, and this node's manifests leave
    /// them out.
    slashed: BTreeSet<u32>,
    /// One past the epoch's last step: nothing at or after it is tracked.
    end: u32,
    /// When this node last asked each member for its manifests because
    /// that member's heartbeat showed another history.
    fork_asked: BTreeMap<u32, Duration>,
    /// Manifest requests queued by [`Self::on_peer_history`] for the next
    /// poll.
    asks: Vec<Action>,
    /// Members whose heartbeats show a history this node cannot share
    /// (another history id at a step both applied, or `KEEP` steps ahead of
    /// it, past what anyone still serves payloads for), since when, and the
    /// step they were at. Cleared when a heartbeat agrees again.
    apart: BTreeMap<u32, (Duration, u32)>,
    /// Each member's recent heartbeats: step → its history id before that
    /// step (the last `2 × KEEP` steps it reported). Two members that
    /// reported different ids for one step are on different histories.
    reports: BTreeMap<u32, BTreeMap<u32, [u8; 32]>>,
    /// This node's compute time per step, smoothed ([`Self::on_compute`]).
    pace: Option<Duration>,
}

impl StepMachine {
    /// `start`: the first step to apply, or None for a node that must catch
    /// up from a peer's checkpoint first.
    pub fn new(
        job: [u8; 32],
        epoch: u32,
        seed: [u8; 32],
        members: u32,
        me: u32,
        timing: Timing,
        start: Option<u32>,
    ) -> Self {
        Self {
            job,
            epoch,
            seed,
            n: members.max(1),
            me,
            timing,
            steps: BTreeMap::new(),
            held: BTreeMap::new(),
            pending: BTreeMap::new(),
            failed: BTreeSet::new(),
            withheld: BTreeSet::new(),
            next_apply: start,
            state_hashes: BTreeMap::new(),
            ready: BTreeMap::new(),
            manifest_asked: BTreeMap::new(),
            last_seen: BTreeMap::new(),
            evidence: Vec::new(),
            omissions: Vec::new(),
            pruned_to: None,
            base: (start.unwrap_or(0), [0; 32]),
            slashed: BTreeSet::new(),
            end: u32::MAX,
            fork_asked: BTreeMap::new(),
            asks: Vec::new(),
            apart: BTreeMap::new(),
            reports: BTreeMap::new(),
            pace: None,
        }
    }

    /// This node took `took` to compute its contribution to a step. The
    /// collect window follows the smoothed figure, so one slow step (a
    /// game started on the GPU) moves it by a quarter.
    pub fn on_compute(&mut self, took: Duration) {
        self.pace = Some(match self.pace {
            Some(p) => (p * 3 + took) / 4,
            None => took,
        });
    }

    /// How long this node, leading a step, waits for the expected
    /// contributions after the step opens: `collect`, or `collect_share`
    /// of its compute time per step when that is longer.
    pub fn collect_window(&self) -> Duration {
        let scaled = self.pace.and_then(|p| {
            Duration::try_from_secs_f64(p.as_secs_f64() * self.timing.collect_share).ok()
        });
        scaled.map_or(self.timing.collect, |w| w.max(self.timing.collect))
    }

    /// How long a live fall-back leader's predecessors may stay silent past
    /// its slot: `silent`, plus what the pace adds to this node's collect
    /// window, so a leader slower than this node (a longer window of its
    /// own) is not raced.
    fn silent_limit(&self) -> Duration {
        self.timing.silent + self.collect_window().saturating_sub(self.timing.collect)
    }

    /// Sets one past the epoch's last step (default: no end).
    pub fn with_end(mut self, end: u32) -> Self {
        self.end = end;
        self
    }

    /// Whether `step` is inside the window this node keeps state for:
    /// before the epoch's end, and at most `STEP_WINDOW` steps past the next
    /// one to apply (a node still syncing tracks a bounded number of steps).
    pub fn in_window(&self, step: u32) -> bool {
        if step >= self.end {
            return false;
        }
        match self.next_apply {
            Some(next) => step < next.saturating_add(STEP_WINDOW),
            None => self.steps.contains_key(&step) || self.steps.len() < 2 * STEP_WINDOW as usize,
        }
    }

    /// Drops `member` from every manifest this node leads from now on.
    pub fn slash(&mut self, member: u32) {
        self.slashed.insert(member);
    }

    pub fn is_slashed(&self, member: u32) -> bool {
        self.slashed.contains(&member)
    }

    pub fn members(&self) -> u32 {
        self.n
    }
    pub fn next_apply(&self) -> Option<u32> {
        self.next_apply
    }

    /// Leader of `step` at `attempt`: a seeded rotation, so nobody can pick
    /// when they lead and everyone computes the same order.
    pub fn leader(&self, step: u32, attempt: u8) -> u32 {
        (self.rotation(step) + attempt as u32) % self.n
    }

    fn rotation(&self, step: u32) -> u32 {
        let mut h = blake3::Hasher::new();
        h.update(b"cohort-leader-v1");
        h.update(&self.seed);
        h.update(&self.epoch.to_le_bytes());
        h.update(&step.to_le_bytes());
        let d = h.finalize();
        let start = u64::from_le_bytes(d.as_bytes()[..8].try_into().unwrap_or([0; 8]));
        (start % self.n as u64) as u32
    }

    /// The attempt at which this node leads `step`, if within the u8 range.
    fn my_attempt(&self, step: u32) -> Option<u8> {
        u8::try_from((self.me + self.n - self.rotation(step)) % self.n).ok()
    }

    fn step_mut(&mut self, step: u32) -> &mut StepState {
        self.steps.entry(step).or_default()
    }

    fn want(&mut self, hash: [u8; 32], step: u32, member: u32) {
        if self.held.contains_key(&hash)
            || self.pending.contains_key(&hash)
            || self.withheld.contains(&hash)
        {
            return;
        }
        self.pending.insert(
            hash,
            Pending {
                step,
                member,
                tries: 0,
                asked_at: None,
            },
        );
        self.failed.insert(hash);
    }

    /// Any valid message from `member` (heartbeats included).
    pub fn on_alive(&mut self, now: Duration, member: u32) {
        self.last_seen.insert(member, now);
    }

    /// Whether `member` sent any valid message in the last `within`.
    pub fn heard_within(&self, now: Duration, member: u32, within: Duration) -> bool {
        self.last_seen
            .get(&member)
            .is_some_and(|t| now < *t + within)
    }

    fn gone(&self, now: Duration, member: u32) -> bool {
        member != self.me
            && self
                .last_seen
                .get(&member)
                .is_none_or(|t| now >= *t + self.timing.alive)
    }

    /// A contribution announcement (signature and membership checked).
    /// Only a fresh announcement shows its member alive: a replayed or
    /// stale one, re-gossiped by anyone, must not keep a dead leader looking
    /// alive (that would hold its fall-back back).
    pub fn on_announce(&mut self, now: Duration, a: &Announce) -> Verdict {
        // Another job's or epoch's: a member's genuine old announcement,
        // replayed, is none of this epoch's steps (as for manifests).
        if a.job != self.job || a.epoch != self.epoch {
            return Verdict::TooFar;
        }
        if self.next_apply.is_some_and(|s| a.step < s) || self.slashed.contains(&a.member) {
            return Verdict::Stale;
        }
        if !self.in_window(a.step) {
            return Verdict::TooFar;
        }
        let st = self.step_mut(a.step);
        st.opened.get_or_insert(now);
        let committed = Committed {
            momentum: a.momentum_hash,
            basis: a.basis,
        };
        // The same payload under another momentum or state is another
        // announcement too: it would split the witnesses over what to audit.
        let key = (a.member, a.payload_hash);
        match (st.announced.get(&a.member), st.committed.get(&key)) {
            (Some(h), Some(Some(c))) if *h == a.payload_hash && *c == committed => {
                return Verdict::Duplicate;
            }
            // Listed by a manifest before its announcement came: this is
            // the announcement, not a second one; and so is one of another
            // payload while this node holds nothing the member signed (a
            // manifest listing a made-up root under its name must not make
            // its real announcement an equivocation, which every fall-back
            // leader would leave out).
            (Some(h), None) if *h == a.payload_hash => {}
            (Some(_), _)
                if st
                    .committed
                    .range((a.member, [0; 32])..=(a.member, [0xff; 32]))
                    .next()
                    .is_none() =>
            {
                st.listed_first.insert(a.member);
            }
            // The same payload under a second commitment, even from a
            // member already seen announcing twice: forwarded once more
            // as the proof that makes it ambiguous (`Self::ambiguous`),
            // once per payload (at most two are kept per member).
            (Some(_), Some(Some(c))) if *c != committed => {
                st.equivocated.insert(a.member);
                st.committed.insert(key, None);
                return Verdict::Equivocation;
            }
            (Some(_), _) => {
                if !st.equivocated.insert(a.member) {
                    return Verdict::Equivocated;
                }
                // Kept (once) beside the first: a manifest listing this
                // payload is still audited on what it committed to, unless
                // the same payload came under two commitments.
                let c = st.committed.entry(key).or_insert(Some(committed));
                if *c != Some(committed) {
                    *c = None;
                }
                return Verdict::Equivocation;
            }
            (None, _) => {}
        }
        st.announced.insert(a.member, a.payload_hash);
        st.committed.insert(key, Some(committed));
        st.last_produced_us = st.last_produced_us.max(a.produced_us);
        self.on_alive(now, a.member);
        if self
            .ready
            .get(&a.member)
            .is_some_and(|&from| a.step >= from)
        {
            self.ready.remove(&a.member);
        }
        self.want(a.payload_hash, a.step, a.member);
        Verdict::Accepted
    }

    /// Whether this node holds two announcements of `payload` by `member`
    /// at `step` under different commitments: both signed by `member`, so
    /// proof against it, and neither auditable.
    pub fn ambiguous(&self, step: u32, member: u32, payload: &[u8; 32]) -> bool {
        self.steps
            .get(&step)
            .and_then(|st| st.committed.get(&(member, *payload)))
            .is_some_and(Option::is_none)
    }

    /// What `member` committed to beside `payload` in its announcement of
    /// `step`, if this node holds an announcement of `payload` and only one
    /// commitment for it (a member that announced another payload too is
    /// still audited on the one a manifest lists).
    pub fn committed(&self, step: u32, member: u32, payload: &[u8; 32]) -> Option<Committed> {
        self.steps
            .get(&step)?
            .committed
            .get(&(member, *payload))
            .copied()
            .flatten()
    }

    /// The state step `step`'s contributions are computed on (pipelining:
    /// the state before step `step - 1`'s update; an epoch's first step's
    /// are computed on its starting state, like the next step's), once this
    /// node reached the state before `step`: its trainer's word, so a node
    /// that synced at `step` knows it as well as one that applied `step - 1`.
    pub fn basis_of(&self, step: u32) -> Option<[u8; 32]> {
        self.state_hashes.get(&step).map(|s| s.1)
    }

    /// Whether listing `listed` under `member` at `step` is the leader's
    /// forgery: this node holds `member`'s signed announcement of another
    /// hash, and `member` announced nothing else. (Bytes a member announced
    /// itself are its own doing, whatever they hold.)
    pub fn leader_forged(&self, step: u32, member: u32, listed: &[u8; 32]) -> bool {
        self.steps.get(&step).is_some_and(|st| {
            !st.equivocated.contains(&member)
                && !st.listed_first.contains(&member)
                && st.announced.get(&member).is_some_and(|h| h != listed)
        })
    }

    /// This node's own contribution, held locally.
    pub fn on_local(&mut self, now: Duration, a: &Announce) {
        self.held.entry(a.payload_hash).or_insert(now);
        self.on_announce(now, a);
    }

    /// A payload arrived and matched its hash. A manifest disqualified as
    /// unservable whose payloads are now all held is whole again and takes
    /// its rank back: "nobody could serve it" was this node's judgement
    /// (timeouts on a loaded link), not a fact every node shares, and a node
    /// that kept a worse manifest for good would split from the others for
    /// good. Returns the step to rewind to when the restored manifest
    /// outranks one this node already applied.
    pub fn on_payload(&mut self, now: Duration, hash: [u8; 32]) -> Option<u32> {
        self.pending.remove(&hash);
        self.failed.remove(&hash);
        self.withheld.remove(&hash);
        self.held.entry(hash).or_insert(now);
        let held = &self.held;
        let mut restored = Vec::new();
        for st in self.steps.values_mut() {
            st.missing.remove(&hash);
            let whole: Vec<(u32, u8)> = st
                .unservable
                .iter()
                .filter(|k| {
                    st.by_leader
                        .get(k)
                        .and_then(|v| v.first())
                        .is_some_and(|m| {
                            m.entries.iter().any(|e| e.1 == hash)
                                && m.entries.iter().all(|e| held.contains_key(&e.1))
                        })
                })
                .copied()
                .collect();
            for k in whole {
                st.unservable.remove(&k);
                if let Some(m) = st.by_leader.get(&k).and_then(|v| v.first())
                    && st.manifest.as_ref().is_none_or(|cur| m.rank() < cur.rank())
                {
                    restored.push(m.clone());
                }
            }
        }
        let mut rewind_to = None;
        for m in restored {
            let step = m.step;
            if self.next_apply.is_some_and(|s| step < s) {
                if step < self.base.0 {
                    continue;
                }
                self.install(m);
                self.rewind(step);
                rewind_to = Some(rewind_to.map_or(step, |r: u32| r.min(step)));
            } else {
                self.install(m);
            }
        }
        rewind_to
    }

    /// This node's history: the next step it applies and its history id
    /// before it (what its heartbeat tells peers). None while syncing.
    pub fn history(&self) -> Option<(u32, [u8; 32])> {
        let next = self.next_apply?;
        Some((next, self.chain_before(next)?))
    }

    /// Whether this node's history before `step` is `chain`.
    pub fn agrees(&self, step: u32, chain: &[u8; 32]) -> bool {
        self.chain_before(step).as_ref() == Some(chain)
    }

    /// A member's heartbeat says its history before `step` is `chain`. If
    /// this node applied that far on another history, the two forked and
    /// neither may learn of it from a later manifest (at the epoch's end
    /// there is none; a manifest this node disqualified is not asked for
    /// again): ask the member for its recent manifests, so whichever holds
    /// the worse one rewinds. At most once per member per two seconds.
    pub fn on_peer_history(&mut self, now: Duration, member: u32, step: u32, chain: [u8; 32]) {
        if member == self.me || member >= self.n || step == 0 || self.slashed.contains(&member) {
            return;
        }
        self.note_apart(now, member, step, &chain);
        self.note_report(member, step, chain);
        let Some(mine) = self.chain_before(step) else {
            return;
        };
        if mine == chain
            || self
                .fork_asked
                .get(&member)
                .is_some_and(|t| now < *t + self.timing.retry * 4)
        {
            return;
        }
        self.fork_asked.insert(member, now);
        let from = step.saturating_sub(KEEP).max(self.base.0);
        for step in from..step {
            self.asks
                .push(Action::RequestManifest { step, from: member });
        }
    }

    /// Whether `member`, whose history before `step` is `chain`, is on a
    /// history this node cannot reach by rewinding or fetching: see
    /// [`Self::majority_elsewhere`].
    fn note_apart(&mut self, now: Duration, member: u32, step: u32, chain: &[u8; 32]) {
        let Some(next) = self.next_apply else {
            return;
        };
        let apart = match self.chain_before(step) {
            Some(mine) => mine != *chain,
            // Far ahead: the payloads of the steps between are pruned
            // everywhere, so this node can only catch up by download.
            None if step >= next.saturating_add(KEEP) => true,
            // A little ahead (it will be compared once this node gets
            // there), or behind what this node kept: no news.
            None => return,
        };
        if apart {
            let since = self.apart.get(&member).map_or(now, |a| a.0);
            self.apart.insert(member, (since, step));
        } else {
            self.apart.remove(&member);
        }
    }

    /// Keeps `member`'s report that its history before `step` is `chain`.
    /// A report for an earlier step than it last gave means it went back
    /// (a rewind, a download): what it reported beyond it is from a
    /// history it left.
    fn note_report(&mut self, member: u32, step: u32, chain: [u8; 32]) {
        let r = self.reports.entry(member).or_default();
        r.retain(|&s, _| s <= step);
        r.insert(step, chain);
        while r.len() > 2 * KEEP as usize {
            r.pop_first();
        }
    }

    /// Whether `a` and `b` reported different histories before the latest
    /// step both reported. Only the latest: a fork carries forward, so two
    /// members apart at one step stay apart after it unless one of them
    /// left its history, and then its older reports are the stale ones.
    fn disagree(&self, a: u32, b: u32) -> bool {
        let (Some(ra), Some(rb)) = (self.reports.get(&a), self.reports.get(&b)) else {
            return false;
        };
        ra.iter()
            .rev()
            .find_map(|(s, c)| rb.get(s).map(|c2| c2 != c))
            .unwrap_or(false)
    }

    /// Where to download the state from when most members went another way
    /// and stayed there. Rewinds settle a fork between two manifests within
    /// a retry or two; but a node that judged the better manifest
    /// unservable (its requests timed out on a loaded machine), or that
    /// fell further behind than anyone keeps payloads for, keeps its own
    /// history, and a model split for good is worse than a download. Only a
    /// majority of the members not slashed (this node counted) that has
    /// disagreed with it for `Timing::silent` moves it, so the members a
    /// job can have faulty cannot. The answer is the latest step whose
    /// manifest this node holds from one of them, and that leader: its
    /// state hash names the state to fetch.
    pub fn majority_elsewhere(&self, now: Duration) -> Option<(u32, u32)> {
        self.next_apply?;
        let settled: BTreeSet<u32> = self
            .apart
            .iter()
            .filter(|(m, (since, _))| {
                !self.slashed.contains(m) && *since + self.timing.silent <= now
            })
            .map(|(m, _)| *m)
            .collect();
        let active = self.n as usize - self.slashed.len();
        if settled.len() * 2 <= active {
            return None;
        }
        // The majority must be on one history, the leader's: members apart
        // from this node but on histories of their own are no majority
        // (seen under overload: three members on three histories each
        // counted the other two, all three downloaded, and nobody was left
        // holding a state to serve).
        self.steps
            .iter()
            .rev()
            .filter_map(|(step, st)| st.manifest.as_ref().map(|m| (*step, m.leader)))
            .find(|(_, leader)| {
                settled.contains(leader)
                    && settled
                        .iter()
                        .filter(|m| !self.disagree(**m, *leader))
                        .count()
                        * 2
                        > active
            })
    }

    /// A fetch failed or timed out: try the next holder on the next poll.
    /// Once every member has been asked in vain for a payload the step's
    /// (unapplied) manifest lists, that manifest is unservable: it is
    /// disqualified and the best other manifest, or a fall-back leader's,
    /// takes the step. Without this an attempt-0 leader that lists a hash
    /// nobody holds (or dies right after publishing) stalls the job forever.
    pub fn on_fetch_failed(&mut self, hash: [u8; 32]) {
        let Some(p) = self.pending.get_mut(&hash) else {
            return;
        };
        p.tries += 1;
        self.failed.insert(hash);
        let (step, tries) = (p.step, p.tries);
        if tries < self.n.max(2) || self.next_apply.is_none_or(|next| step < next) {
            return;
        }
        let Some(st) = self.steps.get_mut(&step) else {
            return;
        };
        let Some(m) = st.manifest.as_ref().filter(|_| st.missing.contains(&hash)) else {
            return;
        };
        st.unservable.insert((m.leader, m.attempt));
        tracing::debug!(
            me = self.me,
            step,
            leader = m.leader,
            attempt = m.attempt,
            "manifest given up as unservable"
        );
        st.manifest = None;
        st.missing.clear();
        if let Some(m) = st.best_servable() {
            self.install(m);
        }
    }

    /// The sharded exchange found that nobody serves `member`'s
    /// contribution to `step` (its seats and this node asked every holder
    /// in vain): what an unservable payload is on the all-to-all exchange.
    /// Every manifest listing it is disqualified, and this node's own
    /// leaves it out, so the best other manifest or a fall-back leader's
    /// takes the step. Like "unservable", this is this node's judgement: a
    /// contribution that turns up later ([`Self::on_payload`]) restores
    /// what it disqualified. Returns the step to rewind to if the
    /// disqualified manifest had been handed over to apply.
    pub fn on_withheld(&mut self, step: u32, member: u32) -> Option<u32> {
        let st = self.steps.get(&step)?;
        let hashes: BTreeSet<[u8; 32]> = st
            .by_leader
            .values()
            .flatten()
            .flat_map(|m| m.entries.iter())
            .filter(|e| e.0 == member)
            .map(|e| e.1)
            .chain(st.announced.get(&member).copied())
            .collect();
        if hashes.is_empty() {
            return None;
        }
        for h in &hashes {
            self.held.remove(h);
            self.pending.remove(h);
            self.failed.remove(h);
            self.withheld.insert(*h);
        }
        let lists = |m: &Manifest| m.entries.iter().any(|e| hashes.contains(&e.1));
        let st = self.steps.get_mut(&step)?;
        let bad: Vec<(u32, u8)> = st
            .by_leader
            .iter()
            .filter(|(_, ms)| ms.first().is_some_and(lists))
            .map(|(k, _)| *k)
            .collect();
        st.unservable.extend(bad);
        if !st.manifest.as_ref().is_some_and(lists) {
            return None;
        }
        tracing::debug!(
            me = self.me,
            step,
            member,
            "manifest given up: a contribution is withheld"
        );
        st.manifest = None;
        st.missing.clear();
        st.chain = None;
        if let Some(m) = st.best_servable() {
            self.install(m);
        }
        if self.next_apply.is_some_and(|next| step < next) {
            self.rewind(step);
            return Some(step);
        }
        None
    }

    /// `member`'s contribution to `step`, once given up as withheld, turned
    /// up after all: see [`Self::on_payload`].
    pub fn on_served(&mut self, now: Duration, step: u32, member: u32) -> Option<u32> {
        let hash = self.steps.get(&step)?.announced.get(&member).copied()?;
        self.on_payload(now, hash)
    }

    /// A member declared it will contribute from `from` on (a rejoiner).
    pub fn on_ready(&mut self, member: u32, from: u32) {
        if member != self.me && self.next_apply.is_none_or(|s| from >= s) {
            self.ready.insert(member, from);
        }
    }

    /// This node's trainer reached `step` (before applying it) with `hash`;
    /// the contributions it applies at `step` must have been computed on
    /// `basis` (the trainer's `Basis::expected`: the state before step
    /// `step - 1`, or the starting state at the epoch's first step).
    pub fn on_applied(&mut self, step: u32, hash: [u8; 32], basis: [u8; 32]) {
        self.state_hashes.insert(step, (hash, basis));
    }

    /// The last timestamp any contribution of `step` was produced at.
    pub fn last_produced_us(&self, step: u32) -> u64 {
        self.steps.get(&step).map_or(0, |s| s.last_produced_us)
    }

    /// The next manifest to apply is `step`, with history `parent` before
    /// it: zeros at the epoch's start, the manifest's parent after a
    /// checkpoint download.
    pub fn resync(&mut self, step: u32, parent: [u8; 32]) {
        self.next_apply = Some(step);
        self.apart.clear();
        self.base = (step, parent);
        self.steps.retain(|&s, _| s + KEEP >= step);
        for st in self.steps.values_mut() {
            st.chain = None;
        }
        // The state at `step` is whatever the trainer loads next (it
        // reports it): an entry kept from the history left would lead
        // `step` on that history's state.
        self.state_hashes.retain(|&s, _| s < step);
    }

    /// Stop applying until [`Self::resync`]: this node must download the
    /// state again (a rewind further back than it kept states for).
    pub fn unsync(&mut self) {
        self.next_apply = None;
    }

    /// This node's history id before `step`, if it applied up to there.
    fn chain_before(&self, step: u32) -> Option<[u8; 32]> {
        if step == self.base.0 {
            return Some(self.base.1);
        }
        self.steps.get(&step.checked_sub(1)?)?.chain
    }

    pub fn manifest(&self, step: u32) -> Option<&Manifest> {
        self.steps.get(&step)?.manifest.as_ref()
    }

    /// The latest step with a known manifest (what a joiner syncs to).
    pub fn latest_manifest(&self) -> Option<&Manifest> {
        self.steps.values().rev().find_map(|s| s.manifest.as_ref())
    }

    pub fn on_manifest(&mut self, now: Duration, m: Manifest) -> Verdict {
        if m.job != self.job || m.epoch != self.epoch || m.attempt as u32 >= self.n {
            return Verdict::WrongLeader;
        }
        if self.leader(m.step, m.attempt) != m.leader {
            return Verdict::WrongLeader;
        }
        let applied = self.next_apply.is_some_and(|s| m.step < s);
        if !applied && !self.in_window(m.step) {
            return Verdict::TooFar;
        }
        // Steps already pruned, or from before this node's start, cannot be
        // rewound to.
        if applied && (m.step < self.base.0 || !self.steps.contains_key(&m.step)) {
            return Verdict::Stale;
        }
        let st = self.step_mut(m.step);
        st.opened.get_or_insert(now);
        if st.unservable.contains(&(m.leader, m.attempt)) {
            return Verdict::Stale;
        }
        let seen = st.by_leader.entry((m.leader, m.attempt)).or_default();
        // A few manifests per attempt are kept (one is the rule, two the
        // proof); more from an equivocating leader are only a flood.
        if seen.contains(&m) || seen.len() >= 4 {
            return Verdict::Duplicate;
        }
        let first = seen.first().cloned();
        let equivocation = first.is_some();
        // Kept bounded: a few pairs per (leader, step, attempt), none once
        // one proves fraud.
        if let Some(first) = first {
            let key = (m.leader, m.step, m.attempt);
            let same: Vec<&Equivocation> = self
                .evidence
                .iter()
                .filter(|e| (e.first.leader, e.first.step, e.first.attempt) == key)
                .collect();
            if same.len() < 4 && !same.iter().any(|e| e.proves_fraud()) {
                self.evidence.push(Equivocation {
                    first,
                    second: m.clone(),
                });
            }
        }
        self.note_omissions(now, &m);
        let withheld = m.entries.iter().any(|e| self.withheld.contains(&e.1));
        let st = self.step_mut(m.step);
        st.by_leader
            .entry((m.leader, m.attempt))
            .or_default()
            .push(m.clone());
        if withheld {
            // Kept (a contribution that turns up restores it), not taken.
            st.unservable.insert((m.leader, m.attempt));
            return if equivocation {
                Verdict::Equivocation
            } else {
                Verdict::Superseded
            };
        }
        let better = st.manifest.as_ref().is_none_or(|cur| m.rank() < cur.rank());
        if !better {
            return match (equivocation, applied) {
                (true, _) => Verdict::Equivocation,
                (false, true) => Verdict::Stale,
                (false, false) => Verdict::Superseded,
            };
        }
        let step = m.step;
        self.install(m);
        if applied {
            self.rewind(step);
            return Verdict::Rewind;
        }
        if equivocation {
            Verdict::Equivocation
        } else {
            Verdict::Accepted
        }
    }

    /// Records what `m` leaves out that this node had held for a while.
    fn note_omissions(&mut self, now: Duration, m: &Manifest) {
        let Some(st) = self.steps.get(&m.step) else {
            return;
        };
        let grace = self.collect_window() / 2;
        // A leader publishes early only once it holds every expected
        // member's payload, so an early manifest lists them all.
        let early = st.opened.is_some_and(|o| now < o + grace);
        let expected = if early {
            self.expected(m.step)
        } else {
            BTreeSet::new()
        };
        let left_out: Vec<u32> = st
            .announced
            .iter()
            .filter(|(member, hash)| {
                **member != m.leader
                    && !self.slashed.contains(*member)
                    && !m.entries.iter().any(|(w, _)| w == *member)
                    && (expected.contains(*member)
                        || self.held.get(*hash).is_some_and(|t| *t + grace <= now))
            })
            .map(|(member, _)| *member)
            .collect();
        for member in left_out {
            if self.omissions.len() >= 1024 {
                self.omissions.remove(0);
            }
            self.omissions.push(Omission {
                step: m.step,
                leader: m.leader,
                member,
            });
        }
    }

    /// Makes `m` the step's manifest and fetches what it lists.
    fn install(&mut self, m: Manifest) {
        let (step, entries) = (m.step, m.entries.clone());
        let st = self.step_mut(step);
        for (member, hash) in &entries {
            st.announced.entry(*member).or_insert(*hash);
        }
        st.manifest = Some(m);
        let missing = entries
            .iter()
            .map(|e| e.1)
            .filter(|h| !self.held.contains_key(h))
            .collect();
        self.step_mut(step).missing = missing;
        for (member, hash) in entries {
            self.want(hash, step, member);
        }
    }

    /// Applies again from `step`: its state before `step` is unchanged,
    /// everything after is recomputed.
    fn rewind(&mut self, step: u32) {
        self.next_apply = Some(step);
        for st in self.steps.range_mut(step..).map(|(_, st)| st) {
            st.chain = None;
        }
        self.state_hashes.retain(|&s, _| s <= step);
    }

    fn expected(&self, step: u32) -> BTreeSet<u32> {
        let mut e: BTreeSet<u32> = match step.checked_sub(1).and_then(|p| self.steps.get(&p)) {
            Some(prev) if !prev.announced.is_empty() => prev.announced.keys().copied().collect(),
            _ => (0..self.n).collect(),
        };
        e.extend(
            self.ready
                .iter()
                .filter(|(_, from)| **from <= step)
                .map(|(m, _)| *m),
        );
        e.insert(self.me);
        e.retain(|m| !self.slashed.contains(m));
        e
    }

    /// Whether every member expected at `step` has announced a payload we
    /// hold. The announcement count is checked first: this runs after every
    /// event, and at a thousand members the full check on each would cost
    /// the simulator (and a busy leader) members² per step.
    fn all_expected_held(&self, step: u32, st: &StepState) -> bool {
        if st.announced.len() < self.expected_floor(step) {
            return false;
        }
        self.expected(step).iter().all(|m| {
            st.announced
                .get(m)
                .is_some_and(|h| self.held.contains_key(h))
        })
    }

    /// A lower bound on `expected(step).len()`, without building the set.
    fn expected_floor(&self, step: u32) -> usize {
        match step.checked_sub(1).and_then(|p| self.steps.get(&p)) {
            Some(prev) if !prev.announced.is_empty() => {
                prev.announced.len()
                    - self
                        .slashed
                        .iter()
                        .filter(|m| prev.announced.contains_key(m))
                        .count()
            }
            _ => self.n as usize - self.slashed.len(),
        }
    }

    fn publish_at(&self, attempt: u8, opened: Duration) -> Duration {
        opened + self.collect_window() + self.timing.fallback * attempt as u32
    }

    /// What to do now. Call after every event and at [`Self::next_deadline`].
    pub fn poll(&mut self, now: Duration) -> Vec<Action> {
        let mut out = std::mem::take(&mut self.asks);
        self.lead(now, &mut out);
        // Deliver in order.
        while let Some(next) = self.next_apply {
            let Some(st) = self.steps.get(&next) else {
                break;
            };
            let Some(m) = st.manifest.clone().filter(|_| st.missing.is_empty()) else {
                break;
            };
            let Some(before) = self.chain_before(next) else {
                break;
            };
            let same_history = m.parent == before;
            if !same_history {
                // The leader applied something we did not (or the reverse):
                // ask it for its recent manifests, so whichever of us holds
                // the worse one learns of the better and rewinds.
                let from = next.saturating_sub(KEEP).max(self.base.0);
                for step in from..next {
                    out.push(Action::RequestManifest {
                        step,
                        from: m.leader,
                    });
                }
            }
            self.step_mut(next).chain = Some(msg::chain(&before, &m.id()));
            out.push(Action::Apply {
                manifest: m,
                same_history,
            });
            self.next_apply = Some(next + 1);
        }
        self.ask_missing_manifest(now, &mut out);
        // (Re)issue fetches.
        // Fetches are re-issued only after a reported failure: transfers of
        // large payloads on slow links legitimately take long, and a
        // timer-driven retry would send them twice.
        let due: Vec<[u8; 32]> = self
            .failed
            .iter()
            .filter(|h| {
                self.pending
                    .get(*h)
                    .is_some_and(|p| p.asked_at.is_none_or(|t| now >= t + self.timing.retry))
            })
            .copied()
            .collect();
        for hash in due {
            let Some(p) = self.pending.get(&hash) else {
                self.failed.remove(&hash);
                continue;
            };
            let leader = self
                .steps
                .get(&p.step)
                .and_then(|s| s.manifest.as_ref())
                .map(|m| m.leader);
            let holders = self.holders(p.member, leader);
            if holders.is_empty() {
                self.failed.remove(&hash);
                continue;
            }
            let from = holders[p.tries as usize % holders.len()];
            if let Some(p) = self.pending.get_mut(&hash) {
                p.asked_at = Some(now);
                out.push(Action::Fetch { hash, from });
            }
            self.failed.remove(&hash);
        }
        self.prune();
        out
    }

    /// Whom to ask for a payload, in turn: its author, then the leader whose
    /// manifest lists it, then every other member in order; each once,
    /// never this node or a slashed member (a slashed member's answers are
    /// refused, and asking the same slow member again and again made a
    /// loaded node give up on a manifest every other node applied).
    fn holders(&self, author: u32, leader: Option<u32>) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::with_capacity(self.n as usize);
        let rest = (1..self.n).map(|k| (author + k) % self.n);
        for m in std::iter::once(author).chain(leader).chain(rest) {
            if m != self.me && m < self.n && !self.slashed.contains(&m) && !out.contains(&m) {
                out.push(m);
            }
        }
        out
    }

    fn lead(&mut self, now: Duration, out: &mut Vec<Action>) {
        let Some(next) = self.next_apply else {
            return;
        };
        let open: Vec<(u32, Duration)> = self
            .steps
            .range(next..)
            .filter(|(_, s)| s.manifest.is_none())
            .filter_map(|(&t, s)| s.opened.map(|o| (t, o)))
            .collect();
        for (step, opened) in open {
            let Some(&(state_hash, _)) = self.state_hashes.get(&step) else {
                continue;
            };
            let Some(attempt) = self.my_attempt(step) else {
                continue;
            };
            if attempt > 0 {
                if now < self.publish_at(attempt, opened) {
                    continue;
                }
                // Earlier leaders are waited for while they may still
                // publish: not once gone, nor once this node gave up what
                // one published (it is live, not silent: the wait would
                // only add `silent` to a step already late).
                let st = &self.steps[&step];
                let before_gone = (0..attempt).all(|a| {
                    let l = self.leader(step, a);
                    self.gone(now, l) || st.unservable.contains(&(l, a))
                });
                if !before_gone && now < self.publish_at(attempt, opened) + self.silent_limit() {
                    continue;
                }
            }
            let st = &self.steps[&step];
            // One manifest per attempt: a second, even after this node
            // gave its first up, is equivocation.
            if st.by_leader.contains_key(&(self.me, attempt)) {
                continue;
            }
            let due = if attempt == 0 {
                now >= self.publish_at(0, opened) || self.all_expected_held(step, st)
            } else {
                now >= self.publish_at(attempt, opened)
            };
            if !due {
                continue;
            }
            // Only contributions computed on the step's state: one computed
            // on an abandoned history (its author rewound since) would fail
            // an honest author's audit, and one claiming another state
            // would escape its own (the sharded exchange's witnesses judge
            // by the announced basis, and accuse a leader that lists
            // another: `train::foreign_bases`). Known with the state hash.
            let Some(basis) = self.basis_of(step) else {
                continue;
            };
            let held: Vec<(u32, [u8; 32])> = st
                .announced
                .iter()
                .filter(|(m, h)| self.held.contains_key(*h) && !self.slashed.contains(*m))
                .filter(|(m, h)| {
                    st.committed
                        .get(&(**m, **h))
                        .copied()
                        .flatten()
                        .map(|c| c.basis)
                        == Some(basis)
                })
                // An author that announced twice may have sent either
                // anywhere: listed, it would be audited by some witnesses
                // and not others (`committed` names neither).
                .filter(|(m, _)| !st.equivocated.contains(*m))
                .map(|(m, h)| (*m, *h))
                .collect();
            let Some(parent) = self.chain_before(step) else {
                continue;
            };
            let m = Manifest {
                job: self.job,
                epoch: self.epoch,
                step,
                attempt,
                leader: self.me,
                state_hash,
                parent,
                entries: held,
            };
            if self.on_manifest(now, m.clone()) == Verdict::Accepted {
                out.push(Action::Publish(m));
            }
        }
    }

    fn ask_missing_manifest(&mut self, now: Duration, out: &mut Vec<Action>) {
        let Some(next) = self.next_apply else {
            return;
        };
        let Some(st) = self.steps.get(&next) else {
            return;
        };
        if st.manifest.is_some() {
            return;
        }
        let later = self
            .steps
            .range(next + 1..)
            .any(|(_, s)| s.manifest.is_some() || s.opened.is_some());
        let overdue = st
            .opened
            .is_some_and(|o| now >= self.publish_at(self.n.min(4) as u8, o));
        if !(later || overdue) {
            return;
        }
        let (asked, tries) = self
            .manifest_asked
            .get(&next)
            .copied()
            .unwrap_or((Duration::ZERO, 0));
        if tries > 0 && now < asked + self.timing.retry {
            return;
        }
        let mut from = (self.leader(next, 0) + tries) % self.n;
        if from == self.me {
            from = (from + 1) % self.n;
        }
        if from != self.me {
            self.manifest_asked.insert(next, (now, tries + 1));
            out.push(Action::RequestManifest { step: next, from });
        }
    }

    /// When the next timer-driven action could become due, after `now`. A
    /// fall-back leader past its slot waits either for every earlier leader
    /// to fall silent or for the `silent` limit, so both are candidates;
    /// returning a deadline already passed would make a caller spin.
    pub fn next_deadline(&self, now: Duration) -> Option<Duration> {
        let next = self.next_apply?;
        let mut best: Option<Duration> = None;
        let mut take = |d: Duration| {
            if d > now {
                best = Some(best.map_or(d, |b| b.min(d)));
            }
        };
        for (&step, s) in self.steps.range(next..) {
            if s.manifest.is_some() {
                continue;
            }
            let Some(o) = s.opened else { continue };
            let Some(a) = self.my_attempt(step) else {
                continue;
            };
            let at = self.publish_at(a, o);
            take(at);
            if a > 0 {
                take(at + self.silent_limit());
                let r = self.rotation(step);
                let all_gone = (0..a as u32)
                    .map(|b| {
                        let l = (r + b) % self.n;
                        self.last_seen
                            .get(&l)
                            .map_or(Duration::ZERO, |t| *t + self.timing.alive)
                    })
                    .max();
                if let Some(g) = all_gone {
                    take(g.max(at));
                }
            }
        }
        best
    }

    fn prune(&mut self) {
        let Some(next) = self.next_apply else {
            return;
        };
        let floor = next.saturating_sub(KEEP);
        // Called on every poll; the retains below cost the pending set's
        // size, so they run only when the floor moves.
        if self.pruned_to == Some(floor) {
            return;
        }
        self.pruned_to = Some(floor);
        let old: Vec<u32> = self.steps.range(..floor).map(|(s, _)| *s).collect();
        for s in old {
            if let Some(st) = self.steps.remove(&s) {
                for h in st.announced.values() {
                    self.held.remove(h);
                    self.pending.remove(h);
                }
            }
        }
        self.state_hashes.retain(|s, _| *s >= floor);
        self.manifest_asked.retain(|s, _| *s >= floor);
        self.pending.retain(|_, p| p.step >= floor);
    }

    /// Whether `hash` is a payload this node is fetching.
    pub fn wants(&self, hash: &[u8; 32]) -> bool {
        self.pending.contains_key(hash)
    }

    /// Whether `hash` is a payload of a step still kept.
    pub fn holds(&self, hash: &[u8; 32]) -> bool {
        self.held.contains_key(hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn machines(n: u32) -> Vec<StepMachine> {
        (0..n)
            .map(|i| StepMachine::new([1; 32], 0, [2; 32], n, i, Timing::default(), Some(0)))
            .collect()
    }

    fn announce(step: u32, member: u32) -> Announce {
        Announce {
            job: [1; 32],
            epoch: 0,
            step,
            member,
            payload_hash: [(step * 16 + member) as u8; 32],
            momentum_hash: [0; 32],
            basis: [step.saturating_sub(1) as u8; 32],
            len: 10,
            produced_us: 0,
            chain_step: 0,
            chain: [0; 32],
        }
    }

    /// Delivers announcements and payloads instantly; returns the
    /// manifests each node applied.
    fn run_step(ms: &mut [StepMachine], step: u32, alive: &[u32], now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        for m in ms.iter_mut() {
            m.on_applied(step, [step as u8; 32], [step.saturating_sub(1) as u8; 32]);
        }
        for &i in alive {
            let a = announce(step, i);
            for (j, m) in ms.iter_mut().enumerate() {
                if alive.contains(&(j as u32)) {
                    if j as u32 == i {
                        m.on_local(now, &a);
                    } else {
                        m.on_announce(now, &a);
                        m.on_payload(now, a.payload_hash);
                    }
                }
            }
        }
        let mut published = Vec::new();
        for &i in alive {
            for a in ms[i as usize].poll(now) {
                if let Action::Publish(m) = &a {
                    published.push(m.clone());
                }
                out.push(a);
            }
        }
        for m in published {
            for &i in alive {
                ms[i as usize].on_manifest(now, m.clone());
                out.extend(ms[i as usize].poll(now));
            }
        }
        out
    }

    #[test]
    fn leader_publishes_once_everyone_is_in_and_all_apply_the_same() {
        let mut ms = machines(4);
        let acts = run_step(&mut ms, 0, &[0, 1, 2, 3], Duration::ZERO);
        let applied: Vec<&Manifest> = acts
            .iter()
            .filter_map(|a| match a {
                Action::Apply { manifest, .. } => Some(manifest),
                _ => None,
            })
            .collect();
        assert_eq!(applied.len(), 4);
        assert!(applied.iter().all(|m| **m == *applied[0]));
        assert_eq!(applied[0].entries.len(), 4);
        assert_eq!(applied[0].leader, ms[0].leader(0, 0));
    }

    #[test]
    fn a_leader_lists_no_contribution_computed_on_another_state_nor_one_announced_twice() {
        let mut ms = machines(3);
        run_step(&mut ms, 0, &[0, 1, 2], Duration::ZERO);
        // Step 1's contributions are computed on the state before step 0
        // ([0; 32] here). Member 2 announces one computed on another
        // state: an abandoned history's, or a lie to escape its audit.
        let now = Duration::from_secs(1);
        for m in ms.iter_mut() {
            m.on_applied(1, [1; 32], [0; 32]);
        }
        let mut other = announce(1, 2);
        other.basis = [9; 32];
        for (i, m) in ms.iter_mut().enumerate() {
            for a in [announce(1, 0), announce(1, 1), other.clone()] {
                if a.member == i as u32 {
                    m.on_local(now, &a);
                } else {
                    m.on_announce(now, &a);
                    m.on_payload(now, a.payload_hash);
                }
            }
        }
        assert_eq!(ms[0].basis_of(1), Some([0; 32]));
        assert_eq!(
            ms[0].basis_of(0),
            Some([0; 32]),
            "a run's first step's: its starting state, as the next step's"
        );
        let c = ms[0].committed(1, 2, &other.payload_hash).unwrap();
        assert_eq!((c.basis, c.momentum), ([9; 32], [0; 32]));
        assert_eq!(ms[0].committed(1, 2, &[0; 32]), None, "another payload");
        // The same payload announced again under another state is a second
        // announcement: equivocation, and its author is listed nowhere.
        let mut again = announce(1, 1);
        again.basis = [7; 32];
        for m in ms.iter_mut() {
            assert_eq!(m.on_announce(now, &again), Verdict::Equivocation);
            assert_eq!(m.committed(1, 1, &again.payload_hash), None);
        }
        let late = now + Timing::default().collect * 4;
        let leader = ms[0].leader(1, 0) as usize;
        let published = publications(ms[leader].poll(late));
        assert_eq!(published.len(), 1, "{published:?}");
        let listed: Vec<u32> = published[0].entries.iter().map(|e| e.0).collect();
        assert_eq!(listed, vec![0], "2 on another state, 1 announced twice");
    }

    #[test]
    fn a_slashed_member_is_left_out_of_manifests_and_not_waited_for() {
        let mut ms = machines(4);
        run_step(&mut ms, 0, &[0, 1, 2, 3], Duration::ZERO);
        for m in ms.iter_mut() {
            m.slash(2);
        }
        // Step 1: member 2 still announces (it keeps running), but every
        // honest leader leaves it out at once, without waiting for anyone.
        let acts = run_step(&mut ms, 1, &[0, 1, 2, 3], Duration::from_secs(1));
        let manifests: Vec<&Manifest> = acts
            .iter()
            .filter_map(|a| match a {
                Action::Publish(m) => Some(m),
                _ => None,
            })
            .collect();
        if ms[0].leader(1, 0) != 2 {
            assert_eq!(manifests.len(), 1, "published at once");
            let members: Vec<u32> = manifests[0].entries.iter().map(|e| e.0).collect();
            assert_eq!(members, vec![0, 1, 3]);
        }
        assert_eq!(
            ms[0].on_announce(Duration::from_secs(2), &announce(2, 2)),
            Verdict::Stale,
            "its announcements are refused"
        );
        assert!(ms[0].is_slashed(2) && !ms[0].is_slashed(1));
    }

    #[test]
    fn a_dead_member_is_waited_for_once_then_dropped() {
        let mut ms = machines(4);
        run_step(&mut ms, 0, &[0, 1, 2, 3], Duration::ZERO);
        // Member 3 dies. The step-1 leader (if alive) waits for `collect`.
        let alive: Vec<u32> = vec![0, 1, 2];
        let leader = ms[0].leader(1, 0);
        let acts = run_step(&mut ms, 1, &alive, Duration::from_secs(10));
        let published = acts.iter().any(|a| matches!(a, Action::Publish(_)));
        assert!(!published, "published before the collect timeout");
        let late = Duration::from_secs(10) + Timing::default().collect;
        let wait = if leader == 3 {
            late + Timing::default().fallback
        } else {
            late
        };
        let mut manifests = Vec::new();
        for &i in &alive {
            for a in ms[i as usize].poll(wait) {
                if let Action::Publish(m) = a {
                    manifests.push(m);
                }
            }
        }
        assert_eq!(manifests.len(), 1);
        assert_eq!(
            manifests[0].entries.iter().map(|e| e.0).collect::<Vec<_>>(),
            alive
        );
        for &i in &alive {
            ms[i as usize].on_manifest(wait, manifests[0].clone());
            ms[i as usize].poll(wait);
        }
        // Step 2: 3 is no longer expected, so no waiting at all.
        let t = wait + MS;
        let acts = run_step(&mut ms, 2, &alive, t);
        assert!(acts.iter().any(|a| matches!(a, Action::Publish(_))) || ms[0].leader(2, 0) == 3);
    }

    #[test]
    fn a_leader_whose_steps_take_long_waits_a_share_of_its_compute_time_for_stragglers() {
        let mut ms = machines(4);
        run_step(&mut ms, 0, &[0, 1, 2, 3], Duration::ZERO);
        let t = Timing::default();
        let compute = Duration::from_secs(40);
        for m in ms.iter_mut() {
            m.on_compute(compute);
        }
        let window = compute.mul_f64(t.collect_share);
        assert!(
            window > t.collect * 2,
            "the test needs a window the pace sets"
        );
        assert_eq!(ms[0].collect_window(), window);
        // Step 1 opens; one member is slower than the rest by a share of
        // the step, as a slower GPU is.
        let open = Duration::from_secs(50);
        let leader = ms[0].leader(1, 0);
        let slow = (leader + 1) % 4;
        let early: Vec<u32> = (0..4).filter(|&i| i != slow).collect();
        let acts = run_step(&mut ms, 1, &early, open);
        assert!(
            !acts.iter().any(|a| matches!(a, Action::Publish(_))),
            "published before the straggler could arrive"
        );
        let l = &mut ms[leader as usize];
        assert!(
            !l.poll(open + t.collect + MS)
                .iter()
                .any(|a| matches!(a, Action::Publish(_))),
            "a fixed window would have published here, without the straggler"
        );
        let straggler = open + window - Duration::from_secs(1);
        l.on_announce(straggler, &announce(1, slow));
        l.on_payload(straggler, announce(1, slow).payload_hash);
        let published = publications(l.poll(straggler));
        assert_eq!(published.len(), 1, "published once everyone was in");
        let listed: Vec<u32> = published[0].entries.iter().map(|e| e.0).collect();
        assert_eq!(listed, vec![0, 1, 2, 3]);
    }

    #[test]
    fn the_collect_window_follows_the_smoothed_pace_and_never_drops_below_collect() {
        let t = Timing::default();
        let mut m = StepMachine::new([1; 32], 0, [2; 32], 4, 0, t, Some(0));
        assert_eq!(m.collect_window(), t.collect, "no pace yet");
        m.on_compute(Duration::from_millis(20));
        assert_eq!(m.collect_window(), t.collect, "fast steps keep the floor");
        m.on_compute(Duration::from_secs(20));
        let smoothed = (Duration::from_millis(20) * 3 + Duration::from_secs(20)) / 4;
        assert_eq!(
            m.collect_window(),
            smoothed.mul_f64(t.collect_share).max(t.collect)
        );
        for _ in 0..40 {
            m.on_compute(Duration::from_secs(20));
        }
        let w = m.collect_window().as_secs_f64();
        assert!((w - 20.0 * t.collect_share).abs() < 0.01, "{w}");
    }

    #[test]
    fn a_fall_back_leader_waiting_on_a_live_leader_is_never_due_in_the_past() {
        let mut ms = machines(4);
        run_step(&mut ms, 0, &[0, 1, 2, 3], Duration::ZERO);
        let t = Timing::default();
        let leader = ms[0].leader(1, 0);
        let backup = ms[0].leader(1, 1) as usize;
        // Step 1 opens with one member missing, so nobody publishes early.
        let open = Duration::from_secs(10);
        ms[backup].on_applied(1, [1; 32], [0; 32]);
        ms[backup].on_announce(open, &announce(1, (backup as u32 + 2) % 4));
        // Past the back-up's slot, the leader is still heard from.
        let mut now = open + t.collect + t.fallback + MS;
        ms[backup].on_alive(now, leader);
        assert!(
            !ms[backup]
                .poll(now)
                .iter()
                .any(|a| matches!(a, Action::Publish(_))),
            "replaced a live leader"
        );
        // Following deadlines moves time forward every time, and ends in
        // the back-up publishing once the leader has been silent long enough.
        let mut published = false;
        for _ in 0..16 {
            let d = ms[backup]
                .next_deadline(now)
                .expect("a deadline while the step is open");
            assert!(d > now, "deadline {d:?} not after {now:?}");
            now = d;
            if ms[backup]
                .poll(now)
                .iter()
                .any(|a| matches!(a, Action::Publish(_)))
            {
                published = true;
                break;
            }
        }
        assert!(published, "the back-up never stepped in");
        assert!(now >= open + t.collect + t.fallback + t.alive);
    }

    #[test]
    fn equivocation_is_recorded_and_every_node_keeps_the_same_manifest() {
        let mut ms = machines(3);
        let leader = ms[0].leader(5, 0);
        let good = Manifest {
            job: [1; 32],
            epoch: 0,
            step: 5,
            attempt: 0,
            leader,
            state_hash: [0; 32],
            parent: [0; 32],
            entries: vec![(0, [1; 32])],
        };
        let mut evil = good.clone();
        evil.entries = vec![(1, [2; 32])];
        let kept = if good.id() < evil.id() { &good } else { &evil };
        // Two receivers, the two manifests in opposite orders.
        let others: Vec<usize> = (0..3).filter(|&i| i != leader as usize).collect();
        for (i, order) in others.iter().zip([[&good, &evil], [&evil, &good]]) {
            let m = &mut ms[*i];
            assert_eq!(m.on_manifest(MS, order[0].clone()), Verdict::Accepted);
            assert_eq!(m.on_manifest(MS, order[0].clone()), Verdict::Duplicate);
            assert_eq!(m.on_manifest(MS, order[1].clone()), Verdict::Equivocation);
            assert_eq!(m.on_manifest(MS, order[1].clone()), Verdict::Duplicate);
            assert_eq!(m.manifest(5), Some(kept));
            assert_eq!(
                m.evidence,
                vec![Equivocation {
                    first: order[0].clone(),
                    second: order[1].clone(),
                }]
            );
        }
    }

    #[test]
    fn a_manifest_leaving_out_a_payload_held_for_a_while_is_noted_as_an_omission() {
        let mut ms = machines(3);
        let leader = ms[0].leader(0, 0);
        let me = (0..3).find(|i| *i != leader).unwrap();
        let other = (0..3).find(|i| *i != leader && *i != me).unwrap();
        let m = &mut ms[me as usize];
        let (mine, theirs) = (announce(0, me), announce(0, other));
        m.on_local(MS, &mine);
        m.on_announce(MS, &theirs);
        m.on_payload(MS, theirs.payload_hash);
        let grace = Timing::default().collect / 2;
        let manifest = |entries: Vec<(u32, [u8; 32])>, attempt: u8| Manifest {
            job: [1; 32],
            epoch: 0,
            step: 0,
            attempt,
            leader,
            state_hash: [0; 32],
            parent: [0; 32],
            entries,
        };
        // Late in the step and soon after this node got it: the leader may
        // not have had it yet.
        let late = MS + grace * 3;
        m.held.insert(theirs.payload_hash, late - grace / 2);
        m.on_manifest(late, manifest(vec![(me, mine.payload_hash)], 0));
        assert!(m.omissions.is_empty(), "{:?}", m.omissions);
        // Held for longer than the grace, and left out again (an
        // equivocating second manifest): noted, naming leader and member.
        m.held.insert(theirs.payload_hash, MS);
        m.on_manifest(late, manifest(vec![(leader, [7; 32])], 0));
        assert_eq!(
            m.omissions,
            [me.min(other), me.max(other)]
                .into_iter()
                .map(|member| Omission {
                    step: 0,
                    leader,
                    member
                })
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_early_manifest_leaving_out_an_expected_member_is_noted_at_once() {
        let mut ms = machines(3);
        let leader = ms[0].leader(1, 0);
        let me = (0..3).find(|i| *i != leader).unwrap();
        let other = (0..3).find(|i| *i != leader && *i != me).unwrap();
        let m = &mut ms[me as usize];
        // Everyone contributed to step 0, so everyone is expected at 1.
        for i in 0..3 {
            m.on_announce(MS, &announce(0, i));
        }
        let theirs = announce(1, other);
        m.on_announce(MS, &theirs);
        let early = Manifest {
            job: [1; 32],
            epoch: 0,
            step: 1,
            attempt: 0,
            leader,
            state_hash: [0; 32],
            parent: [0; 32],
            entries: vec![(leader, [5; 32])],
        };
        m.on_manifest(MS + Duration::from_millis(100), early);
        assert_eq!(
            m.omissions,
            vec![Omission {
                step: 1,
                leader,
                member: other
            }]
        );
    }

    #[test]
    fn request_deadlines_grow_with_the_bytes_expected() {
        let t = Timing::default();
        assert_eq!(t.deadline(0), Duration::from_secs(5));
        assert_eq!(t.deadline(256 * 1024), Duration::from_secs(6));
        // A 1 GiB snapshot is fetched in chunks, each with its own deadline.
        assert_eq!(t.deadline(4 << 20), Duration::from_secs(21));
    }

    #[test]
    fn a_replayed_or_stale_announcement_does_not_keep_a_dead_member_alive() {
        let mut ms = machines(3);
        let m = &mut ms[0];
        let alive = Timing::default().alive;
        let a = announce(0, 1);
        assert_eq!(m.on_announce(MS, &a), Verdict::Accepted);
        assert!(m.heard_within(MS, 1, alive));
        let later = MS + alive * 2;
        assert_eq!(m.on_announce(later, &a), Verdict::Duplicate);
        assert!(
            !m.heard_within(later, 1, alive),
            "a replay counted as a sign of life"
        );
        // A fresh one does.
        assert_eq!(m.on_announce(later, &announce(1, 1)), Verdict::Accepted);
        assert!(m.heard_within(later, 1, alive));
    }

    #[test]
    fn another_epoch_s_announcement_is_taken_by_no_one_not_even_a_node_still_syncing() {
        // A member's genuine announcement from epoch 0, replayed into epoch
        // 1 at a step number the new epoch also reaches: to a node that
        // has not caught up yet (no step applied), it looked like the
        // member's announcement for that step, a sign of life, and a
        // second one from the member would then read as equivocation.
        let t = Timing::default();
        let mut syncing = StepMachine::new([1; 32], 1, [2; 32], 3, 0, t, None);
        let mut caught_up = StepMachine::new([1; 32], 1, [2; 32], 3, 0, t, Some(0));
        let old = announce(1, 2);
        for m in [&mut syncing, &mut caught_up] {
            assert_eq!(m.on_announce(MS, &old), Verdict::TooFar);
            assert!(
                !m.heard_within(MS, 2, t.alive),
                "an old epoch's message is no sign of life"
            );
            let fresh = Announce {
                epoch: 1,
                ..announce(1, 2)
            };
            assert_eq!(m.on_announce(MS, &fresh), Verdict::Accepted);
        }
    }

    #[test]
    fn two_manifests_on_one_history_prove_fraud_but_a_rewound_leader_s_do_not() {
        let m = Manifest {
            job: [1; 32],
            epoch: 0,
            step: 5,
            attempt: 0,
            leader: 1,
            state_hash: [0; 32],
            parent: [0; 32],
            entries: vec![(0, [1; 32])],
        };
        let mut other = m.clone();
        other.entries.push((2, [2; 32]));
        assert!(
            Equivocation {
                first: m.clone(),
                second: other.clone()
            }
            .proves_fraud()
        );
        // After a rewind the leader's state and parent are new.
        other.parent = [9; 32];
        other.state_hash = [8; 32];
        assert!(
            !Equivocation {
                first: m.clone(),
                second: other
            }
            .proves_fraud()
        );
        assert!(
            !Equivocation {
                first: m.clone(),
                second: m
            }
            .proves_fraud()
        );
    }

    #[test]
    fn a_manifest_listing_a_made_up_root_does_not_make_the_member_s_real_announcement_a_second_one()
    {
        // A leader publishes as the step opens, listing member `victim`
        // under a root it never announced; the real announcement comes
        // after. Taken as a second announcement, it marked an honest
        // member an equivocator every fall-back leader leaves out.
        let mut ms = machines(3);
        let leader = ms[0].leader(0, 0);
        let victim = (leader + 1) % 3;
        let node = &mut ms[((leader + 2) % 3) as usize];
        node.on_applied(0, [0; 32], [0; 32]);
        let forged = Manifest {
            job: [1; 32],
            epoch: 0,
            step: 0,
            attempt: 0,
            leader,
            state_hash: [0; 32],
            parent: [0; 32],
            entries: vec![(victim, [0xf0; 32])],
        };
        assert_eq!(node.on_manifest(MS, forged), Verdict::Accepted);
        let real = announce(0, victim);
        assert_eq!(node.on_announce(MS, &real), Verdict::Accepted);
        assert!(node.committed(0, victim, &real.payload_hash).is_some());
        // Nor is the listing judged a forgery here: the member may as well
        // have shown the leader another announcement than this node.
        assert!(!node.leader_forged(0, victim, &[0xf0; 32]));
        // A second announcement of its own is still one.
        let mut again = real.clone();
        again.payload_hash = [0xf1; 32];
        assert_eq!(node.on_announce(MS, &again), Verdict::Equivocation);
    }

    #[test]
    fn one_payload_under_two_commitments_is_ambiguous_and_two_payloads_are_not() {
        let mut ms = machines(3);
        let m = &mut ms[0];
        let a = announce(2, 1);
        m.on_announce(MS, &a);
        let mut other_payload = a.clone();
        other_payload.payload_hash = [0xcd; 32];
        assert_eq!(m.on_announce(MS, &other_payload), Verdict::Equivocation);
        assert!(!m.ambiguous(2, 1, &a.payload_hash));
        assert!(!m.ambiguous(2, 1, &other_payload.payload_hash));
        let b = announce(2, 2);
        m.on_announce(MS, &b);
        let mut other_state = b.clone();
        other_state.basis = [0xee; 32];
        assert_eq!(m.on_announce(MS, &other_state), Verdict::Equivocation);
        assert!(m.ambiguous(2, 2, &b.payload_hash));
        assert_eq!(m.committed(2, 2, &b.payload_hash), None);
        // A member that announced another payload first still cannot keep
        // one payload under two commitments from a node: the second one
        // is forwarded as proof.
        let c = announce(3, 1);
        let mut decoy = c.clone();
        decoy.payload_hash = [0xab; 32];
        m.on_announce(MS, &decoy);
        assert_eq!(m.on_announce(MS, &c), Verdict::Equivocation);
        assert!(!m.ambiguous(3, 1, &c.payload_hash));
        let mut c_elsewhere = c.clone();
        c_elsewhere.basis = [0xee; 32];
        assert_eq!(m.on_announce(MS, &c_elsewhere), Verdict::Equivocation);
        assert!(m.ambiguous(3, 1, &c.payload_hash));
        assert_eq!(m.on_announce(MS, &c_elsewhere), Verdict::Equivocated);
    }

    #[test]
    fn a_leader_forged_an_entry_only_when_the_member_announced_another_hash_and_nothing_else() {
        let mut ms = machines(3);
        let m = &mut ms[0];
        let a = announce(2, 1);
        assert_eq!(m.on_announce(MS, &a), Verdict::Accepted);
        assert!(m.leader_forged(2, 1, &[0xab; 32]));
        assert!(!m.leader_forged(2, 1, &a.payload_hash), "its own bytes");
        assert!(!m.leader_forged(2, 2, &[0xab; 32]), "never heard from");
        // A member that announced two hashes may have sent either anywhere.
        let mut twice = a.clone();
        twice.payload_hash = [0xcd; 32];
        assert_eq!(m.on_announce(MS, &twice), Verdict::Equivocation);
        assert!(!m.leader_forged(2, 1, &[0xab; 32]));
    }

    #[test]
    fn a_member_that_shows_each_half_of_the_job_another_announcement_cannot_frame_the_leader() {
        // Member 1 announces root `a` to the step's leader alone and root
        // `b` to everyone else; the leader, holding `a` only, lists it.
        let mut ms = machines(3);
        let a = announce(2, 1);
        let mut b = a.clone();
        b.payload_hash = [0xcd; 32];
        let witness = &mut ms[2];
        assert_eq!(witness.on_announce(MS, &b), Verdict::Accepted);
        // The exploit: a witness holding `b` alone judges the leader's
        // listing of `a` a forgery (and every such witness accuses it).
        assert!(witness.leader_forged(2, 1, &a.payload_hash));
        // The leader forwarded `a`; a node that holds `b` now forwards it
        // on as proof (the first announcement that contradicts the one it
        // held: `Equivocation` is accepted by the gossip layer), so it
        // reaches every node, and none judges the listing a forgery.
        assert_eq!(witness.on_announce(MS, &a), Verdict::Equivocation);
        assert!(!witness.leader_forged(2, 1, &a.payload_hash));
        // The listed payload is still audited on what it committed to.
        assert_eq!(
            witness.committed(2, 1, &a.payload_hash).map(|c| c.basis),
            Some(a.basis)
        );
        // Further ones are ignored: a member cannot make every node
        // forward its every variant.
        let mut c = a.clone();
        c.payload_hash = [0xef; 32];
        assert_eq!(witness.on_announce(MS, &c), Verdict::Equivocated);
        assert_eq!(witness.on_announce(MS, &a), Verdict::Equivocated);
        assert_eq!(witness.on_announce(MS, &b), Verdict::Duplicate);
        assert_eq!(witness.committed(2, 1, &c.payload_hash), None, "not kept");
    }

    #[test]
    fn at_an_epoch_s_first_step_a_leader_lists_work_computed_on_the_epoch_s_starting_state() {
        // Epoch 1 starts at step 10: its first two steps' contributions
        // are computed on the state the epoch starts from (the trainer's
        // word; the machine holds no state from before the epoch).
        let now = Duration::from_secs(1);
        let late = now + Timing::default().collect * 4;
        let mut ms = machines(3);
        let leader = ms[0].leader(10, 0);
        let m = &mut ms[leader as usize];
        m.resync(10, [0; 32]);
        m.on_applied(10, [10; 32], [10; 32]);
        assert_eq!(m.basis_of(10), Some([10; 32]));
        assert_eq!(m.basis_of(11), None, "not reached yet");
        let on = |member: u32, basis: u8| Announce {
            basis: [basis; 32],
            ..announce(10, member)
        };
        for a in [on(0, 10), on(1, 10), on(2, 9)] {
            if a.member == leader {
                m.on_local(now, &a);
            } else {
                m.on_announce(now, &a);
                m.on_payload(now, a.payload_hash);
            }
        }
        let published = publications(m.poll(late));
        assert_eq!(published.len(), 1, "{published:?}");
        let listed: Vec<u32> = published[0].entries.iter().map(|e| e.0).collect();
        assert_eq!(
            listed,
            vec![0, 1],
            "2 computed on the state before the epoch's"
        );
    }

    /// The manifests a poll published.
    fn publications(acts: Vec<Action>) -> Vec<Manifest> {
        acts.into_iter()
            .filter_map(|a| match a {
                Action::Publish(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    fn applied(acts: &[Action]) -> Vec<(Manifest, bool)> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Apply {
                    manifest,
                    same_history,
                } => Some((manifest.clone(), *same_history)),
                _ => None,
            })
            .collect()
    }

    /// The split a timeout cannot rule out: the step-0 leader is slow, its
    /// fall-back publishes and applies, then the leader's manifest arrives.
    /// The fall-back rewinds at once; a node that never got the leader's
    /// manifest learns of it from the next step's history id, asks, and
    /// rewinds too. Everyone ends on the same two manifests.
    #[test]
    fn nodes_that_applied_a_fall_back_manifest_rewind_to_the_late_leader_s() {
        let mut ms = machines(3);
        let t = Timing::default();
        let l0 = ms[0].leader(0, 0) as usize;
        let l1 = ms[0].leader(0, 1) as usize;
        let x = 3 - l0 - l1;
        let deliver = |ms: &mut [StepMachine], step: u32, now: Duration| {
            for i in 0..3u32 {
                let a = announce(step, i);
                for (j, m) in ms.iter_mut().enumerate() {
                    m.on_applied(step, [step as u8; 32], [step.saturating_sub(1) as u8; 32]);
                    if j as u32 == i {
                        m.on_local(now, &a);
                    } else {
                        m.on_announce(now, &a);
                        m.on_payload(now, a.payload_hash);
                    }
                }
            }
        };
        deliver(&mut ms, 0, Duration::ZERO);
        // The leader is not polled (slow); past its slot the fall-back,
        // not hearing from it, publishes attempt 1 and applies it, and so
        // does the third node.
        let late = t.collect + t.fallback + MS;
        let acts = ms[l1].poll(late);
        let fallback = acts
            .iter()
            .find_map(|a| match a {
                Action::Publish(m) => Some(m.clone()),
                _ => None,
            })
            .expect("the fall-back published");
        assert_eq!(fallback.attempt, 1);
        assert_eq!(applied(&acts), vec![(fallback.clone(), true)]);
        assert_eq!(ms[x].on_manifest(late, fallback.clone()), Verdict::Accepted);
        assert_eq!(applied(&ms[x].poll(late)), vec![(fallback.clone(), true)]);
        // The leader wakes up and publishes attempt 0; only the fall-back
        // receives it, and rewinds.
        let primary = ms[l0]
            .poll(late)
            .into_iter()
            .find_map(|a| match a {
                Action::Publish(m) => Some(m),
                _ => None,
            })
            .expect("the leader published");
        assert_eq!(primary.attempt, 0);
        assert_eq!(ms[l1].on_manifest(late, primary.clone()), Verdict::Rewind);
        assert_eq!(applied(&ms[l1].poll(late)), vec![(primary.clone(), true)]);
        // Step 1, led by the leader or the fall-back: its history id
        // differs from the third node's, which asks for step 0 and rewinds.
        let now = late + MS;
        deliver(&mut ms, 1, now);
        let (attempt, lead) = (0..3u8)
            .map(|a| (a, ms[0].leader(1, a) as usize))
            .find(|(_, l)| *l != x)
            .unwrap();
        let next = Manifest {
            job: [1; 32],
            epoch: 0,
            step: 1,
            attempt,
            leader: lead as u32,
            state_hash: [1; 32],
            parent: msg::chain(&[0; 32], &primary.id()),
            entries: (0..3).map(|i| (i, announce(1, i).payload_hash)).collect(),
        };
        assert_eq!(ms[x].on_manifest(now, next.clone()), Verdict::Accepted);
        let acts = ms[x].poll(now);
        assert_eq!(applied(&acts), vec![(next.clone(), false)]);
        assert!(acts.contains(&Action::RequestManifest {
            step: 0,
            from: lead as u32
        }));
        assert_eq!(ms[x].on_manifest(now, primary.clone()), Verdict::Rewind);
        assert_eq!(
            applied(&ms[x].poll(now)),
            vec![(primary.clone(), true), (next.clone(), true)]
        );
        // A worse manifest for an applied step changes nothing.
        assert_eq!(ms[x].on_manifest(now, fallback), Verdict::Duplicate);
        assert!(applied(&ms[x].poll(now)).is_empty());
    }

    #[test]
    fn a_manifest_from_the_wrong_leader_is_refused_and_a_lower_attempt_wins() {
        let mut m = machines(4).remove(0);
        let l0 = m.leader(3, 0);
        let l1 = m.leader(3, 1);
        let base = Manifest {
            job: [1; 32],
            epoch: 0,
            step: 3,
            attempt: 1,
            leader: l1,
            state_hash: [0; 32],
            parent: [0; 32],
            entries: vec![],
        };
        let mut wrong = base.clone();
        wrong.leader = (l1 + 1) % 4;
        assert_eq!(m.on_manifest(MS, wrong), Verdict::WrongLeader);
        assert_eq!(m.on_manifest(MS, base.clone()), Verdict::Accepted);
        let mut primary = base.clone();
        primary.attempt = 0;
        primary.leader = l0;
        assert_eq!(m.on_manifest(MS, primary.clone()), Verdict::Accepted);
        assert_eq!(m.manifest(3), Some(&primary));
        assert_eq!(m.on_manifest(MS, base), Verdict::Duplicate);
    }

    #[test]
    fn announcements_and_manifests_beyond_the_window_create_no_state_or_fetches() {
        let mut m = machines(4).remove(0).with_end(100);
        m.on_applied(0, [0; 32], [0; 32]);
        let near = announce(STEP_WINDOW - 1, 2);
        assert_eq!(m.on_announce(MS, &near), Verdict::Accepted);
        for step in [STEP_WINDOW, 50, 99, 100, 1_000_000] {
            assert_eq!(
                m.on_announce(MS, &announce(step, 2)),
                Verdict::TooFar,
                "step {step}"
            );
            let leader = m.leader(step, 0);
            let far = Manifest {
                job: [1; 32],
                epoch: 0,
                step,
                attempt: 0,
                leader,
                state_hash: [0; 32],
                parent: [0; 32],
                entries: vec![(2, [9; 32])],
            };
            assert_eq!(m.on_manifest(MS, far), Verdict::TooFar, "step {step}");
        }
        // Only the in-window announcement is fetched or remembered.
        let fetches: Vec<Action> = m
            .poll(MS)
            .into_iter()
            .filter(|a| matches!(a, Action::Fetch { .. }))
            .collect();
        assert_eq!(
            fetches,
            vec![Action::Fetch {
                hash: near.payload_hash,
                from: 2
            }]
        );
        assert_eq!(m.steps.len(), 1);
    }

    #[test]
    fn a_node_still_syncing_tracks_a_bounded_number_of_steps() {
        let mut m = StepMachine::new([1; 32], 0, [2; 32], 4, 0, Timing::default(), None);
        let accepted = (0..1_000)
            .filter(|s| m.on_announce(MS, &announce(*s, 1)) == Verdict::Accepted)
            .count();
        assert_eq!(accepted, 2 * STEP_WINDOW as usize);
        assert!(m.steps.len() <= 2 * STEP_WINDOW as usize);
    }

    /// Step 0's manifest at `attempt`, listing only its leader's payload.
    fn lone(attempt: u8, leader: u32, hash: u8) -> Manifest {
        Manifest {
            job: [1; 32],
            epoch: 0,
            step: 0,
            attempt,
            leader,
            state_hash: [0; 32],
            parent: [0; 32],
            entries: vec![(leader, [hash; 32])],
        }
    }

    #[test]
    fn a_manifest_listing_a_payload_nobody_can_serve_is_replaced_by_a_fall_back() {
        let mut m = machines(3).remove(0);
        m.on_applied(0, [0; 32], [0; 32]);
        let (l0, l1) = (m.leader(0, 0), m.leader(0, 1));
        let stuck = lone(0, l0, 0xEE);
        assert_eq!(m.on_manifest(MS, stuck.clone()), Verdict::Accepted);
        // Author, leader and the third member each fail to serve it.
        for _ in 0..3 {
            assert_eq!(m.manifest(0), Some(&stuck));
            m.on_fetch_failed([0xEE; 32]);
        }
        assert_eq!(
            m.manifest(0),
            None,
            "an unservable manifest still holds the step"
        );
        // Nothing outranks attempt 0, yet the fall-back takes the step and
        // the stuck manifest, sent again, changes nothing.
        let fallback = lone(1, l1, 0x11);
        assert_eq!(m.on_manifest(MS, fallback.clone()), Verdict::Accepted);
        assert_eq!(m.on_manifest(MS, stuck), Verdict::Stale);
        assert_eq!(m.manifest(0), Some(&fallback));
    }

    /// Step 0 applied everywhere from its leader's manifest listing all
    /// four members; returns it, and a member that leads neither attempt 0
    /// nor attempt 1.
    fn applied_everywhere(ms: &mut [StepMachine]) -> (Manifest, u32) {
        let acts = run_step(ms, 0, &[0, 1, 2, 3], Duration::ZERO);
        let first = applied(&acts)[0].0.clone();
        assert_eq!(first.entries.len(), 4);
        let (l0, l1) = (ms[0].leader(0, 0), ms[0].leader(0, 1));
        let x = (0..4).find(|&i| i != l0 && i != l1).unwrap();
        (first, x)
    }

    #[test]
    fn a_manifest_listing_a_withheld_contribution_gives_way_to_a_fall_back_without_it() {
        let mut ms = machines(4);
        let t = Timing::default();
        let (first, x) = applied_everywhere(&mut ms);
        let (l0, l1) = (first.leader as usize, ms[0].leader(0, 1) as usize);
        // The sharded exchange finds x's slices served by nobody: every
        // other node goes back before step 0 and drops the manifest.
        for i in (0..4).filter(|&i| i != x as usize) {
            assert_eq!(ms[i].on_withheld(0, x), Some(0));
            assert_eq!(ms[i].manifest(0), None);
            assert_eq!(ms[i].on_withheld(0, x), None, "once is enough");
        }
        // Not `silent` past its slot: the leader is live, but its manifest
        // is given up, so there is nothing to wait for.
        let late = t.collect + t.fallback + MS;
        // The leader does not sign a second manifest for its attempt (that
        // would be equivocation); the fall-back leader signs one without x.
        assert!(
            !ms[l0]
                .poll(late)
                .iter()
                .any(|a| matches!(a, Action::Publish(_)))
        );
        ms[l1].on_alive(late, l0 as u32);
        let fallback = ms[l1]
            .poll(late)
            .into_iter()
            .find_map(|a| match a {
                Action::Publish(m) => Some(m),
                _ => None,
            })
            .expect("the fall-back published");
        assert_eq!(fallback.attempt, 1);
        assert!(fallback.entries.iter().all(|e| e.0 != x));
        assert_eq!(fallback.entries.len(), 3);
        for i in (0..4).filter(|&i| i != x as usize && i != l1) {
            assert_eq!(ms[i].on_manifest(late, fallback.clone()), Verdict::Accepted);
            assert_eq!(applied(&ms[i].poll(late)), vec![(fallback.clone(), true)]);
            // The first manifest, or another listing x, is not taken again.
            assert_eq!(ms[i].on_manifest(late, first.clone()), Verdict::Stale);
            assert_eq!(ms[i].manifest(0), Some(&fallback));
        }
        let l2 = ms[0].leader(0, 2);
        let with_x = Manifest {
            attempt: 2,
            leader: l2,
            ..first.clone()
        };
        assert_eq!(ms[l0].on_manifest(late, with_x), Verdict::Superseded);
        assert_eq!(ms[l0].manifest(0), Some(&fallback));
    }

    #[test]
    fn a_withheld_contribution_that_turns_up_restores_the_manifest_it_disqualified() {
        let mut ms = machines(4);
        let t = Timing::default();
        let (first, x) = applied_everywhere(&mut ms);
        let me = (0..4).find(|&i| i != x && i != ms[0].leader(0, 1)).unwrap() as usize;
        assert_eq!(ms[me].on_withheld(0, x), Some(0));
        let late = t.collect + t.fallback + t.silent + MS;
        let fallback = Manifest {
            attempt: 1,
            leader: ms[0].leader(0, 1),
            entries: first.entries.iter().filter(|e| e.0 != x).copied().collect(),
            ..first.clone()
        };
        assert_eq!(
            ms[me].on_manifest(late, fallback.clone()),
            Verdict::Accepted
        );
        assert_eq!(applied(&ms[me].poll(late)), vec![(fallback, true)]);
        // A seat got x's slice after all (another node handed it over).
        assert_eq!(ms[me].on_served(late, 0, x), Some(0));
        assert_eq!(applied(&ms[me].poll(late)), vec![(first, true)]);
    }

    #[test]
    fn a_manifest_given_up_as_unservable_takes_its_step_back_once_its_payload_arrives() {
        let mut m = machines(3).remove(0);
        m.on_applied(0, [0; 32], [0; 32]);
        let (l0, l1) = (m.leader(0, 0), m.leader(0, 1));
        // Every member timed out serving the leader's payload (a loaded
        // link, not a missing payload), so the fall-back's was applied.
        let slow = lone(0, l0, 0xEE);
        m.on_manifest(MS, slow.clone());
        for _ in 0..3 {
            m.on_fetch_failed([0xEE; 32]);
        }
        let fallback = lone(1, l1, 0x11);
        m.on_manifest(MS, fallback.clone());
        assert_eq!(m.on_payload(MS, [0x11; 32]), None);
        let slow_fetched = |acts: &[Action]| {
            acts.iter()
                .any(|a| matches!(a, Action::Fetch { hash, .. } if *hash == [0xEE; 32]))
        };
        let acts = m.poll(MS);
        assert_eq!(applied(&acts), vec![(fallback, true)]);
        // Its payload is still asked for after each failure, and it comes
        // after all: the better manifest takes the step back, as on every
        // node that got it.
        assert!(
            slow_fetched(&acts),
            "the slow payload is no longer asked for"
        );
        m.on_fetch_failed([0xEE; 32]);
        assert!(slow_fetched(&m.poll(Duration::from_secs(1))));
        let t = Duration::from_secs(2);
        assert_eq!(m.on_payload(t, [0xEE; 32]), Some(0));
        assert_eq!(m.manifest(0), Some(&slow));
        assert_eq!(applied(&m.poll(t)), vec![(slow, true)]);
    }

    #[test]
    fn a_peer_whose_heartbeat_shows_another_history_is_asked_for_its_manifests() {
        let mut ms = machines(3);
        for step in 0..3 {
            run_step(&mut ms, step, &[0, 1, 2], Duration::from_secs(step as u64));
        }
        let (step, chain) = ms[1].history().expect("node 1 applied three steps");
        assert_eq!(step, 3);
        assert!(ms[0].agrees(step, &chain));
        let asks = |m: &mut StepMachine, now: Duration| -> Vec<u32> {
            m.poll(now)
                .into_iter()
                .filter_map(|a| match a {
                    Action::RequestManifest { step, from: 1 } => Some(step),
                    _ => None,
                })
                .collect()
        };
        let t = Duration::from_secs(10);
        ms[0].on_peer_history(t, 1, step, chain);
        assert_eq!(asks(&mut ms[0], t), Vec::<u32>::new(), "same history");
        // Another history at a step this node applied: a fork neither may
        // learn of from a later manifest (at the epoch's end there is none).
        ms[0].on_peer_history(t, 1, step, [9; 32]);
        assert_eq!(asks(&mut ms[0], t), vec![0, 1, 2]);
        assert!(!ms[0].agrees(step, &[9; 32]));
        // Not again on every heartbeat, but again later.
        ms[0].on_peer_history(t + MS, 1, step, [9; 32]);
        assert_eq!(asks(&mut ms[0], t + MS), Vec::<u32>::new());
        let later = t + Duration::from_secs(3);
        ms[0].on_peer_history(later, 1, step, [9; 32]);
        assert_eq!(asks(&mut ms[0], later), vec![0, 1, 2]);
        // A step this node has not reached says nothing.
        ms[0].on_peer_history(later * 2, 1, step + 5, [9; 32]);
        assert_eq!(asks(&mut ms[0], later * 2), Vec::<u32>::new());
    }

    #[test]
    fn missing_payloads_are_fetched_from_author_then_leader() {
        let mut m = StepMachine::new([1; 32], 0, [2; 32], 4, 0, Timing::default(), Some(0));
        let a = announce(0, 2);
        m.on_announce(Duration::ZERO, &a);
        let acts = m.poll(Duration::ZERO);
        assert!(acts.contains(&Action::Fetch {
            hash: a.payload_hash,
            from: 2
        }));
        m.on_fetch_failed(a.payload_hash);
        assert!(m.poll(MS).is_empty(), "retried without backing off");
        let acts = m.poll(Timing::default().retry + MS);
        assert!(
            acts.iter()
                .any(|x| matches!(x, Action::Fetch { from, .. } if *from != 2))
        );
        m.on_payload(MS, a.payload_hash);
        assert!(m.holds(&a.payload_hash));
    }

    #[test]
    fn a_payload_is_asked_of_its_author_the_leader_then_each_other_member_once_never_a_slashed_one()
    {
        let mut m = StepMachine::new([1; 32], 0, [2; 32], 5, 0, Timing::default(), Some(0));
        // Before: author 2, leader 2, then 2 + 2 = 4, 2 + 3 = 0 → 1: the
        // same slow member asked three times of four.
        assert_eq!(m.holders(2, Some(3)), vec![2, 3, 4, 1]);
        assert_eq!(m.holders(2, Some(2)), vec![2, 3, 4, 1]);
        m.slash(3);
        assert_eq!(m.holders(2, Some(3)), vec![2, 4, 1]);
        m.slash(2);
        assert_eq!(m.holders(2, None), vec![4, 1], "a slashed author too");
        // The fetches follow that order, one holder per try.
        let mut m = StepMachine::new([1; 32], 0, [2; 32], 4, 0, Timing::default(), Some(0));
        let a = announce(0, 1);
        m.on_announce(Duration::ZERO, &a);
        let mut asked = Vec::new();
        let mut now = Duration::ZERO;
        for _ in 0..4 {
            for act in m.poll(now) {
                if let Action::Fetch { from, .. } = act {
                    asked.push(from);
                }
            }
            m.on_fetch_failed(a.payload_hash);
            now += Timing::default().retry + MS;
        }
        assert_eq!(asked, vec![1, 2, 3, 1]);
    }

    #[test]
    fn a_node_most_members_left_on_another_history_downloads_their_state_and_a_lone_dissenter_cannot_move_it()
     {
        let mut ms = machines(4);
        for step in 0..3 {
            run_step(
                &mut ms,
                step,
                &[0, 1, 2, 3],
                Duration::from_secs(step as u64),
            );
        }
        let (step, chain) = ms[1].history().unwrap();
        let other = [9; 32];
        let silent = Timing::default().silent;
        let t = Duration::from_secs(10);
        // One member (a third of the job may be faulty) says so, for long.
        ms[0].on_peer_history(t, 1, step, other);
        ms[0].on_peer_history(t + silent * 3, 1, step, other);
        assert_eq!(ms[0].majority_elsewhere(t + silent * 3), None);
        // Two of four are no majority: a two-two split is left to the
        // manifests' ranks, or both halves would download each other's.
        ms[0].on_peer_history(t, 2, step, other);
        assert_eq!(ms[0].majority_elsewhere(t + silent * 3), None);
        // Three of four, but not for long yet: a rewind settles most forks.
        ms[0].on_peer_history(t + silent, 3, step, other);
        assert_eq!(ms[0].majority_elsewhere(t + silent), None);
        // After `silent`: the latest manifest from one of them names the
        // state to fetch (every step here was led by one of the three or
        // by this node).
        let at = t + silent * 2;
        let (from_step, leader) = ms[0].majority_elsewhere(at).expect("three of four");
        assert_ne!(leader, 0);
        assert_eq!(ms[0].manifest(from_step).unwrap().leader, leader);
        // A heartbeat that agrees takes its member off the count.
        ms[0].on_peer_history(at, 3, step, chain);
        assert_eq!(ms[0].majority_elsewhere(at), None);
        // Far ahead (past what anyone keeps payloads for) counts as apart.
        // (Member 3 first rejoins the others' history, or its report of
        // this node's would set it apart from them.)
        ms[0].on_peer_history(at, 3, step, other);
        for member in [1, 2, 3] {
            ms[0].on_peer_history(at, member, step + KEEP, other);
        }
        assert!(ms[0].majority_elsewhere(at + silent).is_some());
        // Once it has synced, the count starts again.
        ms[0].resync(step, chain);
        assert_eq!(ms[0].majority_elsewhere(at + silent * 4), None);
    }

    #[test]
    fn members_apart_on_histories_of_their_own_are_no_majority_to_download_from() {
        let mut ms = machines(4);
        for step in 0..3 {
            run_step(
                &mut ms,
                step,
                &[0, 1, 2, 3],
                Duration::from_secs(step as u64),
            );
        }
        let (step, _) = ms[1].history().unwrap();
        let silent = Timing::default().silent;
        let t = Duration::from_secs(10);
        for (member, id) in [(1, [7; 32]), (2, [8; 32]), (3, [9; 32])] {
            ms[0].on_peer_history(t, member, step, id);
        }
        // Three members on three histories: each is apart from this node,
        // but no two of them share one.
        let late = t + silent * 2;
        assert_eq!(ms[0].majority_elsewhere(late), None);
        // Two come to share one: still not most of the job.
        ms[0].on_peer_history(late, 2, step, [7; 32]);
        assert_eq!(ms[0].majority_elsewhere(late), None);
        // All three on one history: this node downloads it. (Member 3
        // rewound onto it and passed `step` between two heartbeats: its
        // report from before the rewind stays, but the latest step both
        // reported is what counts.)
        ms[0].on_peer_history(late, 3, step + 1, [6; 32]);
        for member in [1, 2] {
            ms[0].on_peer_history(late, member, step + 1, [6; 32]);
        }
        let (from_step, leader) = ms[0].majority_elsewhere(late).expect("three of four agree");
        assert_eq!(ms[0].manifest(from_step).unwrap().leader, leader);
        assert_ne!(leader, 0);
    }
}
