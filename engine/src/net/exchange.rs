//! The sharded exchange's data plane as a pure state machine (no I/O, no
//! clock of its own): contributions travel through per-shard aggregators,
//! so what a node sends and receives each step does not grow with the
//! member count (issue "Scale", item 2). Step agreement (which members a
//! step applies) stays with [`super::step::StepMachine`]; the arithmetic
//! (shards, seats, sums, the fraud check) is [`crate::shard`]. The libp2p
//! node (`node::sharded`) and the simulator ([`super::sim_sharded`]) both
//! drive this machine.
//!
//! Per step, with the step's seats (`shard::aggregators`, r per shard):
//! 1. A member pushes its slice of each shard to that shard's aggregators
//!    and asks to announce its contribution only once every shard has
//!    reached at least one of them, so a manifest never lists a
//!    contribution that no aggregator holds. The last few pushes, once
//!    the others stopped arriving ([`Stall`]), are sent again until the
//!    manifest is known (a lost request is otherwise learnt only at its
//!    deadline).
//! 2. Once the manifest is known, an aggregator waits `wait` for pushes
//!    still in flight, then fetches each listed slice it lacks (from the
//!    member, then from the shard's other aggregators), sums, and signs
//!    the sum's hash, which the driver sends to every member by request
//!    (message version 9; it was gossiped) and attaches to every sum it
//!    serves, with the other seats' hashes it holds.
//! 3. Every node fetches each shard's sum from one aggregator (the seat
//!    rotates with node and shard, spreading the load) and accepts it when
//!    every aggregator of the shard signed that hash, or when those that
//!    signed agree and the rest are still silent `agree` after the first.
//!    A disagreement makes the node fetch the shard's slices and recompute
//!    the sum exactly: it keeps the true sum and convicts each aggregator
//!    that signed another (the slices and the signed hash are the proof,
//!    `shard::check`). So a liar is caught at once unless every other
//!    seat of its shard is silent or lying with it.
//! 4. Those cases are left to chance the liar cannot see: each node
//!    recomputes a few shards of every step instead of fetching their sums
//!    (`spots`), and a few more whenever one of their seats is still
//!    silent `silent` after the first signed (`backups`), both drawn by a
//!    seed only it knows. With about `c`
//!    checkers per shard a lie escapes a step with probability about
//!    e^-c, and silence costs the seats c recomputations, not one per
//!    node. A check runs beside acceptance: the node takes the seats'
//!    agreed sum meanwhile and goes back if the check proves it false, so
//!    a payload's worth of slices is off the step's path (a spot check
//!    starts only once the sum is taken, after the sums the step waits
//!    for, and mostly after the step's manifest has settled). The proof
//!    convinces every other node (`on_evidence`), which recomputes before
//!    it accepts the shard, and rewinds if it had applied the lie. A shard none of
//!    whose seats signed within `silent` of the manifest is recomputed by
//!    its backups only: a recomputation fetches the slices from the same
//!    seats, so every node doing it would only bury slow seats.
//! 5. When every shard's sum is accepted the step applies.
//!
//! A node asks a thousand small things a step (a sum per shard, a seat's
//! missing slices), so a request unanswered for `hedge` goes to the next
//! source as well ("hedged", the first answer counting) rather than waiting
//! out its deadline; the last few sum requests and a seat's last few slice
//! fetches, once the others' answers stopped coming ([`Stall`]), are
//! hedged at once.
//!
//! 6. A shard none of whose seats signed within `reseat` of the manifest
//!    (its seats are taken for dead), and that nothing else decided, gets
//!    a round of its reserve seats as well, drawn for the step apart from
//!    its own (`shard::reserve`): they fetch the listed slices from the
//!    members, sum and sign as any seat, and the old seats still count.
//!    A round silent for `reseat` in turn hands the shard to the next, up
//!    to `shard::RESERVE_ROUNDS`. A reserve seat's signed hash moves the
//!    shard at a node at most `agree` early, one round at a time.
//!
//! Sums name the manifest they sum (`ManifestId`): a step can have two for
//! a while, and seats that summed different lists are not liars.
//!
//! A seat's hash sent by request can be lost where gossip took many
//! paths: a node that heard neither seat of a shard asks one without a
//! hash once the step's other hashes have stopped coming with only a few
//! shards left unheard (`Step::unheard`); the answer carries the hashes.
//!
//! 7. A seat that asked every source of a listed member's slice in vain
//!    signs and gossips that it is withheld; every node then asks those
//!    sources itself, hands the slice to the seats that said so if it gets
//!    it, and otherwise tells the step machine, whose fall-back manifest
//!    leaves the member out ([`probe`]).
//!
//! Not handled here: a shard whose every round of reserve seats is dead
//! too stalls it; equivocating aggregators keep their first hash; a replacement manifest
//! drops hashes already signed for a third one (and reserve seats' early
//! hashes), so a node that later takes that third manifest cannot accept
//! the shard unless it recomputes it.

use crate::compress::Draw;
use crate::error::EngineError;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How a job runs the sharded exchange: the same on every node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Shards per step.
    pub shards: usize,
    /// Aggregators (seats) per shard, and reserve seats per shard.
    pub redundancy: usize,
    /// Nodes, on average, that recompute each shard from its slices every
    /// step ([`checks`]: one shard a node when there is one per member).
    pub spots: usize,
    /// Nodes, on average, that recompute a shard one of whose seats is
    /// silent.
    pub backups: usize,
    pub timing: Timing,
}

impl Plan {
    /// Seats per shard when a job's exchange is chosen by [`plan_for`]:
    /// two, so a lying seat disagrees with an honest one.
    pub const REDUNDANCY: usize = 2;
    /// Members per shard when a job's exchange is chosen by [`plan_for`]:
    /// two, so a member holds about one seat a step (with two seats a
    /// shard) instead of two. Half the shards halves what scales with
    /// them: the seats' signed sum hashes every member receives and the
    /// per-slice overheads of every push. A seat sums twice the positions
    /// from the same members; a spot check moves twice the bytes half as
    /// often, so a node's check bytes a step and a liar's odds of being
    /// caught do not change ([`checks`]). Where a shard would exceed one
    /// slice [`shard_count`] cuts more (286 for a 1.21 B model, so up to
    /// 572 members nothing changes there). Measured against one shard a
    /// member in `cohort-bench simulate` (`--members-per-shard`,
    /// `docs/p2p.md`).
    pub const MEMBERS_PER_SHARD: usize = 2;
}

/// The aggregate a member downloads per shard under the sharded exchange,
/// in payloads: an exact vote sum of `members` one-vote members takes
/// ⌈log2(2·members + 1)⌉ bits a position where a payload takes one.
fn aggregate_payloads(members: usize) -> usize {
    (usize::BITS - (2 * members).leading_zeros()) as usize
}

/// Whether a job of `members` runs the sharded exchange: once the
/// all-to-all exchange's download, every other member's payload a step,
/// exceeds the bound of three payloads plus one aggregate, which
/// the sharded exchange keeps whatever the member count. Below that the
/// all-to-all exchange stays: it moves no more, and its screen judges
/// every payload whole (the sharded one judges a member shard by shard,
/// and its witnesses by one sampled slice). From 10 members on.
pub fn sharded_for(members: usize) -> bool {
    members.saturating_sub(1) > 3 + aggregate_payloads(members)
}

/// The one rule that chooses a job's exchange by its member count, for the
/// app and `cohort-peer` alike: None (all-to-all) below [`sharded_for`] or
/// where the recipe's rule is not the shared one (members of a top-k rule
/// name positions of their own, which no shard can sum); otherwise
/// [`shard_count`] shards, two seats each.
pub fn plan_for(members: usize, train: &crate::trainer::TrainConfig) -> Option<Plan> {
    if !sharded_for(members) || train.compress.select != crate::compress::Select::Shared {
        return None;
    }
    let shapes: Vec<Vec<usize>> = train.model.shapes().into_iter().map(|(_, s)| s).collect();
    let layout = crate::compress::Layout::new(&shapes, &train.compress);
    shard_count(members, &layout).map(|shards| Plan {
        shards,
        redundancy: Plan::REDUNDANCY,
        spots: 1,
        backups: 4,
        timing: Timing::default(),
    })
}

