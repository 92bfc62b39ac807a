//! The sharded exchange's state machine, driven by nodes wired to each
//! other with instant delivery.

use super::*;
use crate::compress::Draw;
use crate::shard;

const TRUE: u8 = 1;
const LIE: u8 = 0xEE;

/// Nodes wired to each other with instant delivery; what they do wrong
/// is set per test.
struct World {
    nodes: Vec<Exchange>,
    now: Duration,
    seats: Vec<Vec<u32>>,
    /// Aggregators that sign and serve a wrong sum.
    liars: BTreeSet<u32>,
    /// Aggregators that never publish nor serve anything.
    silent: BTreeSet<u32>,
    /// Pushes (member, aggregator) that fail.
    lost: BTreeSet<(u32, u32)>,
    /// Pushes (member, shard, aggregator) that vanish, once each: no
    /// answer, no word that they failed (the member learns nothing before
    /// its request deadline, which these tests never reach).
    vanish: BTreeSet<(u32, u32, u32)>,
    /// Pushes held in flight (a member's uplink still busy).
    in_flight: Vec<(u32, Action)>,
    /// Members whose pushes are all held in flight.
    slow_uplinks: BTreeSet<u32>,
    /// Nodes whose answers to slice and sum requests never arrive (nor
    /// does word that they failed): the requests that did so.
    hung: BTreeSet<u32>,
    unanswered: Vec<(u32, Action)>,
    /// Recomputations held back until `release` (slow ones).
    slow_checks: bool,
    held_checks: Vec<(u32, Action)>,
    signed: BTreeMap<(u32, u32), Hash>,
    announced: BTreeSet<u32>,
    applied: BTreeMap<u32, Vec<u32>>,
    /// When each node last applied.
    applied_at: BTreeMap<u32, Duration>,
    rewound: BTreeSet<u32>,
    convicted: BTreeSet<(u32, u32)>,
    pushes: BTreeMap<u32, usize>,
    recomputed: BTreeSet<(u32, u32)>,
    /// Members that announce but push no slice and serve none to seats,
    /// nor to anyone unless `serves_probes`.
    withholding: BTreeSet<u32>,
    serves_probes: bool,
    /// (seat, member) claims that a slice is withheld.
    claims: BTreeSet<(u32, u32)>,
    /// (node, member): given up as withheld; turned up after that.
    withheld: BTreeSet<(u32, u32)>,
    served: BTreeSet<(u32, u32)>,
    /// Slices handed over: (from, to, member).
    forwarded: BTreeSet<(u32, u32, u32)>,
    /// Sum requests as they were sent: (when, asker, shard, seat asked).
    sum_asks: Vec<(Duration, u32, u32, u32)>,
    /// (node, shard): the seats' hashes of that shard never reach that
    /// node by themselves (their requests were lost), only carried by a
    /// sum it fetches.
    deaf: BTreeSet<(u32, u32)>,
}

/// The manifest every test step uses unless it says otherwise.
const M: ManifestId = [0xA0; 32];

fn truth(shard: u32) -> Hash {
    truth_for(shard, M)
}

/// The true sum of `shard` over the members `manifest` lists.
fn truth_for(shard: u32, manifest: ManifestId) -> Hash {
    let mut h = [TRUE.wrapping_add(shard as u8); 32];
    h[0] = manifest[0];
    h
}

impl World {
    fn new(
        n: u32,
        shards: usize,
        r: usize,
        spots: impl Fn(u32) -> BTreeSet<u32>,
        backups: impl Fn(u32) -> BTreeSet<u32>,
    ) -> Self {
        Self::with_reserve(n, shards, r, spots, backups, true)
    }

    fn with_reserve(
        n: u32,
        shards: usize,
        r: usize,
        spots: impl Fn(u32) -> BTreeSet<u32>,
        backups: impl Fn(u32) -> BTreeSet<u32>,
        reserve: bool,
    ) -> Self {
        let members: Vec<u32> = (0..n).collect();
        let seats = shard::aggregators(&members, shards, r, Draw(7)).unwrap();
        let reserve = if reserve {
            shard::reserve(&members, &seats, r, Draw(8))
        } else {
            vec![Vec::new(); shards]
        };
        let nodes = (0..n)
            .map(|i| {
                let mut x = Exchange::new(i, Timing::default());
                x.open(0, seats.clone(), reserve.clone(), &spots(i), &backups(i));
                x
            })
            .collect();
        Self {
            nodes,
            now: Duration::ZERO,
            seats,
            liars: BTreeSet::new(),
            silent: BTreeSet::new(),
            lost: BTreeSet::new(),
            vanish: BTreeSet::new(),
            in_flight: Vec::new(),
            slow_uplinks: BTreeSet::new(),
            hung: BTreeSet::new(),
            unanswered: Vec::new(),
            slow_checks: false,
            held_checks: Vec::new(),
            signed: BTreeMap::new(),
            announced: BTreeSet::new(),
            applied: BTreeMap::new(),
            applied_at: BTreeMap::new(),
            rewound: BTreeSet::new(),
            convicted: BTreeSet::new(),
            pushes: BTreeMap::new(),
            recomputed: BTreeSet::new(),
            withholding: BTreeSet::new(),
            serves_probes: false,
            claims: BTreeSet::new(),
            withheld: BTreeSet::new(),
            served: BTreeSet::new(),
            forwarded: BTreeSet::new(),
            sum_asks: Vec::new(),
            deaf: BTreeSet::new(),
        }
    }

    /// Delivers every action until nothing is left to do now.
    fn settle(&mut self) {
        loop {
            let mut any = false;
            for i in 0..self.nodes.len() as u32 {
                for a in self.nodes[i as usize].poll(self.now) {
                    any = true;
                    self.handle(i, a);
                }
            }
            if !any {
                return;
            }
        }
    }

    /// Runs until no node has anything left, ever.
    fn run(&mut self) {
        for _ in 0..1000 {
            self.settle();
            match self.nodes.iter().filter_map(|x| x.next_deadline()).min() {
                Some(t) => self.now = self.now.max(t),
                None => return,
            }
        }
        panic!("the exchange did not come to rest");
    }

    /// Runs until `end`, for exchanges that keep asking after something.
    fn run_until(&mut self, end: Duration) {
        loop {
            self.settle();
            match self.nodes.iter().filter_map(|x| x.next_deadline()).min() {
                Some(t) if t <= end => self.now = self.now.max(t),
                _ => return,
            }
        }
    }

    /// Whether `from` gives `member`'s slice of `shard` to whoever asks (a
    /// seat's fetch, or a probe).
    fn serves(&self, from: u32, step: u32, shard: u32, member: u32, probe: bool) -> bool {
        if self.silent.contains(&from)
            || (self.withholding.contains(&from) && !(probe && self.serves_probes))
        {
            return false;
        }
        from == member || self.nodes[from as usize].holds(step, shard, member)
    }

