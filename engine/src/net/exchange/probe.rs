//! A member listed in a manifest whose slices nobody serves: seats say so,
//! every node checks for itself, and either hands the slice to those seats
//! or drops the member through the step machine's fall-back manifest.
//!
//! Why every node checks: "nobody serves it" cannot be proven, so a lying
//! seat's word alone must not drop an honest member, and a member that
//! serves everyone but the seats must not stall the step. A node asks the
//! member, then the shard's seats and next reserve seats, each once; a slice it
//! gets goes to the seats that claimed it withheld (checked there against
//! the member's signed root, as a push is), and only if every source fails
//! does it tell its step machine. A node keeps asking, slowly, after that:
//! a slice that turns up restores the manifest its absence disqualified.
//! One look per member and shard, whatever the number of claims, and a
//! seat claims only for the shards it sits on: a seat claiming every
//! member costs each node a slice per member and shard of its own.

use super::{Action, Asking, Exchange, HedgeBudget, ManifestId, Verdict};
use std::collections::BTreeSet;
use std::time::Duration;

/// This node's look for one member's slice of one shard.
#[derive(Debug)]
pub(super) struct Probe {
    /// Whom to ask, in turn: the member, then the shard's seats and its
    /// next round of reserve seats (never this node).
    sources: Vec<u32>,
    ask: Asking,
    /// The next request may go then (after a failure).
    due: Option<Duration>,
    /// Seats that said the slice is withheld: they get it if this node does.
    claimers: BTreeSet<u32>,
    /// This node holds the slice.
    pub(super) got: bool,
    /// Every source failed: the step machine was told.
    given_up: bool,
}

impl Probe {
    /// Asks the next source when none is out (or one is overdue), and
    /// gives the slice up once every source failed. Returns when to look
    /// again.
    pub(super) fn drive(
        &mut self,
        out: &mut Vec<Action>,
        hedges: &mut HedgeBudget,
        now: Duration,
        step: u32,
        (member, shard): (u32, u32),
        hedge: Duration,
    ) -> Option<Duration> {
        if self.got {
            return None;
        }
        let k = self.sources.len();
        let free = self.ask.out == 0 && self.due.is_none_or(|d| d <= now);
        if self.ask.out == 0 && self.ask.tried >= k && !self.given_up {
            self.given_up = true;
            out.push(Action::Withheld { step, member });
        }
        if let Some(hedging) = hedges.may_ask(&self.ask, free, now, hedge)
            && k > 0
        {
            let order = (0..k).map(|i| self.sources[(self.ask.tried + i) % k]);
            if let Some(from) = self.ask.next(order) {
                self.ask.sent(now, from);
                hedges.sent(hedging);
                self.due = None;
                out.push(Action::Probe {
                    step,
                    shard,
                    member,
                    from,
                });
            }
        }
        self.ask.wake_at(now, hedge).or(self.due)
    }
}

impl Exchange {
    /// Seat `from` signed, for `manifest`, that nobody serves `member`'s
    /// slice of `shard`. The first claim about a member starts this node's
    /// own look; every claimer gets the slice if this node has it.
    pub fn on_withheld_claim(
        &mut self,
        step: u32,
        shard: u32,
        from: u32,
        manifest: ManifestId,
        member: u32,
    ) -> Verdict {
        let me = self.me;
        let Some(st) = self.steps.get_mut(&step) else {
            return Verdict::UnknownStep;
        };
        let s = shard as usize;
        // A seat, or one of the next round of reserve seats (which may
        // have taken the shard over elsewhere); later rounds hold nothing.
        let seated = |x: u32| {
            st.seats.get(s).is_some_and(|v| v.contains(&x)) || st.next_round(s).contains(&x)
        };
        if !seated(from) {
            return Verdict::NotASeat;
        }
        if st.manifest != Some(manifest) {
            return Verdict::OtherManifest;
        }
        if st
            .members
            .as_ref()
            .is_none_or(|m| m.binary_search(&member).is_err())
        {
            return Verdict::NotListed;
        }
        let held = member == me || st.agg.get(&shard).is_some_and(|a| a.held.contains(&member));
        // The member, then the seats (with the reserve rounds already
        // called on) and the next round of reserve seats, which may have
        // been called on elsewhere, each once: later rounds hold nothing.
        let (seats, next) = (st.seats[s].clone(), st.next_round(s).to_vec());
        let p = st.probes.entry((member, shard)).or_insert_with(|| Probe {
            sources: std::iter::once(member)
                .chain(seats.iter().copied())
                .chain(next.iter().copied())
                .filter(|&x| x != me)
                .fold(Vec::new(), |mut v, x| {
                    if !v.contains(&x) {
                        v.push(x);
                    }
                    v
                }),
            ask: Asking::default(),
            due: None,
            claimers: BTreeSet::new(),
            got: held,
            given_up: false,
        });
        if !p.claimers.insert(from) {
            return Verdict::Duplicate;
        }
        if p.got && from != me {
            self.out.push(Action::Forward {
                step,
                shard,
                member,
                to: from,
            });
        }
        self.dirty.insert((step, shard));
        Verdict::Accepted
    }

    /// A probe of `member`'s slice of `shard` failed: the next source is asked after
    /// `retry`, or after `silent` once every source failed.
    pub fn on_probe_failed(&mut self, now: Duration, step: u32, shard: u32, member: u32) {
        let Some(p) = self
            .steps
            .get_mut(&step)
            .and_then(|st| st.probes.get_mut(&(member, shard)))
        else {
            return;
        };
        p.ask.back();
        let wait = if p.given_up || p.ask.tried >= p.sources.len() {
            self.timing.silent
        } else {
            self.timing.retry
        };
        let due = now + wait;
        p.due = Some(due);
        self.timers.insert((due, step, shard));
        self.dirty.insert((step, shard));
    }

    /// `member`'s slice of `shard` arrived here: a look for it ends, the
    /// seats that claimed it withheld get it, and the step machine hears
    /// it turned up if it was given up. True if a look was under way.
    pub(super) fn probe_got(&mut self, step: u32, shard: u32, member: u32) -> bool {
        let Some(st) = self.steps.get_mut(&step) else {
            return false;
        };
        let Some(p) = st.probes.get_mut(&(member, shard)).filter(|p| !p.got) else {
            return false;
        };
        p.got = true;
        p.ask.back();
        // The shard may go to its reserve seats now (`Step::may_reseat`).
        self.dirty.insert((step, shard));
        for &to in p.claimers.iter().filter(|&&c| c != self.me) {
            self.out.push(Action::Forward {
                step,
                shard,
                member,
                to,
            });
        }
        if p.given_up {
            p.given_up = false;
            // Served only once no shard of it is given up any more.
            if !st.probes.iter().any(|(k, p)| k.0 == member && p.given_up)
                && st.withheld.remove(&member)
            {
                self.out.push(Action::Served { step, member });
            }
        }
        true
    }
}