/// The shards a job of `members` cuts `layout` into under the sharded
/// exchange, for the node ([`plan_for`]) and `cohort-bench simulate`
/// alike: one shard per [`Plan::MEMBERS_PER_SHARD`] members, or more where
/// a shard would exceed what one slice carries
/// ([`crate::net::msg::MAX_SLICE_SIGNS`]), and no more than the layout's
/// chunks. None where no count up to the chunks cuts slices that fit.
pub fn shard_count(members: usize, layout: &crate::compress::Layout) -> Option<usize> {
    let chunks: usize = layout.dcts.iter().map(|d| d.tiling.chunks()).sum();
    let positions: usize = (0..layout.dcts.len())
        .map(|p| layout.dcts[p].tiling.chunks() * layout.topk[p])
        .sum();
    let least = positions.div_ceil(crate::net::msg::MAX_SLICE_SIGNS);
    let wanted = members.div_ceil(Plan::MEMBERS_PER_SHARD);
    (wanted.max(least).min(chunks)..=chunks).find(|&n| {
        crate::shard::split(layout, n).is_ok_and(|shards| {
            shards
                .iter()
                .all(|s| s.positions <= crate::net::msg::MAX_SLICE_SIGNS)
        })
    })
}

/// Per shard, the members seated on it.
pub type Seats = Vec<Vec<u32>>;

/// Mixed into a step's draw for its reserve seats, so they are drawn apart
/// from its seats.
const RESERVE_DRAW: u64 = 0x7265_7365_7276_6521;

/// The seats and reserve seats of every shard at `step`, drawn from `seed`
/// (the node's epoch seed; the simulator's job): the one rule the node and
/// the simulator seat aggregators by.
pub fn seating(
    seed: &[u8; 32],
    step: u32,
    members: &[u32],
    shards: usize,
    redundancy: usize,
) -> Result<(Seats, Seats), EngineError> {
    let draw = Draw::for_step(seed, step);
    let seats = crate::shard::aggregators(members, shards, redundancy, draw)?;
    let reserve = crate::shard::reserve(members, &seats, redundancy, Draw(draw.0 ^ RESERVE_DRAW));
    Ok((seats, reserve))
}

/// The shards a node recomputes at a step, from uniform draws in [0, 1)
/// only that node can make (`next`): spot checks enough that each shard is
/// checked by `spots` nodes on average (`spots · shards / members` a node,
/// its fraction drawn), and each shard as a backup with probability
/// `backups / members`. With one shard per member a node spot-checks
/// `spots` shards every step; with fewer, larger shards it checks one less
/// often, so a node's check bytes a step and a liar's odds of being caught
/// stay the same whatever the shard count.
pub fn checks(
    shards: usize,
    spots: usize,
    backups: usize,
    members: usize,
    mut next: impl FnMut() -> f64,
) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let per_node = spots as f64 * shards as f64 / members.max(1) as f64;
    let mut count = per_node.floor() as usize;
    let frac = per_node - per_node.floor();
    if frac > 1e-9 && next() < frac {
        count += 1;
    }
    let mut chosen = BTreeSet::new();
    while chosen.len() < count.min(shards) {
        chosen.insert(((next() * shards as f64) as u32).min(shards as u32 - 1));
    }
    let p = backups as f64 / members.max(1) as f64;
    let backup = (0..shards as u32).filter(|_| next() < p).collect();
    (chosen, backup)
}

/// A sum's hash, as its aggregator signs it.
pub type Hash = [u8; 32];

/// The hash of the signed manifest whose listed members a sum adds up. An
/// aggregator signs it with its sum's hash: a step can have two manifests
/// for a while (a fall-back leader's and the late leader's, which
/// outranks it), and seats that summed different lists are not liars.
pub type ManifestId = [u8; 32];

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Wait before retrying a failed push, slice or sum request.
    pub retry: Duration,
    /// Grace for pushes still in flight once the manifest is known, before
    /// an aggregator fetches the listed slices it lacks.
    pub wait: Duration,
    /// How long a node waits for a shard's other aggregators once the
    /// first has signed: longer than `wait` plus a slice fetch, so that an
    /// aggregator that had to fetch a slice is not taken for a silent one.
    pub agree: Duration,
    /// A shard none of whose aggregators has signed a sum this long after
    /// the manifest, or whose first signed hash has stood alone this long,
    /// is recomputed from its slices by its backups.
    pub silent: Duration,
    /// A shard none of whose aggregators has signed a sum this long after
    /// the manifest is handed to its reserve seats: its seats are taken
    /// for dead (a slow seat has had three times `silent`).
    pub reseat: Duration,
    /// A sum or slice request unanswered this long, or longer if sums take
    /// longer to come here (their mean plus two mean deviations), is sent to the next source as well, the first answer counting: a hedged request (Dean
    /// and Barroso, "The Tail at Scale", CACM 2013). A node asks a
    /// thousand small things a step; with 1% lost and a lost one known
    /// only at its deadline (`step::Timing::deadline`, 5 s and more), every
    /// step would otherwise wait that long for one of them.
    pub hedge: Duration,
    /// The few requests left of a batch whose answers have stopped coming
    /// count as lost once none has come for [`STALL_FLOOR`], or for this
    /// share of the time the batch has taken so far where that is longer
    /// ([`Stall`]). Shipped at 0, the floor alone: a quarter waited
    /// seconds on batches whose slowest answers trickle in, and cost the
    /// 1,000-node simulation 3% to 10% of its pace (`docs/p2p.md`); the
    /// copies an early stall sends are capped by [`STRAGGLERS`] either way.
    pub stall_share: f64,
    /// How long a node holds its first request for a shard's sum for the
    /// seat the rotation gives it (by node and shard), once another seat
    /// has signed and that one has not, before it asks one that has. At
    /// zero (before 2026-12-07) it asked the first seat that signed: that
    /// seat then served nearly every node while its partner's hash was
    /// still on its way, and the last sums of a step came from the seats
    /// serving twice their share. 1 s was the best of 0, 0.5, 1 and 2 s
    /// in `cohort-bench simulate --seat-wait-secs` at 1,000 nodes (seed
    /// 42: contributed-token efficiency 0.705, 0.756, 0.782, 0.764) and
    /// better than 0 at 48 (5 seeds, share of ideal 0.824, 0.845, 0.835,
    /// 0.839): `docs/p2p.md`.
    pub seat_wait: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            retry: Duration::from_millis(500),
            wait: Duration::from_millis(500),
            agree: Duration::from_secs(5),
            silent: Duration::from_secs(10),
            reseat: Duration::from_secs(30),
            hedge: Duration::from_secs(2),
            stall_share: 0.0,
            seat_wait: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send this node's slice of `shard` to its aggregator `to`; report
    /// the outcome with `on_pushed` or `on_push_failed`.
    Push { step: u32, shard: u32, to: u32 },
    /// Every shard holds this node's slice at one aggregator at least:
    /// announce the contribution (the step machine's `on_local`).
    Announce { step: u32 },
    /// Ask `from` for `member`'s slice of `shard`.
    FetchSlice {
        step: u32,
        shard: u32,
        member: u32,
        from: u32,
    },
    /// Every slice `manifest` lists for `shard` is held: sum them, sign
    /// and gossip the sum's hash with `manifest`, and serve the sum. The
    /// driver reports the hash back with `on_sum_hash`, as from any
    /// aggregator.
    PublishSum {
        step: u32,
        shard: u32,
        manifest: ManifestId,
    },
    /// Ask aggregator `from` for the sum of `shard`.
    FetchSum { step: u32, shard: u32, from: u32 },
    /// Fetch the slices `manifest` lists for `shard` from its aggregator
    /// `from` and recompute the sum; report with `on_recomputed` or
    /// `on_fetch_failed`.
    Recompute {
        step: u32,
        shard: u32,
        from: u32,
        manifest: ManifestId,
    },
    /// `aggregator` signed, for `manifest`, `hash` for `shard`, which the
    /// slices do not give (the proof quotes that very hash).
    Convict {
        step: u32,
        shard: u32,
        aggregator: u32,
        manifest: ManifestId,
        hash: Hash,
    },
    /// Every shard's sum is accepted: the step can apply.
    Apply { step: u32 },
    /// This seat asked every source of `member`'s slice of `shard` in vain:
    /// sign and gossip that it is withheld, with `manifest`, and report it
    /// back with `on_withheld_claim`, as from any seat.
    ClaimWithheld {
        step: u32,
        shard: u32,
        member: u32,
        manifest: ManifestId,
    },
    /// Ask `from` for `member`'s slice of `shard`, which a seat says nobody
    /// serves; report with `on_slice` or `on_probe_failed`.
    Probe {
        step: u32,
        shard: u32,
        member: u32,
        from: u32,
    },
    /// Hand `member`'s slice of `shard`, held here, to seat `to`, which
    /// said nobody serves it (checked there as a push is).
    Forward {
        step: u32,
        shard: u32,
        member: u32,
        to: u32,
    },
    /// Every source of `member`'s slice failed this node too: the step
    /// machine's `on_withheld` (a fall-back manifest leaves it out).
    Withheld { step: u32, member: u32 },
    /// A slice given up as withheld turned up: the step machine's
    /// `on_served`.
    Served { step: u32, member: u32 },
    /// A step already applied used a sum proven wrong, or its manifest was
    /// replaced by a better-ranked one: go back to the state before it;
    /// `Apply` follows again.
    Rewind { step: u32 },
}