    fn handle(&mut self, i: u32, a: Action) {
        let now = self.now;
        if let Action::FetchSum { shard, from, .. } = a {
            self.sum_asks.push((now, i, shard, from));
        }
        if let Action::FetchSlice { from, .. } | Action::FetchSum { from, .. } = a
            && self.hung.contains(&from)
        {
            self.unanswered.push((i, a));
            return;
        }
        if self.slow_checks && matches!(a, Action::Recompute { .. }) {
            self.held_checks.push((i, a));
            return;
        }
        match a {
            Action::Push { step, shard, to } if self.withholding.contains(&i) => {
                self.nodes[i as usize].on_pushed(step, shard, to);
            }
            Action::Push { step, shard, to } => {
                *self.pushes.entry(i).or_default() += 1;
                if self.slow_uplinks.contains(&i) {
                    self.in_flight.push((i, a));
                    return;
                }
                if self.vanish.remove(&(i, shard, to)) {
                    return;
                }
                if self.lost.contains(&(i, to)) {
                    self.nodes[i as usize].on_push_failed(now, step, shard, to);
                } else {
                    self.nodes[to as usize].on_slice(step, shard, i);
                    self.nodes[i as usize].on_pushed(step, shard, to);
                }
            }
            Action::Announce { .. } => {
                self.announced.insert(i);
            }
            Action::FetchSlice {
                step,
                shard,
                member,
                from,
            } => {
                if self.serves(from, step, shard, member, false) {
                    self.nodes[i as usize].on_slice(step, shard, member);
                } else {
                    self.nodes[i as usize].on_slice_failed(now, step, shard, member);
                }
            }
            Action::PublishSum {
                step,
                shard,
                manifest,
            } => {
                if self.silent.contains(&i) {
                    return;
                }
                let h = if self.liars.contains(&i) {
                    [LIE; 32]
                } else {
                    truth_for(shard, manifest)
                };
                self.signed.insert((shard, i), h);
                for (j, x) in self.nodes.iter_mut().enumerate() {
                    if !self.deaf.contains(&(j as u32, shard)) {
                        x.on_sum_hash(now, step, shard, i, manifest, h);
                    }
                }
            }
            // A sum answer carries the signed hashes its server holds.
            Action::FetchSum { step, shard, from } => match self.signed.get(&(shard, from)) {
                Some(&h) => {
                    for (seat, m, x) in self.nodes[from as usize].signed(step, shard) {
                        self.nodes[i as usize].on_sum_hash(now, step, shard, seat, m, x);
                    }
                    self.nodes[i as usize].on_sum(now, step, shard, from, h);
                }
                None => self.nodes[i as usize].on_fetch_failed(now, step, shard),
            },
            Action::Recompute {
                step,
                shard,
                from,
                manifest,
            } => {
                self.recomputed.insert((i, shard));
                if self.silent.contains(&from) && from != i {
                    self.nodes[i as usize].on_recompute_failed(now, step, shard);
                } else {
                    let h = truth_for(shard, manifest);
                    self.nodes[i as usize].on_recomputed(step, shard, manifest, h);
                }
            }
            Action::Convict {
                step,
                shard,
                aggregator,
                manifest,
                ..
            } => {
                self.convicted.insert((i, aggregator));
                // The proof reaches everyone.
                for x in &mut self.nodes {
                    x.on_evidence(step, shard, manifest);
                }
            }
            Action::Apply { step } => {
                self.applied.entry(i).or_default().push(step);
                self.applied_at.insert(i, now);
            }
            Action::ClaimWithheld {
                step,
                shard,
                member,
                manifest,
            } => {
                self.claims.insert((i, member));
                for x in &mut self.nodes {
                    x.on_withheld_claim(step, shard, i, manifest, member);
                }
            }
            Action::Probe {
                step,
                shard,
                member,
                from,
            } => {
                if self.serves(from, step, shard, member, true) {
                    self.nodes[i as usize].on_slice(step, shard, member);
                } else {
                    self.nodes[i as usize].on_probe_failed(now, step, shard, member);
                }
            }
            Action::Forward { .. } if self.withholding.contains(&i) => {}
            Action::Forward {
                step,
                shard,
                member,
                to,
            } => {
                self.forwarded.insert((i, to, member));
                self.nodes[to as usize].on_slice(step, shard, member);
            }
            Action::Withheld { member, .. } => {
                self.withheld.insert((i, member));
            }
            Action::Served { member, .. } => {
                self.served.insert((i, member));
            }
            Action::Rewind { step } => {
                self.rewound.insert(i);
                assert_eq!(self.applied.get_mut(&i).and_then(|v| v.pop()), Some(step));
            }
        }
    }

    /// Every node computes; once all have announced, the manifest lists
    /// them all.
    fn step(&mut self) {
        self.open_step();
        self.run();
    }

    /// Step 0 up to its manifest: every node computed and pushed, the
    /// announced members listed; nothing run after that.
    fn open_step(&mut self) {
        self.compute();
        let members: Vec<u32> = self.announced.iter().copied().collect();
        for x in &mut self.nodes {
            x.on_manifest(self.now, 0, M, &members);
        }
    }

    /// Every node computes step 0 and pushes its slices; nothing after.
    fn compute(&mut self) {
        for x in &mut self.nodes {
            x.on_computed(0);
        }
        self.settle();
    }

    /// A shard `member` does not seat, so its slice must be pushed.
    fn unseated_shard(&self, member: u32) -> u32 {
        (0..self.seats.len() as u32)
            .find(|&s| !self.seats[s as usize].contains(&member))
            .expect("a shard the member does not seat")
    }

    /// Every seat of `shard` signs and serves the same wrong sum.
    fn collude(&mut self, shard: usize) {
        self.liars.extend(self.seats[shard].iter().copied());
    }

    /// Answers the recomputations held back, and runs on.
    fn release(&mut self) {
        self.slow_checks = false;
        for (i, a) in std::mem::take(&mut self.held_checks) {
            self.handle(i, a);
        }
        self.run();
    }

    fn everyone_applied_once(&self) -> bool {
        (0..self.nodes.len() as u32).all(|i| self.applied.get(&i) == Some(&vec![0]))
    }
}

/// The seats `World::new(8, 8, 2, …)` draws.
fn seats8() -> Seats {
    let members: Vec<u32> = (0..8).collect();
    shard::aggregators(&members, 8, 2, Draw(7)).unwrap()
}

fn none(_: u32) -> BTreeSet<u32> {
    BTreeSet::new()
}

/// Shard 0 for node `who`, nothing for the others (a spot check or a
/// backup drawn by one node only).
fn only(who: u32) -> impl Fn(u32) -> BTreeSet<u32> {
    move |i| {
        if i == who {
            BTreeSet::from([0])
        } else {
            BTreeSet::new()
        }
    }
}

#[test]
fn every_node_applies_once_every_seat_of_every_shard_signed_the_same_sum() {
    let mut w = World::new(12, 12, 2, none, none);
    w.step();
    assert_eq!(w.announced.len(), 12);
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.convicted.is_empty() && w.rewound.is_empty());
    // Each member pushes each shard to its aggregators other than itself.
    for (i, n) in &w.pushes {
        let seats: usize = w.seats.iter().flatten().filter(|&&a| a != *i).count();
        assert_eq!(*n, seats);
    }
}