/// What the machine made of an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// For a step this node has not opened or has forgotten.
    UnknownStep,
    /// A slice for a shard this node does not aggregate, or a hash or sum
    /// from a member that holds no seat of the shard.
    NotASeat,
    /// Nothing new.
    Duplicate,
    /// About another manifest than the one this node takes for the step.
    OtherManifest,
    /// About a member the step's manifest does not list.
    NotListed,
}

/// An aggregator's view of one of its shards.
#[derive(Debug, Default)]
struct Agg {
    held: BTreeSet<u32>,
    /// Listed members whose slice is not held yet.
    missing: usize,
    /// Per missing member, the requests for its slice.
    asking: BTreeMap<u32, Asking>,
    /// Fetching starts at this time (the manifest plus `wait`).
    fetch_from: Option<Duration>,
    /// Those fetches' answers: once they stopped coming with only a few
    /// left, the few are hedged at once (within the hedge budget).
    stall: Stall,
    published: bool,
    /// Members this seat said withhold their slice.
    claimed: BTreeSet<u32>,
}

/// Requests for one thing (a slice, a sum): how many sources were tried,
/// how many requests are out, and when the last went.
#[derive(Debug, Default, Clone, Copy)]
struct Asking {
    tried: usize,
    out: u8,
    sent: Option<Duration>,
    /// The source asked last.
    last: Option<u32>,
}

impl Asking {
    /// A request just went to `from`.
    fn sent(&mut self, now: Duration, from: u32) {
        self.tried += 1;
        self.out += 1;
        self.sent = Some(now);
        self.last = Some(from);
    }

    /// The first of `sources` (in the order to try them) other than the
    /// one asked last, else that one.
    fn next(&self, mut sources: impl Iterator<Item = u32> + Clone) -> Option<u32> {
        sources
            .clone()
            .find(|&x| Some(x) != self.last)
            .or_else(|| sources.next())
    }

    /// One request came back (answered or failed).
    fn back(&mut self) {
        self.out = self.out.saturating_sub(1);
    }

    /// When to ask the next source too, while one request is out (once:
    /// two at most are out). Asked again at each look, as the delay may
    /// have grown since the request went.
    fn hedge_at(&self, hedge: Duration) -> Option<Duration> {
        self.sent.filter(|_| self.out == 1).map(|t| t + hedge)
    }

    /// One request is out and unanswered for `hedge`.
    fn hedge_due(&self, now: Duration, hedge: Duration) -> bool {
        self.hedge_at(hedge).is_some_and(|t| t <= now)
    }

    /// When to look again for a hedge: none once it is due (it went with
    /// this look if it could; else the answer, or its failure, wakes it).
    /// A look at a time already past would come back at once, for ever,
    /// where the hedge cannot go (no budget left, or nothing to ask: a
    /// seat's own shard) or a retry waits its turn.
    fn wake_at(&self, now: Duration, hedge: Duration) -> Option<Duration> {
        self.hedge_at(hedge).filter(|t| *t > now)
    }
}

/// A receiver's view of one shard.
#[derive(Debug, Default)]
struct Recv {
    /// The hash each seat signed, and the manifest it summed.
    hashes: Vec<Option<(ManifestId, Hash)>>,
    first_at: Option<Duration>,
    /// Requests for the sum (`tried` rotates the seats), and when the
    /// next may go after a failure.
    ask: Asking,
    due: Option<Duration>,
    /// Requests for the slices, to recompute the sum.
    verify: Asking,
    verify_due: Option<Duration>,
    got: Option<Hash>,
    /// Only a recomputation decides the shard: its seats disagree, or
    /// another node proved one of them wrong.
    recompute: bool,
    /// Recompute beside taking the seats' agreed sum (a spot check, or a
    /// backup's for a silent seat): the step applies meanwhile, and goes
    /// back if the recomputation proves the sum false.
    check: bool,
    /// A spot check of this node's (what `check` starts as). It starts
    /// once this node has taken the shard's sum: by then the step's
    /// manifest has mostly settled (a check of an outranked manifest is
    /// done again for the new one, a payload's worth for nothing), and the
    /// seats have served the sums on the step's path first. The check
    /// runs beside acceptance either way, so it catches the same lies.
    spot: bool,
    /// Recompute if a seat stays silent.
    backup: bool,
    /// Asked of a seat before any hash of it came ([`Step::unheard`]).
    blind: bool,
    /// A backup's check is due (a seat stayed silent): at once, not after
    /// acceptance.
    backing: bool,
    /// When the shard last went to a round of its reserve seats, if it did.
    reseated: Option<Duration>,
    /// Rounds of reserve seats it went to.
    rounds: usize,
    /// Hashes reserve seats signed before this node moved the shard to
    /// them: kept for when it does.
    early: Vec<(u32, ManifestId, Hash)>,
    truth: Option<Hash>,
    accepted: Option<Hash>,
    convicted: BTreeSet<usize>,
}

#[derive(Debug)]
struct Step {
    seats: Vec<Vec<u32>>,
    /// Per shard, the seats that take it over if its own stay silent, in
    /// rounds of `round` ([`crate::shard::reserve`]).
    reserve: Vec<Vec<u32>>,
    /// Seats per round: the step's redundancy.
    round: usize,
    members: Option<Vec<u32>>,
    manifest: Option<ManifestId>,
    manifest_at: Option<Duration>,
    /// Shards whose slice reached an aggregator (pushes that succeeded).
    reached: Vec<bool>,
    reached_left: usize,
    computed: bool,
    announced: bool,
    /// Pushes to retry: (due, shard, aggregator).
    push_retry: Vec<(Duration, u32, u32)>,
    /// This node's pushes not yet taken: (shard, aggregator).
    unacked: BTreeSet<(u32, u32)>,
    /// Those pushes' answers: once they stopped coming with only a few
    /// left, the few were lost and are sent again.
    push_stall: Stall,
    /// The most pushes sent again at once: one in [`STRAGGLERS`].
    push_few: usize,
    /// Shards whose sum this node asked for and has not got, a request
    /// still out.
    sums_out: BTreeSet<u32>,
    /// Those requests' answers: once they stopped coming with only a few
    /// left, the few are hedged at once (within the hedge budget).
    sum_stall: Stall,
    /// The most sum requests hedged that way: one in [`STRAGGLERS`].
    sums_few: usize,
    /// The stall has been acted on since the count last changed.
    sums_stalled: bool,
    /// Shards whose sum requests a stall took for lost: hedged at once.
    sums_lost: BTreeSet<u32>,
    /// Shards none of whose seats' hashes for the manifest has come. The
    /// seats send them by request (message version 9), and a request can
    /// be lost: a shard whose every hash was lost on the way here would
    /// wait `silent` for its backups, then `reseat`. Once hashes stopped
    /// coming with only a few shards left ([`Stall`], as for sums), each
    /// of the few is asked of a seat without a hash (the rotation's, then
    /// the next), again each time `hash_wait` passes with none coming; a
    /// seat that summed answers with the sum and the hashes it holds
    /// (`msg::Response::Sum`), one that did not says so, and the shard
    /// waits for its hashes as before.
    unheard: BTreeSet<u32>,
    hash_stall: Stall,
    /// How long no hash must have come before the few unheard shards are
    /// asked (again): [`STALL_FLOOR`], doubled each time they are, up to
    /// `Timing::silent`. Not given up: a seat held up by a slice it had
    /// to fetch again and again can sum long after the step's other
    /// shards, and a node that lost both its seats' hashes has nothing
    /// else to learn it from; a stalled shard costs each node one small
    /// request every `silent`.
    hash_wait: Duration,
    /// Shards the stall took for unheard: each asked once without a hash
    /// each time the stall fires.
    hashes_lost: BTreeSet<u32>,
    agg: BTreeMap<u32, Agg>,
    recv: Vec<Recv>,
    /// Per (member, shard) a seat said is withheld, this node's own look.
    probes: BTreeMap<(u32, u32), probe::Probe>,
    /// Members whose slice of some shard this node gave up as withheld
    /// (the step machine is told once per member).
    withheld: BTreeSet<u32>,
    accepted_left: usize,
    applied: bool,
}

/// One node's sharded exchange across its open steps.
#[derive(Debug)]
pub struct Exchange {
    me: u32,
    timing: Timing,
    steps: BTreeMap<u32, Step>,
    /// (step, shard) to look at on the next poll.
    dirty: BTreeSet<(u32, u32)>,
    /// (when, step, shard) to look at again.
    timers: BTreeSet<(Duration, u32, u32)>,
    out: Vec<Action>,
    /// How long sum requests take to be answered here.
    answers: AnswerTime,
    hedges: HedgeBudget,
}

/// A member sends again at most one push in this many (and at least a
/// shard's worth) once its pushes' answers have stalled ([`Stall`]): those
/// were lost, not slow; a node hedges at most one sum request in this many
/// the same way. Well above the share of requests lost (1% in the
/// simulator): at one in a hundred, 2,000 pushes with 20 lost on average
/// had more than 20 left for nearly half the members, who then sent none
/// again (`cohort-bench simulate`, 1,000 nodes: 0.647 of the free run,
/// against 0.682 resending by shard).
const STRAGGLERS: usize = 20;

/// How many of a batch of `batch` requests are "a few" ([`Stall`]): one in
/// [`STRAGGLERS`], and at least `least`.
fn stragglers(batch: usize, least: usize) -> usize {
    (batch / STRAGGLERS).max(least)
}

/// The shortest stall after which the few requests left of a batch count
/// as lost ([`Stall`]): above a home link's round trip (two ends at up to
/// 40 ms each way, `cohort-bench simulate`'s links).
pub const STALL_FLOOR: Duration = Duration::from_millis(250);

/// A batch of requests sent together (a member's pushes, a node's sum
/// requests, a seat's fetches of listed slices it lacks) whose answers have stopped coming with only a few left: the
/// few were lost, not slow. Answers that share one uplink come about
/// together, so the batch's own pace tells a lost request from a late one
/// long before its deadline (5 s and more), and sooner than a hedge timed
/// by answer times that a full uplink makes long. As TCP's RACK (RFC 8985)
/// takes a segment for lost once later ones were acknowledged a fraction
/// of a round trip ago, the few left count as lost once no answer has
/// come for [`STALL_FLOOR`] (a few home round trips), or for
/// [`Timing::stall_share`] of the time the batch has taken so far where a
/// job sets one and that is longer.
#[derive(Debug, Default, Clone, Copy)]
struct Stall {
    /// When the batch's first request was out.
    start: Option<Duration>,
    /// Requests unanswered, and since when that count stood.
    left: usize,
    since: Duration,
}

impl Stall {
    /// `left` of the batch's requests are unanswered at `now`; whether that
    /// count changed.
    fn watch(&mut self, now: Duration, left: usize) -> bool {
        if self.start.is_none() && left > 0 {
            self.start = Some(now);
        }
        if left == self.left {
            return false;
        }
        self.left = left;
        self.since = now;
        true
    }

    /// When the requests left count as lost: none while more than `few`
    /// (or none) are left; else once none has come for `share` of the time
    /// the batch has taken.
    fn due(&self, few: usize, share: f64) -> Option<Duration> {
        let start = self.start?;
        let part = self.since.saturating_sub(start).mul_f64(share.max(0.0));
        (self.left > 0 && self.left <= few).then(|| self.since + part.max(STALL_FLOOR))
    }

    /// Those left were asked again at `now`: as long again before the next
    /// time.
    fn again(&mut self, now: Duration) {
        self.since = now;
    }

    /// Since when the count left has stood, while some are left.
    fn quiet_since(&self) -> Option<Duration> {
        (self.left > 0).then_some(self.since)
    }
}

/// Deviations past the mean answer time before a hedge (TCP waits 4 before
/// it retransmits; a hedge costs less than a time-out, and "The Tail at
/// Scale" hedges at about the 95th percentile).
const HEDGE_DEVIATIONS: f64 = 2.0;

/// Hedges a node may send, as a share of its first requests: "The Tail at
/// Scale" (Dean and Barroso, CACM 2013) kept hedging to about 5% more
/// load. Without a budget, a step whose seats' uplinks are merely full
/// hedges most of its requests (each to a busy seat, or to the same one
/// when only one has signed) and serves the sums half again: measured in
/// `cohort-bench simulate` at 1,000 nodes, 18.2 payloads of sums served
/// per node and step for an aggregate of 11.0.
const HEDGE_SHARE: f64 = 0.05;
/// Hedges saved up at most (and to start with): a quiet spell cannot buy
/// a congested step a hedge for every request.
const HEDGE_BURST: f64 = 32.0;

/// A token bucket for hedges: each first request earns [`HEDGE_SHARE`] of
/// one, each hedge spends one.
#[derive(Debug, Clone, Copy)]
struct HedgeBudget {
    tokens: f64,
}

impl Default for HedgeBudget {
    fn default() -> Self {
        Self {
            tokens: HEDGE_BURST,
        }
    }
}

impl HedgeBudget {
    fn ready(&self) -> bool {
        self.tokens >= 1.0
    }

    /// Whether a request may go now for `ask`: a first one when `free`
    /// (none out, no retry pending), else a hedge if one is overdue and
    /// the budget has one. `Some(hedging)` if it may.
    fn may_ask(&self, ask: &Asking, free: bool, now: Duration, hedge: Duration) -> Option<bool> {
        if free {
            Some(false)
        } else if ask.hedge_due(now, hedge) && self.ready() {
            Some(true)
        } else {
            None
        }
    }

    /// A request went: a first one earns, a hedge spends.
    fn sent(&mut self, hedge: bool) {
        if hedge {
            self.tokens -= 1.0;
        } else {
            self.tokens = (self.tokens + HEDGE_SHARE).min(HEDGE_BURST);
        }
    }
}

/// A smoothed answer time and its mean deviation, as TCP estimates a
/// round trip (RFC 6298: gains 1/8 and 1/4): a hedge sent before most
/// answers come would double the load on seats whose uplinks are merely
/// full, and make them slower still.
#[derive(Debug, Default, Clone, Copy)]
struct AnswerTime {
    mean: Option<f64>,
    deviation: f64,
}

impl AnswerTime {
    fn observe(&mut self, took: Duration) {
        let x = took.as_secs_f64();
        match self.mean {
            None => {
                self.mean = Some(x);
                self.deviation = x / 2.0;
            }
            Some(m) => {
                self.deviation += ((m - x).abs() - self.deviation) / 4.0;
                self.mean = Some(m + (x - m) / 8.0);
            }
        }
    }

    /// When to hedge: the mean plus [`HEDGE_DEVIATIONS`] deviations, and
    /// never before `floor`.
    fn hedge(&self, floor: Duration) -> Duration {
        let late = self
            .mean
            .map_or(0.0, |m| m + HEDGE_DEVIATIONS * self.deviation);
        floor.max(Duration::try_from_secs_f64(late).unwrap_or(Duration::MAX / 4))
    }
}

impl Agg {
    /// The manifest lists `listed`: what this aggregator still lacks of
    /// them, fetched from `from` on.
    fn ask_for(&mut self, listed: &[u32], from: Duration) {
        self.asking = listed
            .iter()
            .filter(|m| !self.held.contains(m))
            .map(|&m| (m, Asking::default()))
            .collect();
        self.missing = self.asking.len();
        self.fetch_from = Some(from);
        self.stall = Stall::default();
    }
}