#[test]
fn a_member_announces_only_once_every_shard_reached_an_aggregator() {
    let mut w = World::new(6, 6, 2, none, none);
    // Member 0 loses every push to the seats of shard 1 but its own.
    for &a in &w.seats[1].clone() {
        w.lost.insert((0, a));
    }
    w.compute();
    let shard1_has_0 = w.seats[1].contains(&0);
    assert_eq!(w.announced.contains(&0), shard1_has_0);
    assert_eq!(w.announced.len(), if shard1_has_0 { 6 } else { 5 });
    // Once one push gets through, on a retry, it announces.
    let a = w.seats[1][0];
    w.lost.remove(&(0, a));
    w.now += Timing::default().retry;
    w.settle();
    assert!(w.announced.contains(&0));
}

#[test]
fn an_aggregator_fetches_a_listed_slice_that_was_never_pushed_to_it() {
    let mut w = World::new(8, 8, 3, none, none);
    // Every push from member 5 to aggregator `a` is lost; the shards'
    // other seats get theirs, so 5 announces and is listed.
    let a = (0..8).find(|&a| a != 5).unwrap();
    w.lost.insert((5, a));
    w.step();
    assert!(w.announced.contains(&5));
    assert!(w.seats.iter().any(|s| s.contains(&a) && !s.contains(&5)));
    assert!(w.everyone_applied_once());
    assert!(w.convicted.is_empty());
}

#[test]
fn a_lying_aggregator_is_convicted_and_every_node_applies_the_true_sums() {
    let mut w = World::new(10, 10, 2, none, none);
    w.liars.insert(3);
    w.step();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    let convicts: BTreeSet<u32> = w.convicted.iter().map(|c| c.1).collect();
    assert_eq!(convicts, BTreeSet::from([3]));
    // Nobody applied the lie: nothing had to be rewound.
    assert!(w.rewound.is_empty());
}

#[test]
fn at_the_plan_s_one_shard_per_two_members_a_liar_is_convicted_and_a_silent_seat_only_delays() {
    for n in [10u32, 11] {
        let shards = (n as usize).div_ceil(super::Plan::MEMBERS_PER_SHARD);
        let mut w = World::new(n, shards, 2, none, none);
        // Every member holds a seat (one, or two for one member when the
        // count is odd).
        let held: BTreeSet<u32> = w.seats.iter().flatten().copied().collect();
        assert_eq!(held.len(), n as usize);
        w.liars.insert(3);
        w.step();
        assert!(w.everyone_applied_once(), "{n}: {:?}", w.applied);
        let convicts: BTreeSet<u32> = w.convicted.iter().map(|c| c.1).collect();
        assert_eq!(convicts, BTreeSet::from([3]), "{n}");
        assert!(w.rewound.is_empty());

        let mut w = World::new(n, shards, 2, none, none);
        w.silent.insert(2);
        w.step();
        assert!(w.everyone_applied_once(), "{n}: {:?}", w.applied);
        assert!(w.convicted.is_empty() && w.rewound.is_empty());
    }
}

#[test]
fn a_silent_aggregator_delays_its_shards_but_does_not_stall_the_step() {
    let mut w = World::new(8, 8, 2, none, none);
    w.silent.insert(2);
    w.step();
    assert!(w.everyone_applied_once());
    // Silence is not proof: nobody is convicted, and nobody paid for a
    // recomputation it was not drawn for.
    assert!(w.convicted.is_empty() && w.rewound.is_empty());
    assert!(w.recomputed.is_empty());
    assert!(w.now >= Timing::default().agree);
}

/// Every sum request of a step with seat 2 silent, each node holding its
/// first request `seat_wait` for its own seat of the rotation.
fn sum_asks_with_a_silent_seat(seat_wait: Duration) -> (World, u32) {
    let mut w = World::new(8, 8, 2, none, none);
    for x in &mut w.nodes {
        x.timing.seat_wait = seat_wait;
    }
    let silent = 2;
    w.silent.insert(silent);
    w.step();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    (w, silent)
}

#[test]
fn a_node_holds_its_first_sum_request_for_its_own_seat_then_asks_the_one_that_signed() {
    let wait = Duration::from_secs(3);
    let (w, silent) = sum_asks_with_a_silent_seat(wait);
    // The seats sign at once: the first requests go out then.
    let t0 = w.sum_asks.iter().map(|a| a.0).min().unwrap();
    let (mut held, mut straight) = (0, 0);
    for &(at, node, shard, from) in &w.sum_asks {
        assert_ne!(from, silent, "only a seat that signed is asked");
        let seats = &w.seats[shard as usize];
        // The rotation's seat for this node and shard (`Exchange::look`).
        let own = seats[(node as usize + shard as usize) % seats.len()];
        if own == silent && node != silent {
            assert!(
                at >= t0 + wait,
                "node {node} asked for shard {shard} at {at:?}"
            );
            held += 1;
        } else if !seats.contains(&node) {
            assert_eq!(at, t0, "node {node}, shard {shard}");
            straight += 1;
        }
    }
    assert!(held > 0 && straight > 0, "{held} held, {straight} straight");
    // Not held, the same requests go out at once to the seat that signed.
    let (w, silent) = sum_asks_with_a_silent_seat(Duration::ZERO);
    let t0 = w.sum_asks.iter().map(|a| a.0).min().unwrap();
    let late: Vec<_> = w.sum_asks.iter().filter(|a| a.0 != t0).collect();
    assert!(late.iter().all(|a| a.1 == silent), "{late:?}");
}

#[test]
fn a_node_that_lost_both_seats_hashes_of_a_shard_asks_a_seat_once_the_others_came() {
    // A node never hears shard 0's hashes (both requests lost on the way):
    // it knows of no seat that signed, so it would ask none, and wait for
    // reserve seats that never take the shard over.
    let mut w = World::new(8, 8, 2, none, none);
    let shard = 0;
    let deaf = (0..8)
        .find(|i| !w.seats[shard as usize].contains(i))
        .unwrap();
    w.deaf.insert((deaf, shard));
    w.step();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert_eq!(
        w.nodes[deaf as usize].accepted(0, shard),
        Some(truth(shard))
    );
    // Asked once the step's other hashes stopped coming (a few home round
    // trips later), from a seat, without a hash: the answer carried both.
    let asks: Vec<_> = w
        .sum_asks
        .iter()
        .filter(|a| a.1 == deaf && a.2 == shard)
        .collect();
    assert_eq!(asks.len(), 1, "{asks:?}");
    assert!(w.seats[shard as usize].contains(&asks[0].3));
    let others = w.sum_asks.iter().map(|a| a.0).min().unwrap();
    assert!(asks[0].0 >= others + STALL_FLOOR, "{asks:?}");
    assert!(w.applied_at[&deaf] < Timing::default().agree);
    // Nobody else asked a seat before it signed.
    assert!(
        w.sum_asks
            .iter()
            .all(|a| a.1 == deaf || w.signed.contains_key(&(a.2, a.3))),
        "{:?}",
        w.sum_asks
    );
}