impl Step {
    /// Shard `s`'s next round of reserve seats (empty once none is left).
    pub(super) fn next_round(&self, s: usize) -> &[u32] {
        let all = self.reserve.get(s).map_or(&[][..], Vec::as_slice);
        let from = (self.recv[s].rounds * self.round).min(all.len());
        &all[from..(from + self.round).min(all.len())]
    }

    /// Whether shard `s`'s seats have been silent for `reseat`: since the
    /// manifest, or since its last round of reserve seats took it over,
    /// whichever came later (a replacement manifest gives the seats a
    /// whole `reseat` to sum it again).
    fn overdue(&self, s: usize, at: Duration, reseat: Duration) -> bool {
        self.manifest_at
            .is_some_and(|m| self.recv[s].reseated.map_or(m, |r| r.max(m)) + reseat <= at)
    }

    /// Whether shard `s` may go to its next round of reserve seats: one is
    /// left, nothing decided the shard (no seat, reserve seats taken so
    /// far included, signed for the current manifest, no sum accepted,
    /// none recomputed), and no seat of it said a listed slice is withheld
    /// that this node could not get either: those seats are alive and
    /// blocked, not dead, and the step machine's fall-back leaves the
    /// member out. (Without that, a member withholding its slices from
    /// everyone was called on as a reserve seat round after round until
    /// it sat on every shard and signed sums nobody else could check.)
    fn may_reseat(&self, s: usize) -> bool {
        let r = &self.recv[s];
        !self.next_round(s).is_empty()
            && !self.probes.iter().any(|(&(member, shard), p)| {
                shard as usize == s
                    && !p.got
                    && self
                        .members
                        .as_ref()
                        .is_some_and(|m| m.binary_search(&member).is_ok())
            })
            && r.accepted.is_none()
            && r.truth.is_none()
            && !r
                .hashes
                .iter()
                .any(|h| h.is_some_and(|(m, _)| Some(m) == self.manifest))
    }

    /// Adds shard `s`'s next round of reserve seats to its seats: they
    /// fetch every listed slice from the members, sum and sign as any seat.
    /// The old seats still count, so a late hash of theirs is not lost, and
    /// nodes that moved the shard and nodes that did not yet cannot split
    /// over it. Returns the times to look at the shard again.
    fn reseat(&mut self, s: usize, now: Duration, me: u32, timing: &Timing) -> Vec<Duration> {
        let reserve = self.next_round(s).to_vec();
        let manifest = self.manifest;
        let r = &mut self.recv[s];
        r.reseated = Some(now);
        r.rounds += 1;
        for &a in &reserve {
            // The hash this reserve seat signed for the current manifest,
            // else any it signed.
            let early = r
                .early
                .iter()
                .find(|e| e.0 == a && Some(e.1) == manifest)
                .or_else(|| r.early.iter().find(|e| e.0 == a))
                .map(|e| (e.1, e.2));
            r.hashes.push(early);
        }
        r.early.retain(|e| !reserve.contains(&e.0));
        if r.first_at.is_none()
            && r.hashes
                .iter()
                .any(|h| h.is_some_and(|(m, _)| Some(m) == manifest))
        {
            r.first_at = Some(now);
        }
        if reserve.contains(&me) && !self.agg.contains_key(&(s as u32)) {
            let mut a = Agg::default();
            if self.computed {
                a.held.insert(me);
            }
            if let Some(listed) = &self.members {
                a.ask_for(listed, now);
            }
            self.agg.insert(s as u32, a);
        }
        self.seats[s].extend(reserve);
        vec![
            now,
            now + timing.silent,
            now + timing.agree,
            now + timing.reseat,
        ]
    }
}

impl Exchange {
    pub fn new(me: u32, timing: Timing) -> Self {
        Self {
            me,
            timing,
            steps: BTreeMap::new(),
            dirty: BTreeSet::new(),
            timers: BTreeSet::new(),
            out: Vec::new(),
            answers: AnswerTime::default(),
            hedges: HedgeBudget::default(),
        }
    }

    /// Opens `step` with its seats (per shard, its aggregators), the seats
    /// that take a shard over if none of its own signs within `reseat` of
    /// the manifest (`shard::reserve`; empty: none), the shards this node
    /// recomputes itself every time (`spots`) and those it recomputes only
    /// if one of their aggregators stays silent (`backups`), both chosen by
    /// a seed only this node knows.
    pub fn open(
        &mut self,
        step: u32,
        seats: Vec<Vec<u32>>,
        reserve: Vec<Vec<u32>>,
        spots: &BTreeSet<u32>,
        backups: &BTreeSet<u32>,
    ) {
        if self.steps.contains_key(&step) {
            return;
        }
        let shards = seats.len();
        let mut agg = BTreeMap::new();
        let mut recv = Vec::with_capacity(shards);
        for (s, seat) in seats.iter().enumerate() {
            if seat.contains(&self.me) {
                agg.insert(s as u32, Agg::default());
            }
            recv.push(Recv {
                hashes: vec![None; seat.len()],
                check: spots.contains(&(s as u32)),
                spot: spots.contains(&(s as u32)),
                backup: backups.contains(&(s as u32)),
                ..Recv::default()
            });
        }
        self.steps.insert(
            step,
            Step {
                round: seats.iter().map(Vec::len).max().unwrap_or(0),
                seats,
                reserve,
                members: None,
                manifest: None,
                manifest_at: None,
                reached: vec![false; shards],
                reached_left: shards,
                computed: false,
                announced: false,
                push_retry: Vec::new(),
                unacked: BTreeSet::new(),
                push_stall: Stall::default(),
                push_few: 1,
                sums_out: BTreeSet::new(),
                sum_stall: Stall::default(),
                // At least two: a small job's node asks a hung seat for
                // a sum or two.
                sums_few: stragglers(shards, 2),
                sums_stalled: false,
                sums_lost: BTreeSet::new(),
                unheard: BTreeSet::new(),
                hash_stall: Stall::default(),
                hash_wait: STALL_FLOOR,
                hashes_lost: BTreeSet::new(),
                agg,
                recv,
                probes: BTreeMap::new(),
                withheld: BTreeSet::new(),
                accepted_left: shards,
                applied: false,
            },
        );
    }

    /// Forgets every step before `step` (they are applied everywhere that
    /// matters; the driver keeps what it serves to late peers).
    pub fn forget_before(&mut self, step: u32) {
        self.steps = self.steps.split_off(&step);
        self.dirty = self.dirty.split_off(&(step, 0));
        self.timers.retain(|t| t.1 >= step);
    }

    /// This node's own payload for `step` is ready: push its slices.
    pub fn on_computed(&mut self, step: u32) -> Verdict {
        let me = self.me;
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        if st.computed {
            return Verdict::Duplicate;
        }
        st.computed = true;
        for s in 0..st.seats.len() {
            for &to in &st.seats[s] {
                if to == me {
                    if !st.reached[s] {
                        st.reached[s] = true;
                        st.reached_left -= 1;
                    }
                    self.dirty.insert((step, s as u32));
                } else {
                    st.unacked.insert((s as u32, to));
                    self.out.push(Action::Push {
                        step,
                        shard: s as u32,
                        to,
                    });
                }
            }
        }
        // At least a shard's worth: a small job's few pushes.
        let per_shard = st.seats.first().map_or(1, Vec::len);
        st.push_few = stragglers(st.unacked.len(), per_shard);
        self.dirty.insert((step, u32::MAX));
        for a in st.agg.values_mut() {
            Self::hold(a, me, st.members.as_deref());
        }
        Verdict::Accepted
    }

    /// A push of this node's slice of `shard` reached aggregator `to`.
    pub fn on_pushed(&mut self, step: u32, shard: u32, to: u32) -> Verdict {
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        if st.unacked.remove(&(shard, to)) {
            self.dirty.insert((step, u32::MAX));
        }
        let Some(r) = st.reached.get_mut(shard as usize) else {
            return Verdict::NotASeat;
        };
        if *r {
            return Verdict::Duplicate;
        }
        *r = true;
        st.reached_left -= 1;
        self.dirty.insert((step, u32::MAX));
        Verdict::Accepted
    }

    /// A push failed: it is tried again after `retry`, until this node has
    /// announced (the other aggregators then fetch from one that has it).
    pub fn on_push_failed(&mut self, now: Duration, step: u32, shard: u32, to: u32) {
        if let Some(st) = self.steps.get_mut(&step) {
            let due = now + self.timing.retry;
            st.push_retry.push((due, shard, to));
            self.timers.insert((due, step, u32::MAX));
        }
    }