#[test]
fn a_hedge_waits_for_most_answers_to_come_as_they_have_been_coming() {
    let floor = Duration::from_secs(4);
    let mut t = AnswerTime::default();
    // Nothing measured yet, or quick answers: the floor.
    assert_eq!(t.hedge(floor), floor);
    for _ in 0..20 {
        t.observe(Duration::from_millis(300));
    }
    assert_eq!(t.hedge(floor), floor);
    // Seats whose uplinks are full answer in 5 to 7 s: a hedge at 4 s
    // would double their load; it waits past nearly all of them.
    for i in 0..40 {
        t.observe(Duration::from_secs(5 + i % 3));
    }
    assert!(
        t.hedge(floor) > Duration::from_secs(7),
        "{:?}",
        t.hedge(floor)
    );
    assert!(
        t.hedge(floor) < Duration::from_secs(20),
        "{:?}",
        t.hedge(floor)
    );
}

/// When the last node applies step 0 with `shards` shards, seat `hung`
/// signing its sums while its answers are lost on the way (no failure is
/// ever reported), and every node's hedge delay `hedge`.
fn applied_with_a_hung_seat(shards: usize, hedge: Duration) -> Duration {
    let mut w = World::new(8, shards, 2, none, none);
    for x in &mut w.nodes {
        x.timing.hedge = hedge;
    }
    let hung = w.seats[0][0];
    w.hung.insert(hung);
    w.step();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.convicted.is_empty() && w.recomputed.is_empty());
    let asked_hung = w
        .unanswered
        .iter()
        .any(|(_, a)| matches!(a, Action::FetchSum { .. }));
    assert!(asked_hung, "somebody asked the hung seat first");
    w.applied_at.values().copied().max().unwrap()
}

#[test]
fn a_few_sum_requests_left_once_the_rest_came_go_to_the_other_seat_after_a_short_stall() {
    // Eight shards: a node asks the hung seat for a sum or two (at most
    // two are "a few" in a small job), and every other answer came at
    // once. Those are lost, not slow: they go to the other seat
    // `STALL_FLOOR` later, whatever the hedge delay.
    let hedge = Timing::default().hedge;
    assert_eq!(applied_with_a_hung_seat(8, hedge), STALL_FLOOR);
    let hour = Duration::from_secs(3600);
    assert_eq!(applied_with_a_hung_seat(8, hour), STALL_FLOOR);
}

#[test]
fn many_unanswered_sum_requests_hold_their_asker_for_the_hedge_delay_only() {
    // 128 shards: a node asks the hung seat for about 16 sums, more than
    // one in twenty, so they may be merely slow; the other seat is asked
    // `hedge` after the first request (made at once: the sums are signed
    // as the manifest arrives).
    let hedge = Timing::default().hedge;
    assert_eq!(applied_with_a_hung_seat(128, hedge), hedge);
    // Without the hedge the asker would wait as long as its requests do:
    // here, for ever; on the wire, their deadline.
    let hour = Duration::from_secs(3600);
    assert_eq!(applied_with_a_hung_seat(128, hour), hour);
}

#[test]
fn a_stall_takes_the_few_requests_left_for_lost_after_the_floor_or_a_share_of_the_time_the_batch_took()
 {
    let s = |x: u64| Duration::from_secs(x);
    let mut w = Stall::default();
    assert!(w.watch(s(10), 2000));
    // Many left: none is taken for lost, however long.
    assert_eq!(w.due(100, 0.25), None);
    // Answers came for 4 s, then stopped with 3 left: lost a second
    // later (a quarter of 4 s).
    assert!(w.watch(s(14), 3));
    assert!(!w.watch(s(14), 3));
    assert_eq!(w.due(100, 0.25), Some(s(15)));
    // As shipped (no share), the floor alone: a few round trips.
    assert_eq!(Timing::default().stall_share, 0.0);
    assert_eq!(
        w.due(100, Timing::default().stall_share),
        Some(s(14) + STALL_FLOOR)
    );
    // Asked again at 15: the next look is as long again.
    w.again(s(15));
    assert_eq!(w.due(100, 0.25), Some(s(15) + Duration::from_millis(1250)));
    // A batch answered at once waits the floor, above a round trip.
    let mut quick = Stall::default();
    quick.watch(s(1), 10);
    quick.watch(s(1), 1);
    assert_eq!(quick.due(5, 0.25), Some(s(1) + STALL_FLOOR));
    // All answered: nothing is due.
    quick.watch(s(2), 0);
    assert_eq!(quick.due(5, 0.25), None);
}

#[test]
fn a_node_whose_seats_all_answer_slowly_hedges_a_twentieth_of_its_requests_beyond_its_saved_ones() {
    // Every seat's answers are late (here: never come), as when every
    // uplink is merely full. Hedging each request would only add to the
    // load that made them late.
    let shards = 256;
    let mut w = World::new(8, shards, 2, none, none);
    w.hung.extend(0..8);
    w.open_step();
    w.run_until(Duration::from_secs(60));
    for i in 0..8u32 {
        let asked = w
            .unanswered
            .iter()
            .filter(|(n, a)| *n == i && matches!(a, Action::FetchSum { .. }))
            .count();
        // One first request per shard it does not sit on, and hedges
        // within the budget.
        let own = w.seats.iter().filter(|s| s.contains(&i)).count();
        let first = shards - own;
        let hedges = asked - first;
        assert!(
            hedges as f64 <= HEDGE_BURST + HEDGE_SHARE * first as f64 + 1.0,
            "node {i}: {hedges} hedges for {first} requests"
        );
        assert!(hedges >= HEDGE_BURST as usize, "node {i}: {hedges} hedges");
    }
}

#[test]
fn a_seat_whose_one_slice_request_goes_unanswered_asks_the_other_seat_after_a_short_stall() {
    let seats = seats8();
    let [a, b] = [seats[0][0], seats[0][1]];
    // A member that is no seat of shard 0: its push to `b` fails, and
    // it never answers `b`'s request for the slice; `a` holds it.
    let m = (0..8).find(|i| !seats[0].contains(i)).unwrap();
    let mut w = World::new(8, 8, 2, none, none);
    w.lost.insert((m, b));
    w.hung.insert(m);
    w.step();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.unanswered.iter().any(
        |(i, x)| *i == b && matches!(x, Action::FetchSlice { member, .. } if *member == m)
    ));
    // `b` got the slice from `a` and signed: its shard was not left to
    // `a` alone.
    assert_eq!(w.signed.get(&(0, b)), Some(&truth(0)));
    assert_eq!(w.signed.get(&(0, a)), Some(&truth(0)));
    // It asked `a` as soon as its one request (a few, in a small job) had
    // stood unanswered for `STALL_FLOOR`, not the hedge delay: everyone
    // applied then.
    let last = w.applied_at.values().copied().max().unwrap();
    assert_eq!(last, Timing::default().wait + STALL_FLOOR);
}