    /// `member`'s slice of `shard` arrived here (pushed or fetched), already
    /// checked by the driver against the member's signed commitment.
    pub fn on_slice(&mut self, step: u32, shard: u32, member: u32) -> Verdict {
        let probed = self.probe_got(step, shard, member);
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        let Some(a) = st.agg.get_mut(&shard) else {
            return if probed {
                Verdict::Accepted
            } else {
                Verdict::NotASeat
            };
        };
        if a.held.contains(&member) {
            return Verdict::Duplicate;
        }
        Self::hold(a, member, st.members.as_deref());
        self.dirty.insert((step, shard));
        Verdict::Accepted
    }

    fn hold(a: &mut Agg, member: u32, members: Option<&[u32]>) {
        if a.held.insert(member)
            && members.is_some_and(|m| m.binary_search(&member).is_ok())
            && a.asking.remove(&member).is_some()
        {
            a.missing -= 1;
        }
    }

    /// A slice request to `from` failed: the next source is asked after
    /// `retry`.
    pub fn on_slice_failed(&mut self, now: Duration, step: u32, shard: u32, member: u32) {
        let Some(st) = self.steps.get_mut(&step) else {
            return;
        };
        if let Some(ask) = st
            .agg
            .get_mut(&shard)
            .and_then(|a| a.asking.get_mut(&member))
        {
            ask.back();
            self.timers.insert((now + self.timing.retry, step, shard));
        }
    }

    /// The step's manifest is known, or replaced by one that outranks it:
    /// these members' contributions apply. A replacement starts the
    /// step's aggregation and acceptance over (slices already held are
    /// kept, and so are hashes seats signed for the new manifest), and
    /// rewinds the step if it was applied.
    pub fn on_manifest(
        &mut self,
        now: Duration,
        step: u32,
        manifest: ManifestId,
        members: &[u32],
    ) -> Verdict {
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        if st.manifest == Some(manifest) {
            return Verdict::Duplicate;
        }
        if st.manifest.is_some() {
            for a in st.agg.values_mut() {
                a.published = false;
            }
            for r in &mut st.recv {
                for h in &mut r.hashes {
                    if h.is_some_and(|(m, _)| m != manifest) {
                        *h = None;
                    }
                }
                *r = Recv {
                    hashes: std::mem::take(&mut r.hashes),
                    check: r.spot,
                    spot: r.spot,
                    backup: r.backup,
                    reseated: r.reseated,
                    rounds: r.rounds,
                    ..Recv::default()
                };
            }
            st.accepted_left = st.recv.len();
            st.sums_out.clear();
            st.sum_stall = Stall::default();
            st.sums_stalled = false;
            st.sums_lost.clear();
            st.hash_stall = Stall::default();
            st.hash_wait = STALL_FLOOR;
            st.hashes_lost.clear();
            if st.applied {
                st.applied = false;
                self.out.push(Action::Rewind { step });
            }
        }
        for (s, r) in st.recv.iter_mut().enumerate() {
            if r.hashes
                .iter()
                .any(|h| h.is_some_and(|(m, _)| m == manifest))
            {
                r.first_at = Some(now);
                self.timers
                    .insert((now + self.timing.agree, step, s as u32));
                self.timers
                    .insert((now + self.timing.silent, step, s as u32));
            }
        }
        st.manifest = Some(manifest);
        st.unheard = (0..st.recv.len() as u32).collect();
        let mut listed = members.to_vec();
        listed.sort_unstable();
        listed.dedup();
        for (&s, a) in st.agg.iter_mut() {
            a.ask_for(&listed, now + self.timing.wait);
            self.timers.insert((now + self.timing.wait, step, s));
            self.dirty.insert((step, s));
        }
        st.members = Some(listed);
        st.manifest_at = Some(now);
        for s in 0..st.seats.len() as u32 {
            self.dirty.insert((step, s));
            self.timers.insert((now + self.timing.silent, step, s));
            self.timers.insert((now + self.timing.reseat, step, s));
        }
        Verdict::Accepted
    }

    /// Aggregator `from` signed `hash` as the sum of `shard` over the
    /// members `manifest` lists.
    pub fn on_sum_hash(
        &mut self,
        now: Duration,
        step: u32,
        shard: u32,
        from: u32,
        manifest: ManifestId,
        hash: Hash,
    ) -> Verdict {
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        let s = shard as usize;
        // A reserve seat signs only once it took the shard over, so its
        // hash shows the seats were taken for dead somewhere. It is kept
        // for this node's own move, which it brings forward by at most
        // `agree`: a reserve seat cannot take a shard over at will. Each
        // such hash moves the shard one round at most.
        if st.seats.get(s).is_some_and(|seats| !seats.contains(&from))
            && st.reserve.get(s).is_some_and(|r| r.contains(&from))
        {
            let r = &mut st.recv[s];
            if r.early.iter().any(|e| e.0 == from && e.1 == manifest) {
                return Verdict::Duplicate;
            }
            // One per reserve seat, its latest: made-up manifest ids from
            // eight reserve seats must not pile up.
            r.early.retain(|e| e.0 != from);
            r.early.push((from, manifest, hash));
            let due = st.overdue(s, now + self.timing.agree, self.timing.reseat);
            if !due || !st.may_reseat(s) {
                return Verdict::Accepted;
            }
            for t in st.reseat(s, now, self.me, &self.timing) {
                self.timers.insert((t, step, shard));
            }
            self.dirty.insert((step, shard));
            return Verdict::Accepted;
        }
        let Some(seat) = st
            .seats
            .get(s)
            .and_then(|seats| seats.iter().position(|&a| a == from))
        else {
            return Verdict::NotASeat;
        };
        let r = &mut st.recv[s];
        // A second hash for the same manifest is an equivocation: the
        // first stands. One for another manifest replaces a hash for an
        // outranked one (the seat summed again).
        if r.hashes[seat].is_some_and(|(m, _)| m == manifest) {
            return Verdict::Duplicate;
        }
        // A hash for the manifest this node takes is never replaced by
        // one for another (hashes can arrive out of order).
        if st.manifest != Some(manifest)
            && r.hashes[seat].is_some_and(|(m, _)| st.manifest == Some(m))
        {
            return Verdict::OtherManifest;
        }
        r.hashes[seat] = Some((manifest, hash));
        match st.manifest {
            // Counted once this node has the manifest (`on_manifest`).
            None => return Verdict::Accepted,
            Some(m) if m != manifest => return Verdict::OtherManifest,
            Some(_) => {}
        }
        if r.first_at.is_none() {
            r.first_at = Some(now);
            self.timers.insert((now + self.timing.agree, step, shard));
            self.timers.insert((now + self.timing.silent, step, shard));
        }
        self.dirty.insert((step, shard));
        Verdict::Accepted
    }

    /// The sum of `shard` arrived from `from`, hashing to `hash`.
    pub fn on_sum(
        &mut self,
        now: Duration,
        step: u32,
        shard: u32,
        from: u32,
        hash: Hash,
    ) -> Verdict {
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        let Some(seat) = st
            .seats
            .get(shard as usize)
            .and_then(|seats| seats.iter().position(|&a| a == from))
        else {
            return Verdict::NotASeat;
        };
        let current = st.manifest;
        let r = &mut st.recv[shard as usize];
        // Timed only when one request was out: with a hedge out too, which
        // one answered is unknown.
        if r.ask.out == 1
            && let Some(sent) = r.ask.sent
        {
            self.answers.observe(now.saturating_sub(sent));
        }
        r.ask.back();
        if current.is_some() && r.hashes[seat] == current.map(|m| (m, hash)) {
            r.got = Some(hash);
        } else {
            // Bytes that are not what their server signed: ask another.
            r.due = Some(now + self.timing.retry);
            self.timers.insert((now + self.timing.retry, step, shard));
        }
        if r.got.is_some() || r.ask.out == 0 {
            st.sums_out.remove(&shard);
        }
        self.dirty.insert((step, shard));
        Verdict::Accepted
    }

    /// A sum request failed: the next seat is asked after `retry`.
    pub fn on_fetch_failed(&mut self, now: Duration, step: u32, shard: u32) {
        if let Some(st) = self.steps.get_mut(&step)
            && let Some(r) = st.recv.get_mut(shard as usize)
        {
            r.ask.back();
            if r.ask.out == 0 {
                st.sums_out.remove(&shard);
            }
            r.due = Some(now + self.timing.retry);
            self.timers.insert((now + self.timing.retry, step, shard));
        }
    }