#[test]
fn a_liar_whose_partner_is_silent_is_caught_by_a_backup_check() {
    let seats = seats8();
    let (liar, mute) = (seats[0][0], seats[0][1]);
    let checker = (0..8).find(|i| !seats[0].contains(i)).unwrap();
    let backup = only(checker);
    let mut w = World::new(8, 8, 2, none, backup);
    w.liars.insert(liar);
    w.silent.insert(mute);
    w.step();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.convicted.contains(&(checker, liar)));
    assert!(!w.convicted.iter().any(|c| c.1 == mute));
    for x in &w.nodes {
        assert_eq!(x.accepted(0, 0), Some(truth(0)));
    }
}

#[test]
fn a_partner_that_signs_a_few_seconds_late_sets_no_backup_recomputing_its_shard() {
    // With thousands of seats a step some partner is always late; its hash
    // checks the first as well as a recomputation would.
    let seats = seats8();
    let late = seats[0][1];
    let checker = (0..8).find(|i| !seats[0].contains(i)).unwrap();
    let mut w = World::new(8, 8, 2, none, only(checker));
    w.silent.insert(late);
    w.open_step();
    let timing = Timing::default();
    let signs_at = timing.agree + (timing.silent - timing.agree) / 2;
    w.run_until(signs_at);
    // Taken at the first seat's word meanwhile, and not recomputed.
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(!w.recomputed.contains(&(checker, 0)));
    // The late seat signs the same sum.
    w.now = signs_at;
    w.silent.remove(&late);
    w.signed.insert((0, late), truth(0));
    for x in &mut w.nodes {
        x.on_sum_hash(signs_at, 0, 0, late, M, truth(0));
    }
    w.run();
    assert!(!w.recomputed.contains(&(checker, 0)), "a backup recomputed");
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.rewound.is_empty() && w.convicted.is_empty());
}

#[test]
fn a_spot_check_starts_once_the_shard_s_sum_is_taken_not_before() {
    // Before, every spot check went out with the manifest: on the seats'
    // uplinks beside the sums the step waits for, and done again whenever
    // a better manifest replaced the first.
    let seats = seats8();
    let spotter = (0..8).find(|i| !seats[0].contains(i)).unwrap();
    let mut w = World::new(8, 8, 2, only(spotter), none);
    // Shard 0 is taken `agree` after its one hash.
    w.silent.insert(seats[0][1]);
    w.open_step();
    let timing = Timing::default();
    w.run_until(timing.agree / 2);
    assert_eq!(w.nodes[spotter as usize].accepted(0, 0), None);
    assert!(
        !w.recomputed.contains(&(spotter, 0)),
        "checked before taking"
    );
    w.run();
    assert_eq!(w.nodes[spotter as usize].accepted(0, 0), Some(truth(0)));
    assert!(w.recomputed.contains(&(spotter, 0)), "never checked");
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
}

#[test]
fn without_a_backup_a_liar_whose_partner_is_silent_goes_unnoticed() {
    // Why backups exist: the attack above succeeds without one.
    let seats = seats8();
    let mut w = World::new(8, 8, 2, none, none);
    w.liars.insert(seats[0][0]);
    w.silent.insert(seats[0][1]);
    w.step();
    assert!(w.everyone_applied_once());
    assert!(w.convicted.is_empty());
    assert!(w.nodes.iter().all(|x| x.accepted(0, 0) == Some([LIE; 32])));
}

#[test]
fn all_seats_of_a_shard_lying_together_are_caught_by_a_spot_check_and_everyone_ends_on_the_truth() {
    // Shard 0's two aggregators lie together; only node `spotter`
    // recomputes shard 0 on its own.
    let seats = seats8();
    let spotter = (0..8).find(|i| !seats[0].contains(i)).unwrap();
    let spot = only(spotter);
    let mut w = World::new(8, 8, 2, spot, none);
    w.collude(0);
    w.step();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    let convicts: BTreeSet<u32> = w.convicted.iter().map(|c| c.1).collect();
    assert_eq!(convicts, seats[0].iter().copied().collect());
    assert!(w.convicted.iter().any(|c| c.0 == spotter));
    // Every node ends on the true sum, whether it had applied the lie
    // (and rewound) or heard the evidence first.
    for x in &w.nodes {
        assert_eq!(x.accepted(0, 0), Some(truth(0)));
    }
}

#[test]
fn a_spot_check_runs_beside_acceptance_and_a_lie_it_finds_later_is_rewound() {
    let seats = seats8();
    let spotter = (0..8).find(|i| !seats[0].contains(i)).unwrap();
    let mut w = World::new(8, 8, 2, only(spotter), none);
    w.collude(0);
    // The check is slow: the spotter applies the seats' agreed sum
    // without waiting for it, like everyone else.
    w.slow_checks = true;
    w.step();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert_eq!(w.held_checks.len(), 1);
    assert_eq!(w.nodes[spotter as usize].accepted(0, 0), Some([LIE; 32]));
    // It comes back: the liars are convicted, and every node goes back
    // and applies the truth.
    w.release();
    let convicts: BTreeSet<u32> = w.convicted.iter().map(|c| c.1).collect();
    assert_eq!(convicts, seats[0].iter().copied().collect());
    assert!(w.rewound.contains(&spotter));
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    for x in &w.nodes {
        assert_eq!(x.accepted(0, 0), Some(truth(0)));
    }
}

#[test]
fn a_shard_proven_false_elsewhere_is_accepted_only_from_a_recomputation() {
    // Evidence (unlike a spot check) blocks the shard: a node told
    // that a seat lied does not take the seats' word meanwhile.
    let mut w = World::new(8, 8, 2, none, none);
    w.collude(0);
    w.slow_checks = true;
    w.compute();
    let listed: Vec<u32> = w.announced.iter().copied().collect();
    for x in &mut w.nodes {
        x.on_manifest(w.now, 0, M, &listed);
        assert_eq!(x.on_evidence(0, 0, M), Verdict::Accepted);
    }
    w.run();
    assert!(w.applied.is_empty(), "{:?}", w.applied);
    w.release();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.rewound.is_empty());
    for x in &w.nodes {
        assert_eq!(x.accepted(0, 0), Some(truth(0)));
    }
}

#[test]
fn without_spot_checks_colluding_seats_go_unnoticed() {
    // The reason spot checks exist: the attack above succeeds without them.
    let mut w = World::new(8, 8, 2, none, none);
    w.collude(0);
    w.step();
    assert!(w.everyone_applied_once());
    assert!(w.convicted.is_empty());
    assert!(w.nodes.iter().all(|x| x.accepted(0, 0) == Some([LIE; 32])));
}