    /// A recomputation's fetch failed: the next seat is asked after
    /// `retry`.
    pub fn on_recompute_failed(&mut self, now: Duration, step: u32, shard: u32) {
        if let Some(r) = self
            .steps
            .get_mut(&step)
            .and_then(|st| st.recv.get_mut(shard as usize))
        {
            r.verify.back();
            r.verify_due = Some(now + self.timing.retry);
            self.timers.insert((now + self.timing.retry, step, shard));
        }
    }

    /// The slices `manifest` lists for `shard` recompute to `hash`.
    pub fn on_recomputed(
        &mut self,
        step: u32,
        shard: u32,
        manifest: ManifestId,
        hash: Hash,
    ) -> Verdict {
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        if st.manifest != Some(manifest) {
            return Verdict::OtherManifest;
        }
        let Some(r) = st.recv.get_mut(shard as usize) else {
            return Verdict::NotASeat;
        };
        r.verify.back();
        if r.truth.is_some() {
            return Verdict::Duplicate;
        }
        r.truth = Some(hash);
        self.dirty.insert((step, shard));
        Verdict::Accepted
    }

    /// Another node proved (slices and a hash signed for `manifest`)
    /// that a seat of `shard` lied: recompute it here too.
    pub fn on_evidence(&mut self, step: u32, shard: u32, manifest: ManifestId) -> Verdict {
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        if st.manifest != Some(manifest) {
            return Verdict::OtherManifest;
        }
        let Some(r) = st.recv.get_mut(shard as usize) else {
            return Verdict::NotASeat;
        };
        if r.recompute {
            return Verdict::Duplicate;
        }
        r.recompute = true;
        self.dirty.insert((step, shard));
        Verdict::Accepted
    }

    /// Whether this node holds `member`'s slice of `shard` at `step` (as an
    /// aggregator), to serve it.
    pub fn holds(&self, step: u32, shard: u32, member: u32) -> bool {
        self.steps.get(&step).is_some_and(|st| {
            st.agg.get(&shard).is_some_and(|a| a.held.contains(&member))
                || st.probes.get(&(member, shard)).is_some_and(|p| p.got)
        })
    }

    /// The seats of `shard` at `step` whose signed hashes this node holds,
    /// with the manifest and hash each signed: what a sum it serves
    /// carries (`msg::Response::Sum`).
    pub fn signed(&self, step: u32, shard: u32) -> Vec<(u32, ManifestId, Hash)> {
        let Some(st) = self.steps.get(&step) else {
            return Vec::new();
        };
        let s = shard as usize;
        let (Some(seats), Some(r)) = (st.seats.get(s), st.recv.get(s)) else {
            return Vec::new();
        };
        seats
            .iter()
            .zip(&r.hashes)
            .filter_map(|(&a, h)| h.map(|(m, x)| (a, m, x)))
            .collect()
    }

    /// The hash of the sum this node accepted for `shard` at `step`.
    pub fn accepted(&self, step: u32, shard: u32) -> Option<Hash> {
        self.steps.get(&step)?.recv.get(shard as usize)?.accepted
    }

    /// The earliest time `poll` has something to do without new input.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.timers.first().map(|t| t.0)
    }

    pub fn poll(&mut self, now: Duration) -> Vec<Action> {
        while let Some(&(t, step, shard)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            self.dirty.insert((step, shard));
        }
        for (step, shard) in std::mem::take(&mut self.dirty) {
            self.drive(now, step, shard);
        }
        std::mem::take(&mut self.out)
    }

    fn drive(&mut self, now: Duration, step: u32, shard: u32) {
        let me = self.me;
        let timing = self.timing;
        let hedge = self.answers.hedge(timing.hedge);
        let Some(st) = self.steps.get_mut(&step) else {
            return;
        };
        // The member's side: pushes lost, retries and the announcement.
        // A push lost on the way is learnt only at its deadline: at 1,000
        // shards and 1% of requests lost, a tenth of the members would
        // wait that long every step to announce, and the leader with
        // them, and every seat would fetch one in a hundred of its listed
        // slices.
        // Once pushes have stopped arriving with only a few left (one in
        // [`STRAGGLERS`], [`Stall`]), those few are sent again, until the
        // manifest is known (then the seats fetch what they lack). A
        // member whose pushes are merely slow, its uplink shared with the
        // sums it serves, has most of them left and sends none again.
        if st.computed && st.manifest.is_none() {
            st.push_stall.watch(now, st.unacked.len());
            if let Some(due) = st.push_stall.due(st.push_few, timing.stall_share) {
                if now >= due {
                    for &(s, to) in &st.unacked {
                        self.out.push(Action::Push { step, shard: s, to });
                    }
                    st.push_stall.again(now);
                }
                if let Some(t) = st.push_stall.due(st.push_few, timing.stall_share) {
                    self.timers.insert((t, step, u32::MAX));
                }
            }
        }
        if st.computed && !st.announced {
            let mut keep = Vec::new();
            for (due, s, to) in std::mem::take(&mut st.push_retry) {
                if st.reached[s as usize] {
                    continue;
                }
                if due <= now {
                    self.out.push(Action::Push { step, shard: s, to });
                } else {
                    keep.push((due, s, to));
                }
            }
            st.push_retry = keep;
            if st.reached_left == 0 {
                st.announced = true;
                self.out.push(Action::Announce { step });
            }
        }
        if shard == u32::MAX {
            return;
        }
        let s = shard as usize;
        let Some(manifest) = st.manifest else {
            return;
        };
        // The aggregator's side.
        if let Some(a) = st.agg.get_mut(&shard) {
            if !a.published && a.missing == 0 {
                a.published = true;
                self.out.push(Action::PublishSum {
                    step,
                    shard,
                    manifest,
                });
            } else if !a.published && a.fetch_from.is_some_and(|t| t <= now) {
                let seats = &st.seats[s];
                // Fetches whose answers stalled with only a few left
                // ([`Stall`]: at most one listed slice in [`STRAGGLERS`],
                // and two in a small job) are hedged at once.
                let few = stragglers(st.members.as_ref().map_or(0, Vec::len), 2);
                a.stall.watch(now, a.missing);
                let due = a.stall.due(few, timing.stall_share);
                let slice_hedge = match due {
                    Some(t) if t <= now => Duration::ZERO,
                    Some(t) => {
                        self.timers.insert((t, step, shard));
                        hedge
                    }
                    None => hedge,
                };
                let Agg {
                    asking, claimed, ..
                } = a;
                for (&m, ask) in asking.iter_mut() {
                    if let Some(hedging) = self.hedges.may_ask(ask, ask.out == 0, now, slice_hedge)
                    {
                        // The member first, then the shard's other aggregators.
                        let sources: Vec<u32> = std::iter::once(m)
                            .chain(seats.iter().copied().filter(|&x| x != m))
                            .filter(|&x| x != me)
                            .collect();
                        let k = sources.len();
                        // Every source asked, none had it: say so.
                        if ask.out == 0 && ask.tried >= k && claimed.insert(m) {
                            self.out.push(Action::ClaimWithheld {
                                step,
                                shard,
                                member: m,
                                manifest,
                            });
                        }
                        if let Some(from) = ask.next((0..k).map(|i| sources[(ask.tried + i) % k])) {
                            ask.sent(now, from);
                            self.hedges.sent(hedging);
                            self.out.push(Action::FetchSlice {
                                step,
                                shard,
                                member: m,
                                from,
                            });
                        }
                    }
                    if let Some(t) = ask.wake_at(now, slice_hedge) {
                        self.timers.insert((t, step, shard));
                    }
                }
            }
        }
        let mut looked = Vec::new();
        for (&k, p) in st.probes.iter_mut().filter(|(k, _)| k.1 == shard) {
            if let Some(t) = p.drive(&mut looked, &mut self.hedges, now, step, k, hedge) {
                self.timers.insert((t, step, shard));
            }
        }
        for a in looked {
            match a {
                Action::Withheld { member, .. } if !st.withheld.insert(member) => {}
                a => self.out.push(a),
            }
        }
        // Seats taken for dead: the shard goes to its next round of
        // reserve seats.
        if st.overdue(s, now, timing.reseat) && st.may_reseat(s) {
            for t in st.reseat(s, now, me, &timing) {
                self.timers.insert((t, step, shard));
            }
            self.dirty.insert((step, shard));
            return;
        }
        // The receiver's side. Sum requests whose answers stalled with
        // only a few left ([`Stall`]) are hedged at once.
        if st.sum_stall.watch(now, st.sums_out.len()) {
            st.sums_stalled = false;
            if let (Some(t), Some(&x)) = (
                st.sum_stall.due(st.sums_few, timing.stall_share),
                st.sums_out.first(),
            ) {
                self.timers.insert((t, step, x));
            }
        }
        if !st.sums_stalled
            && st
                .sum_stall
                .due(st.sums_few, timing.stall_share)
                .is_some_and(|t| t <= now)
        {
            st.sums_stalled = true;
            for &x in &st.sums_out {
                st.sums_lost.insert(x);
                self.timers.insert((now, step, x));
            }
        }
        let sum_hedge = if st.sums_lost.contains(&shard) {
            Duration::ZERO
        } else {
            hedge
        };
        // Hashes that stopped coming with a few shards unheard: those few
        // are asked without a hash ([`Step::unheard`]), again after twice
        // as long each time; with more than a few unheard, after `agree`
        // at least (their seats are slow, not their hashes lost).
        let heard = |r: &Recv| {
            r.truth.is_some()
                || r.hashes
                    .iter()
                    .any(|h| h.is_some_and(|(m, _)| m == manifest))
        };
        if heard(&st.recv[s]) {
            st.unheard.remove(&shard);
        }
        if st.hash_stall.watch(now, st.unheard.len()) {
            st.hash_wait = STALL_FLOOR;
        }
        if let Some(since) = st.hash_stall.quiet_since() {
            let wait = if st.unheard.len() <= st.sums_few {
                st.hash_wait
            } else {
                st.hash_wait.max(timing.agree)
            };
            if since + wait <= now {
                for &x in &st.unheard {
                    st.hashes_lost.insert(x);
                    st.recv[x as usize].blind = false;
                    self.timers.insert((now, step, x));
                }
                st.hash_stall.again(now);
                st.hash_wait = (st.hash_wait * 2).min(timing.silent.max(STALL_FLOOR));
            } else if let Some(&x) = st.unheard.first() {
                self.timers.insert((since + wait, step, x));
            }
        }
        let unheard = st.hashes_lost.contains(&shard) && st.unheard.contains(&shard);
        let seats = &st.seats[s];
        let r = &mut st.recv[s];
        let was = r.accepted;
        let own = seats.iter().position(|&x| x == me);
        // The hashes signed for the manifest this node takes.
        let signed_for: Vec<Option<Hash>> = r
            .hashes
            .iter()
            .map(|h| h.filter(|(m, _)| *m == manifest).map(|(_, h)| h))
            .collect();
        if let Some(truth) = r.truth {
            for (i, h) in signed_for.iter().enumerate() {
                if let Some(h) = h.filter(|h| *h != truth)
                    && r.convicted.insert(i)
                {
                    self.out.push(Action::Convict {
                        step,
                        shard,
                        aggregator: seats[i],
                        manifest,
                        hash: h,
                    });
                }
            }
            r.accepted = Some(truth);
        } else {
            let signed: Vec<Hash> = signed_for.iter().flatten().copied().collect();
            let disagree = signed.windows(2).any(|w| w[0] != w[1]);
            let all = signed.len() == r.hashes.len();
            // Seats still silent `agree` after the first signed: the signed
            // ones are taken at their word.
            let silent = !all && r.first_at.is_some_and(|t| t + timing.agree <= now);
            // Still silent `silent` after the first signed: this shard's
            // backups check the word they took. Not at `agree`: with
            // thousands of seats a step, some partner is always a few
            // seconds late, and its hash, when it comes, checks the first
            // as well as a recomputation would; recomputing every such
            // shard put a payload's worth on its seats' uplinks each time,
            // which made them later still.
            let lone = !all && r.first_at.is_some_and(|t| t + timing.silent <= now);
            // Nobody signed at all: this shard's backups recompute, as for
            // a silent partner. Not every node: a recomputation fetches the
            // shard's slices from its seats, so a thousand nodes doing it
            // would bury slow seats under a payload each.
            let since = r.reseated.or(st.manifest_at);
            let orphan = signed.is_empty() && since.is_some_and(|t| t + timing.silent <= now);
            if disagree {
                r.recompute = true;
            }
            if (orphan || lone) && r.backup {
                r.check = true;
                r.backing = true;
            }
            let due = r.backing || r.accepted.is_some();
            if r.recompute || (r.check && due) {
                // (Not hedged: a recomputation moves a payload's worth.)
                let free = r.verify.out == 0 && r.verify_due.is_none_or(|d| d <= now);
                let local = own.is_some() && st.agg.get(&shard).is_some_and(|a| a.missing == 0);
                let n = seats.len();
                let start = (me as usize + s) % n;
                let pick = (0..n)
                    .map(|k| seats[(start + r.verify.tried + k) % n])
                    .find(|&x| x != me);
                if free && (local || pick.is_some()) {
                    let from = if local { me } else { pick.expect("checked") };
                    r.verify.sent(now, from);
                    r.verify_due = None;
                    self.out.push(Action::Recompute {
                        step,
                        shard,
                        from,
                        manifest,
                    });
                }
            }
            let free = r.ask.out == 0 && r.due.is_none_or(|d| d <= now);
            let asking = self.hedges.may_ask(&r.ask, free, now, sum_hedge);
            if r.recompute {
                // Only the recomputation decides it.
            } else if let Some(h) = own.and_then(|i| signed_for[i]) {
                // This node's own sum.
                r.got = Some(h);
            } else if r.got.is_none()
                && let Some(hedging) = asking
                && (own.is_none() || silent)
            {
                // (An aggregator fetches another seat's sum only when its
                // own is overdue.)
                // A sum only from a seat that has signed one, rotating by
                // node and shard so the seats share the serving; one still
                // unanswered after `hedge` is asked of the next as well.
                let n = seats.len();
                let start = (me as usize + s) % n;
                let signed = (0..n)
                    .map(|k| (start + r.ask.tried + k) % n)
                    .filter(|&i| signed_for[i].is_some())
                    .map(|i| seats[i]);
                // The first request waits `seat_wait` for this node's own
                // seat of the rotation.
                let held = (r.ask.tried == 0 && signed_for[start].is_none())
                    .then_some(r.first_at)
                    .flatten()
                    .map(|t| t + timing.seat_wait)
                    .filter(|&t| now < t);
                if let Some(t) = held {
                    self.timers.insert((t, step, shard));
                } else if let Some(from) = r.ask.next(signed) {
                    r.ask.sent(now, from);
                    self.hedges.sent(hedging);
                    r.due = None;
                    st.sums_out.insert(shard);
                    self.out.push(Action::FetchSum { step, shard, from });
                } else if unheard
                    && !r.blind
                    && !hedging
                    && let Some(from) = r.ask.next(
                        (0..n)
                            .map(|k| seats[(start + r.ask.tried + k) % n])
                            .filter(|&x| x != me),
                    )
                {
                    // No hash of it has come, while the step's others
                    // did: its hashes were likely lost on the way here.
                    r.blind = true;
                    r.ask.sent(now, from);
                    self.hedges.sent(false);
                    r.due = None;
                    st.sums_out.insert(shard);
                    self.out.push(Action::FetchSum { step, shard, from });
                }
            }
            if let Some(t) = r.ask.wake_at(now, sum_hedge)
                && r.got.is_none()
            {
                self.timers.insert((t, step, shard));
            }
            if !r.recompute
                && (all || silent)
                && !disagree
                && r.got.is_some()
                && r.got == signed.first().copied()
            {
                r.accepted = r.got;
            }
        }
        if was.is_none() && r.accepted.is_some() {
            st.accepted_left -= 1;
            // The spot check waiting for it.
            if r.check {
                self.timers.insert((now, step, shard));
            }
        }
        if was.is_some() && r.accepted != was && st.applied {
            st.applied = false;
            self.out.push(Action::Rewind { step });
        }
        if st.accepted_left == 0 && !st.applied {
            st.applied = true;
            self.out.push(Action::Apply { step });
        }
    }
}

mod probe;
#[cfg(test)]
mod tests;