#[test]
fn a_shard_whose_seats_are_all_silent_is_recomputed_by_its_backups_not_by_every_node() {
    // Every recomputation fetches the shard's slices from its seats: had
    // every node recomputed a shard none of whose seats signed, two
    // silent seats would bring the whole job down on themselves (at
    // 1,000 members, a payload's worth from each of 1,000 nodes).
    let seats = seats8();
    let backup = (0..8).find(|i| !seats[0].contains(i)).unwrap();
    let backups = only(backup);
    let mut w = World::new(8, 8, 2, none, backups);
    for &a in &seats[0] {
        w.silent.insert(a);
    }
    w.compute();
    let members: Vec<u32> = w.announced.iter().copied().collect();
    assert_eq!(members.len(), 8);
    for x in &mut w.nodes {
        x.on_manifest(w.now, 0, M, &members);
    }
    let t = Timing::default();
    let until = t.silent + t.agree * 2;
    while w.now < until {
        w.settle();
        w.now += t.retry;
    }
    let on_shard0: BTreeSet<u32> = w
        .recomputed
        .iter()
        .filter(|r| r.1 == 0)
        .map(|r| r.0)
        .collect();
    assert_eq!(on_shard0, BTreeSet::from([backup]));
    // Nobody takes a sum nobody signed.
    assert!(w.nodes.iter().all(|x| x.accepted(0, 0).is_none()));
}

#[test]
fn a_seat_that_summed_an_outranked_manifest_is_not_convicted_and_every_node_ends_on_the_better_one()
{
    // A step can have two manifests for a while: a fall-back leader's,
    // then the late leader's, which outranks it. A seat that summed the
    // first signed a hash the second's slices do not give. Before sums
    // named their manifest, every other node took that for a lie and
    // convicted an honest seat (as
    // `a_lying_aggregator_is_convicted_and_every_node_applies_the_true_sums`
    // convicts any seat whose hash differs).
    let mut w = World::new(8, 8, 2, none, none);
    let x = w.seats[0][0];
    for n in &mut w.nodes {
        n.on_computed(0);
    }
    w.settle();
    let all: Vec<u32> = w.announced.iter().copied().collect();
    assert_eq!(all.len(), 8);
    let (first, better) = ([0xA1; 32], [0xA2; 32]);
    let fewer: Vec<u32> = all.iter().copied().filter(|&m| m != 7).collect();
    // The fall-back's manifest reaches seat x first and alone...
    w.nodes[x as usize].on_manifest(w.now, 0, first, &all);
    w.settle();
    // ...the outranking one everyone else, and x only much later.
    for i in (0..8).filter(|&i| i != x) {
        w.nodes[i as usize].on_manifest(w.now, 0, better, &fewer);
    }
    w.now += Timing::default().agree;
    w.settle();
    w.nodes[x as usize].on_manifest(w.now, 0, better, &fewer);
    w.run();
    assert!(w.convicted.is_empty(), "{:?}", w.convicted);
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    for n in &w.nodes {
        for s in 0..8 {
            assert_eq!(n.accepted(0, s), Some(truth_for(s, better)));
        }
    }
    assert_eq!(
        w.nodes[0].on_manifest(w.now, 0, better, &fewer),
        Verdict::Duplicate
    );
}

#[test]
fn a_step_applied_under_a_manifest_that_is_then_outranked_is_rewound_and_applied_again() {
    let mut w = World::new(8, 8, 2, none, none);
    w.step();
    assert!(w.everyone_applied_once());
    let better = [0xA2; 32];
    let fewer: Vec<u32> = (0..7).collect();
    for x in &mut w.nodes {
        x.on_manifest(w.now, 0, better, &fewer);
    }
    w.run();
    assert_eq!(w.rewound.len(), 8);
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.convicted.is_empty(), "{:?}", w.convicted);
    for n in &w.nodes {
        for s in 0..8 {
            assert_eq!(n.accepted(0, s), Some(truth_for(s, better)));
        }
    }
}

#[test]
fn a_sum_hash_for_another_manifest_is_kept_apart_and_cannot_outvote_the_current_one() {
    let mut w = World::new(4, 4, 2, none, none);
    let seat = w.seats[0][0];
    let x = &mut w.nodes[(seat + 1) as usize % 4];
    x.on_manifest(Duration::ZERO, 0, M, &[0, 1, 2, 3]);
    assert_eq!(
        x.on_sum_hash(Duration::ZERO, 0, 0, seat, [0xBB; 32], [LIE; 32]),
        Verdict::OtherManifest
    );
    assert_eq!(
        x.on_sum_hash(Duration::ZERO, 0, 0, seat, M, truth(0)),
        Verdict::Accepted
    );
    // A second hash for the same manifest is an equivocation: the
    // first stands.
    assert_eq!(
        x.on_sum_hash(Duration::ZERO, 0, 0, seat, M, [LIE; 32]),
        Verdict::Duplicate
    );
    // Recomputations and evidence about another manifest change nothing.
    assert_eq!(
        x.on_recomputed(0, 0, [0xBB; 32], [LIE; 32]),
        Verdict::OtherManifest
    );
    assert_eq!(x.on_evidence(0, 0, [0xBB; 32]), Verdict::OtherManifest);
}

/// Shard 0's two seats die after the step's payloads are computed
/// (they contribute nothing); the others compute, are listed, and run
/// until nothing is left to do.
fn dead_seats(reserve: bool) -> (World, Vec<u32>) {
    let w = World::with_reserve(8, 8, 2, none, none, reserve);
    let dead = w.seats[0].clone();
    run_with_dead(w, &dead)
}

/// `dead` die after the step's payloads are computed (they contribute
/// nothing); the others compute, are listed, and run for ten times
/// `reseat` (a node keeps asking a shard it heard nothing of, every
/// `silent`). Returns the world and the members alive.
fn run_with_dead(mut w: World, dead: &[u32]) -> (World, Vec<u32>) {
    let n = w.nodes.len() as u32;
    for &a in dead {
        w.silent.insert(a);
    }
    let alive: Vec<u32> = (0..n).filter(|i| !dead.contains(i)).collect();
    for &i in &alive {
        w.nodes[i as usize].on_computed(0);
    }
    w.settle();
    let listed: Vec<u32> = w.announced.iter().copied().collect();
    assert_eq!(listed, alive);
    for &i in &alive {
        w.nodes[i as usize].on_manifest(w.now, 0, M, &listed);
    }
    w.run_until(10 * Timing::default().reseat);
    (w, alive)
}

#[test]
fn without_reserve_seats_a_shard_whose_seats_are_all_dead_stalls_the_step() {
    // Why reserve seats exist: nobody can sum shard 0, so nobody applies.
    let (w, alive) = dead_seats(false);
    assert!(
        alive.iter().all(|i| !w.applied.contains_key(i)),
        "{:?}",
        w.applied
    );
}

#[test]
fn a_shard_whose_seats_are_all_dead_goes_to_its_reserve_seats_and_the_step_applies() {
    let (w, alive) = dead_seats(true);
    for i in &alive {
        assert_eq!(w.applied.get(i), Some(&vec![0]), "{:?}", w.applied);
        assert_eq!(w.nodes[*i as usize].accepted(0, 0), Some(truth(0)));
    }
    // Only after `reseat`, and nobody convicted: silence is not proof.
    assert!(w.now >= Timing::default().reseat);
    assert!(w.convicted.is_empty());
    // Its first round of reserve seats summed it, and no later round was
    // called on.
    let reserve = shard::reserve(&(0..8).collect::<Vec<u32>>(), &w.seats, 2, Draw(8));
    for a in &reserve[0][..2] {
        assert_eq!(w.signed.get(&(0, *a)), Some(&truth(0)));
    }
    for a in &reserve[0][2..] {
        assert_eq!(w.signed.get(&(0, *a)), None);
    }
}

#[test]
fn a_shard_whose_seats_and_first_reserve_seats_are_all_dead_goes_to_the_next_reserve_seats() {
    // Shard 0's seats die, and so do the two reserve seats it would go to
    // first: the step used to stall for good.
    let w = World::with_reserve(10, 10, 2, none, none, true);
    let members: Vec<u32> = (0..10).collect();
    let reserve = shard::reserve(&members, &w.seats, 2, Draw(8));
    let dead: Vec<u32> = w.seats[0].iter().chain(&reserve[0][..2]).copied().collect();
    let (w, alive) = run_with_dead(w, &dead);
    for i in &alive {
        assert_eq!(w.applied.get(i), Some(&vec![0]), "{:?}", w.applied);
        assert_eq!(w.nodes[*i as usize].accepted(0, 0), Some(truth(0)));
    }
    // The second round summed it, after two reseat periods; silence
    // convicted nobody.
    assert!(reserve[0].len() >= 4, "{:?}", reserve[0]);
    for a in &reserve[0][2..4] {
        assert_eq!(w.signed.get(&(0, *a)), Some(&truth(0)));
    }
    assert!(w.now >= Timing::default().reseat * 2);
    assert!(w.convicted.is_empty());
}

#[test]
fn a_reserve_seat_cannot_take_a_shard_over_before_its_seats_are_overdue() {
    let mut w = World::new(8, 8, 2, none, none);
    let members: Vec<u32> = (0..8).collect();
    let reserve = shard::reserve(&members, &w.seats, 2, Draw(8));
    let r0 = reserve[0][0];
    w.compute();
    for x in &mut w.nodes {
        x.on_manifest(w.now, 0, M, &members);
    }
    // At once, a reserve seat of shard 0 signs a sum for it: kept, not
    // acted on.
    for x in &mut w.nodes {
        assert_eq!(
            x.on_sum_hash(w.now, 0, 0, r0, M, [LIE; 32]),
            Verdict::Accepted
        );
    }
    w.run();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    // The seats' true sum stands; the reserve seat's hash never
    // counted (it would have disagreed with its partner's).
    for x in &w.nodes {
        assert_eq!(x.accepted(0, 0), Some(truth(0)));
    }
    assert!(w.convicted.is_empty() && w.rewound.is_empty());
}

#[test]
fn a_reserve_seat_cannot_move_a_shard_already_decided() {
    // (A review's case: a shard accepted at once, then a reserve seat's
    // hash near the reseat deadline moved it, counted it twice and let
    // the reserve seat's sum replace the agreed one without a rewind.)
    let mut w = World::new(8, 8, 2, none, none);
    w.step();
    assert!(w.everyone_applied_once());
    let members: Vec<u32> = (0..8).collect();
    let reserve = shard::reserve(&members, &w.seats, 2, Draw(8));
    let late = Timing::default().reseat;
    for x in &mut w.nodes {
        x.on_sum_hash(late, 0, 0, reserve[0][0], M, [LIE; 32]);
    }
    w.now = w.now.max(late);
    w.run();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.rewound.is_empty() && w.convicted.is_empty());
    for x in &w.nodes {
        assert_eq!(x.accepted(0, 0), Some(truth(0)));
    }
}

#[test]
fn inputs_for_unknown_steps_or_seats_change_nothing() {
    // (No reserve seats: with four members every outsider is one.)
    let mut w = World::with_reserve(4, 4, 2, none, none, false);
    let outsider = (0..4).find(|i| !w.seats[0].contains(i)).unwrap();
    let x = &mut w.nodes[0];
    assert_eq!(x.on_slice(9, 0, 1), Verdict::UnknownStep);
    assert_eq!(
        x.on_sum_hash(Duration::ZERO, 0, 0, outsider, M, [5; 32]),
        Verdict::NotASeat
    );
    assert_eq!(
        x.on_sum(Duration::ZERO, 0, 99, 0, [5; 32]),
        Verdict::NotASeat
    );
    assert_eq!(x.on_computed(0), Verdict::Accepted);
    assert_eq!(x.on_computed(0), Verdict::Duplicate);
}

/// Every node computes and announces (the withholders too, without
/// pushing); the manifest lists them all.
fn listed_all(w: &mut World) -> Vec<u32> {
    w.compute();
    let members: Vec<u32> = w.announced.iter().copied().collect();
    assert_eq!(members.len(), w.nodes.len(), "the withholders announce too");
    for x in &mut w.nodes {
        x.on_manifest(w.now, 0, M, &members);
    }
    members
}

/// `n` members, all listed, member 3 announcing but serving its slices
/// only to probes (if `serves_probes`) or to nobody; two minutes run.
fn member_3_withholds(n: u32, serves_probes: bool) -> (World, Vec<u32>) {
    let mut w = World::new(n, n as usize, 2, none, none);
    w.withholding.insert(3);
    w.serves_probes = serves_probes;
    let members = listed_all(&mut w);
    w.run_until(Duration::from_secs(120));
    (w, members)
}

#[test]
fn a_listed_member_whose_slices_nobody_serves_is_given_up_everywhere_and_the_replacement_applies() {
    let (mut w, members) = member_3_withholds(8, false);
    // (The withholder's own machine, which holds its slices, may go on.)
    assert!(
        w.applied.keys().all(|&i| i == 3),
        "a step applied without member 3's slices: {:?}",
        w.applied
    );
    // Seats claimed it withheld, and every other node then failed to get
    // a slice of its own and gave it up.
    assert!(!w.claims.is_empty());
    assert!(w.claims.iter().all(|c| c.1 == 3));
    let gave_up: BTreeSet<u32> = w.withheld.iter().map(|x| x.0).collect();
    assert_eq!(gave_up, (0..8).filter(|&i| i != 3).collect());
    assert!(w.served.is_empty());
    // The step machine's fall-back manifest leaves it out: every node
    // applies that.
    let without: Vec<u32> = members.into_iter().filter(|&m| m != 3).collect();
    let m2 = [0xB0; 32];
    for x in &mut w.nodes {
        x.on_manifest(w.now, 0, m2, &without);
    }
    w.run_until(w.now + Duration::from_secs(60));
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert!(w.convicted.is_empty());
}

#[test]
fn a_withholder_given_up_does_not_keep_the_fall_back_manifest_s_shards_from_their_reserve_seats() {
    // (A review's case: a look for a withheld slice that never resolved
    // blocked reserve seats for good, even once the fall-back manifest
    // had left the withholder out.)
    let (mut w, members) = member_3_withholds(10, false);
    let gave_up: BTreeSet<u32> = w.withheld.iter().map(|x| x.0).collect();
    assert!(gave_up.contains(&0), "{:?}", w.withheld);
    // Then both seats of a shard the withholder does not sit on die, and
    // the fall-back manifest lists neither them nor the withholder.
    let s = (0..10u32)
        .find(|&s| !w.seats[s as usize].contains(&3))
        .unwrap();
    let dead = w.seats[s as usize].clone();
    for &a in &dead {
        w.silent.insert(a);
    }
    let without: Vec<u32> = members
        .into_iter()
        .filter(|m| *m != 3 && !dead.contains(m))
        .collect();
    let m2 = [0xB0; 32];
    for &i in &without {
        w.nodes[i as usize].on_manifest(w.now, 0, m2, &without);
    }
    w.run_until(w.now + Duration::from_secs(200));
    for &i in &without {
        assert!(
            w.applied.get(&i).is_some_and(|a| a.contains(&0)),
            "{i}: {:?}",
            w.applied
        );
        assert_eq!(w.nodes[i as usize].accepted(0, s), Some(truth_for(s, m2)));
    }
}

#[test]
fn a_member_serving_everyone_but_the_seats_has_its_slice_handed_to_them() {
    let (w, _) = member_3_withholds(8, true);
    assert!(!w.claims.is_empty());
    // Nodes got the slice the seats could not, and handed it over.
    for &(seat, _) in &w.claims {
        assert!(
            w.forwarded.iter().any(|f| f.1 == seat && f.2 == 3),
            "{:?} {:?}",
            w.claims,
            w.forwarded
        );
    }
    assert!(w.withheld.is_empty(), "{:?}", w.withheld);
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
}

#[test]
fn a_seat_s_claim_that_an_honest_member_withholds_its_slice_drops_nobody() {
    // Twelve members, so that some are neither a seat of shard 0 nor one
    // of its eight reserve seats.
    let mut w = World::new(12, 12, 2, none, none);
    w.open_step();
    // A seat of shard 0 claims, of every member, that nobody serves it.
    let liar = w.seats[0][0];
    for m in 0..12 {
        for x in &mut w.nodes {
            x.on_withheld_claim(0, 0, liar, M, m);
        }
    }
    // A claim from no seat of the shard, or about no listed member, is
    // refused.
    let outsider = (0..12)
        .find(|i| !w.seats[0].contains(i) && !w.nodes[0].steps[&0].reserve[0].contains(i))
        .unwrap();
    assert_eq!(
        w.nodes[0].on_withheld_claim(0, 0, outsider, M, 1),
        Verdict::NotASeat
    );
    assert_eq!(
        w.nodes[0].on_withheld_claim(0, 0, liar, M, 99),
        Verdict::NotListed
    );
    assert_eq!(
        w.nodes[0].on_withheld_claim(0, 0, liar, [0xC0; 32], 1),
        Verdict::OtherManifest
    );
    w.run_until(Duration::from_secs(120));
    assert!(w.withheld.is_empty(), "{:?}", w.withheld);
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    // Each node looked once per member and handed the liar what it got.
    assert!(w.forwarded.iter().all(|f| f.1 == liar));
}

#[test]
fn each_shard_is_spot_checked_by_the_same_number_of_nodes_whatever_the_shard_count() {
    // A seeded stream of uniform draws.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let members = 1000;
    for shards in [1000usize, 250, 40] {
        let mut per_shard = vec![0u32; shards];
        for _node in 0..members {
            let (spots, _) = checks(shards, 1, 0, members, &mut next);
            for s in spots {
                per_shard[s as usize] += 1;
            }
        }
        // One node a shard on average, so `shards` checks in all: not one
        // a node whatever the shard count, which with 40 shards would check
        // each 25 times, each check costing a shard of every member's
        // slices (25 payloads a node).
        let total: u32 = per_shard.iter().sum();
        let expected = shards as f64;
        assert!(
            (total as f64 - expected).abs() <= 0.35 * expected,
            "{shards} shards: {total} spot checks"
        );
    }
    // One shard a member: every node checks exactly one, as before.
    let (spots, _) = checks(1000, 1, 0, 1000, &mut next);
    assert_eq!(spots.len(), 1);
}

#[test]
fn a_member_whose_pushes_of_one_shard_vanished_sends_them_again_once_the_rest_stopped_arriving() {
    let mut w = World::new(8, 8, 2, none, none);
    // Member 3's pushes of one shard it does not seat vanish (a dropped
    // request is learnt only at its deadline, 5 s and more); every other
    // push arrives.
    let shard = w.unseated_shard(3);
    for &to in &w.seats[shard as usize].clone() {
        w.vanish.insert((3, shard, to));
    }
    w.compute();
    assert!(!w.announced.contains(&3));
    let first = w.pushes[&3];
    // Nothing more arrives: `STALL_FLOOR` later (the rest came at once)
    // those two pushes go again, and only those.
    w.run_until(STALL_FLOOR - Duration::from_millis(1));
    assert!(!w.announced.contains(&3), "sent again before the stall");
    w.run_until(STALL_FLOOR);
    assert!(w.announced.contains(&3), "not sent again after the stall");
    assert_eq!(w.pushes[&3], first + 2);
    assert_eq!(w.announced.len(), 8);
}

#[test]
fn a_member_whose_pushes_are_merely_slow_sends_none_again() {
    let mut w = World::new(8, 8, 2, none, none);
    w.slow_uplinks.insert(3);
    w.compute();
    let first = w.pushes[&3];
    // Its uplink is busy for ten hedge delays: every shard is still
    // unreached, none is pushed twice.
    w.run_until(Timing::default().hedge * 10);
    assert_eq!(w.pushes[&3], first);
    assert!(!w.announced.contains(&3));
    // They arrive; it announces.
    w.slow_uplinks.clear();
    for (i, a) in std::mem::take(&mut w.in_flight) {
        if let Action::Push { step, shard, to } = a {
            w.nodes[to as usize].on_slice(step, shard, i);
            w.nodes[i as usize].on_pushed(step, shard, to);
        }
    }
    w.settle();
    assert!(w.announced.contains(&3));
    assert_eq!(w.pushes[&3], first);
}

#[test]
fn a_push_lost_to_one_seat_is_sent_again_before_the_manifest_so_that_seat_fetches_nothing() {
    let mut w = World::new(8, 8, 2, none, none);
    // Member 3's push to one seat of a shard vanishes; the other seat
    // takes its push, so 3 announces.
    let shard = w.unseated_shard(3);
    let seat = w.seats[shard as usize][0];
    w.vanish.insert((3, shard, seat));
    w.compute();
    assert!(w.announced.contains(&3));
    assert!(!w.nodes[seat as usize].holds(0, shard, 3));
    let first = w.pushes[&3];
    // A short stall later, before any manifest, that push goes again: the
    // seat holds the slice and has nothing to fetch once the manifest
    // comes.
    w.run_until(STALL_FLOOR);
    assert_eq!(w.pushes[&3], first + 1);
    assert!(w.nodes[seat as usize].holds(0, shard, 3));
    let members: Vec<u32> = (0..8).collect();
    let now = w.now;
    for x in &mut w.nodes {
        x.on_manifest(now, 0, M, &members);
    }
    w.run();
    assert!(w.everyone_applied_once(), "{:?}", w.applied);
    assert_eq!(w.pushes[&3], first + 1, "pushed again after the manifest");
}
