//! A witness's side of the defence on the training thread: the screen's
//! memory, the audits the defence policy assigns it, and their recomputation.

use super::events::{AuditReport, NodeConfig};
use super::msg;
use super::train::Recent;
use crate::audit::{self, StepScreen};
use crate::compress::Payload;
use crate::defence::{Duty, Ground, Policy, signature};
use crate::params::ParamSet;
use crate::trainer::Trainer;
use crate::wire::Contribution;
use libp2p::identity::ed25519;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// The outcome of asking a member for a committed momentum.
#[derive(Clone, Debug)]
pub(crate) enum Revealed {
    /// The encoded momentum, matching its commitment.
    Momentum(Vec<u8>),
    /// A momentum that does not hash to the commitment: a lie.
    Lied,
    /// The member answered without it.
    Refused,
    /// The member stayed online (heard and connected) and left requests
    /// for it unanswered on an open connection for the witness's whole
    /// patience. An honest node answers
    /// a momentum request from its network thread, with the momentum or
    /// without it, whatever its trainer is doing: silence is withholding.
    Withheld,
    /// The member could not be reached (it may have restarted honestly).
    Unreachable,
}

/// Weight states a witness keeps to audit on (see [`Guard::weights_at`]).
/// Audits run while the trainer waits for manifests, so on a busy machine
/// one can trail its step by several applies.
pub(crate) const KEEP_WEIGHTS: usize = 8;

/// A contribution a witness audits: whose, the momentum commitment, the
/// member's commitment at the step before when the chain is checked, and
/// the payloads the network side fetches as slices (the sharded
/// exchange's): (step, the root the member signed).
pub(crate) struct Target {
    pub(crate) member: u32,
    pub(crate) hash: [u8; 32],
    pub(crate) previous: Option<[u8; 32]>,
    pub(crate) fetch: Vec<(u32, [u8; 32])>,
}

/// What a member sent at a step, as a witness holds it when it draws.
#[derive(Clone, Debug)]
pub(crate) enum Sent {
    /// Its payload (the all-to-all exchange).
    Payload(Payload),
    /// The root its slices are committed to (the sharded exchange, where
    /// no node holds a payload whole): fetched as slices when audited.
    Slices([u8; 32]),
}

/// A member's momentum hash at one step, and what it sent then: what its
/// audit recomputes against, and what the chain check of its next step
/// follows.
#[derive(Clone, Debug)]
struct Commitment {
    momentum: [u8; 32],
    sent: Sent,
}

impl Commitment {
    /// What an auditor's coin is drawn on: the payload's hash, or the root
    /// of its slices (which fixes the payload just as well).
    fn drawn_on(&self, select: crate::compress::Select) -> [u8; 32] {
        match &self.sent {
            Sent::Payload(p) => audit::payload_hash(select, p),
            Sent::Slices(root) => *root,
        }
    }
}

/// One shard of a member's contribution a witness of the sharded exchange
/// screens it by: the network side fetches that slice (checked against
/// `root`) and the witness compares it with the shard's sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) member: u32,
    pub(crate) shard: u32,
    pub(crate) root: [u8; 32],
}

/// A sample waiting for its slice: the members the step listed, and the
/// contribution it would audit.
struct Sampling {
    listed: usize,
    k: Commitment,
}

/// A listed member's announcement on the sharded exchange, as an auditor
/// needs it: its momentum commitment and the root of its slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Announced {
    pub(crate) member: u32,
    pub(crate) momentum: [u8; 32],
    pub(crate) root: [u8; 32],
}

/// One side of an audit that is still downloading.
enum Wait<T> {
    Pending,
    Done(T),
}

/// A contribution drawn for audit, waiting for what its author reveals
/// (and, on the sharded exchange, for its payload's slices).
struct Awaited {
    /// The payload sent: None if its slices could not be fetched.
    payload: Wait<Option<Payload>>,
    /// Why it is audited: the screen, or a coin's draw.
    ground: Ground,
    /// The screen flagged it: a refusal to reveal then fails the audit. Not
    /// so for a payload audited only because its step was too small to
    /// screen, or drawn by a coin: an honest member that restarted has
    /// lost its momenta.
    refusal_fails: bool,
    own: Wait<Revealed>,
    /// The momentum committed at the step before, for the chain check.
    previous: Option<Wait<Revealed>>,
    /// The payload sent at the step before: the coefficients that left the
    /// momentum then, which the chain check removes.
    previous_sent: Option<Wait<Option<Payload>>>,
}

impl Awaited {
    fn ready(&self) -> bool {
        !matches!(self.own, Wait::Pending)
            && !matches!(self.payload, Wait::Pending)
            && !matches!(self.previous, Some(Wait::Pending))
            && !matches!(self.previous_sent, Some(Wait::Pending))
    }
}

/// The training thread's side of proof of contribution: the screen's
/// memory, and a witness's pending audits. Who audits what is the
/// [`defence::Policy`]'s to say.
pub(crate) struct Guard {
    pub(crate) policy: Policy,
    /// The job's compression rule: what a payload's identity covers
    /// ([`audit::payload_hash`]).
    select: crate::compress::Select,
    me: u32,
    witness: bool,
    /// Signs this witness's audit coins.
    signer: ed25519::Keypair,
    /// Members' keys: what another auditor's coin is checked against.
    keys: Vec<[u8; 32]>,
    /// Payload hashes applied per step: the screen's memory of recent steps.
    pub(crate) recent: Recent,
    /// What the state after s updates computes the next step on, for the
    /// last few s (witnesses only): its weights, extrapolated under a
    /// look-ahead recipe ([`Trainer::ahead_weights`]). The node computes
    /// step t on the state after t-1 updates (pipelining), so that is what
    /// an audit of step t recomputes on; see [`Guard::computed_on`] for the
    /// first two steps of a run.
    weights_at: BTreeMap<u32, ParamSet>,
    /// The step this run started fresh at (every member computes its first
    /// two steps on the same weights there), or None for a member that
    /// synced in mid-run.
    origin: Option<u32>,
    /// Contributions drawn for audit, waiting for their momenta.
    awaiting: BTreeMap<(u32, u32), Awaited>,
    /// Samples waiting for their slice (the sharded exchange's screen):
    /// (step, member, shard).
    sampling: BTreeMap<(u32, u32, u32), Sampling>,
    /// Roots listed per recent step (the sharded exchange's duplicates).
    roots: BTreeMap<u32, Vec<[u8; 32]>>,
    /// Other auditors' sampled shards checked: (step, member, accuser),
    /// one per accuser, so an auditor cannot make this one fetch every
    /// shard of an honest member's contribution, nor use up the checks an
    /// honest auditor's flag needs.
    confirmed: BTreeSet<(u32, u32, u32)>,
    /// Audits opened, per (step, member): each is run once.
    opened: BTreeSet<(u32, u32)>,
    /// Contributions this witness audits if asked to confirm (recent
    /// steps, only those it is an auditor of).
    kept: BTreeMap<u32, BTreeMap<u32, Commitment>>,
    /// Each member's momentum commitment per recent step (witnesses only):
    /// what a chain check fetches the previous momentum against, with the
    /// payload sent then. Every member's: who audits the next step is known
    /// only then (a slashed witness reshuffles the auditors). A payload is a
    /// small fraction of the weights kept beside it (`weights_at`: for a
    /// billion parameters, 4 GB a step against ~3 MB a member at the
    /// default 4 of 4,096 coefficients).
    commitments: BTreeMap<u32, BTreeMap<u32, Commitment>>,
}

impl Guard {
    pub(crate) fn new(cfg: &NodeConfig) -> Self {
        Guard {
            policy: cfg.policy(),
            select: cfg.train.compress.select,
            me: cfg.me,
            witness: cfg.defence.witnesses.contains(&cfg.me),
            signer: msg::keypair(&cfg.secret),
            keys: cfg.members.clone(),
            recent: BTreeMap::new(),
            weights_at: BTreeMap::new(),
            origin: None,
            awaiting: BTreeMap::new(),
            sampling: BTreeMap::new(),
            roots: BTreeMap::new(),
            confirmed: BTreeSet::new(),
            opened: BTreeSet::new(),
            kept: BTreeMap::new(),
            commitments: BTreeMap::new(),
        }
    }

    /// This run starts fresh at `step` (the epoch's first step, or 0):
    /// steps `step` and `step + 1` are both computed on its weights.
    pub(crate) fn start_fresh(&mut self, step: u32) {
        self.origin = Some(step);
    }

    /// How many updates the weights that step `step` was computed on had
    /// taken: `step - 1` (pipelining), except that a fresh run computes its
    /// first two steps on its starting weights. (Reading `step - 1` there
    /// looked for the previous epoch's weights, which a run never holds,
    /// and skipped every audit of an epoch's first step.)
    fn computed_on(&self, step: u32) -> Option<u32> {
        computed_on(self.origin, step)
    }

    pub(crate) fn remember(&mut self, t: &Trainer) {
        if !self.witness {
            return;
        }
        // Anything kept past this step belongs to an abandoned history.
        self.weights_at.retain(|s, _| *s < t.step());
        self.awaiting.retain(|(s, _), _| *s < t.step());
        self.sampling.retain(|(s, _, _), _| *s < t.step());
        self.roots.retain(|s, _| *s < t.step());
        self.confirmed.retain(|(s, _, _)| *s < t.step());
        self.opened.retain(|(s, _)| *s < t.step());
        self.kept.retain(|s, _| *s < t.step());
        self.commitments.retain(|s, _| *s < t.step());
        self.weights_at.insert(t.step(), t.ahead_weights());
        // The newest `KEEP_WEIGHTS` steps stay (an audit of any of them may
        // still open), and so do older ones a pending audit pins: a witness
        // that falls behind audits late, it never drops the audit. (Evicting
        // the oldest unpinned step instead dropped recent weights whenever
        // many old audits were pending, and audits opened next were skipped.)
        let keep = kept_weights(self.weights_at.keys().copied(), &self.pinned());
        self.weights_at.retain(|s, _| keep.contains(s));
    }

    /// Weight states that audits may still recompute on: those waiting for
    /// momenta (the weights of their step, and of the step before for a
    /// chain check), and those another auditor may yet ask this one to
    /// confirm (every kept contribution's). A confirmation arrives when the
    /// drawer's audit is done, which on a busy machine trails by several
    /// steps: it must find the weights as long as it finds the
    /// contribution, or the audit is dropped and no quorum forms.
    fn pinned(&self) -> BTreeSet<u32> {
        let steps = self
            .awaiting
            .keys()
            .map(|(s, _)| *s)
            .chain(self.sampling.keys().map(|(s, _, _)| *s))
            .chain(self.kept.keys().copied());
        pins(steps, self.origin)
    }

    /// Screens step `step`'s contributions (identically on every node) and
    /// remembers their hashes for the steps that follow.
    pub(crate) fn screen(
        &mut self,
        layout: &crate::compress::Layout,
        step: u32,
        cs: &[Contribution],
    ) -> StepScreen {
        let window: Vec<[u8; 32]> = self
            .recent
            .range(step.saturating_sub(audit::RECENT_STEPS)..step)
            .flat_map(|(_, h)| h.iter().copied())
            .collect();
        let refs: Vec<&Payload> = cs.iter().map(|c| &c.payload).collect();
        let verdict = audit::screen_step(layout, &refs, &window);
        self.recent.insert(step, verdict.hashes.clone());
        self.recent
            .retain(|s, _| *s + audit::RECENT_STEPS > step && *s <= step);
        verdict
    }

    /// The contributions of `step` this witness audits now: those the
    /// policy gives it (flagged ones it is an auditor of, and those its
    /// coin draws). It keeps the others it is an auditor of, in case
    /// another auditor's coin draws them and asks it to confirm.
    pub(crate) fn draw(
        &mut self,
        step: u32,
        members: &[u32],
        cs: &[Contribution],
        verdict: &StepScreen,
    ) -> Vec<Target> {
        if !self.witness {
            return Vec::new();
        }
        let entries: BTreeMap<u32, Commitment> = members
            .iter()
            .zip(cs)
            .map(|(m, c)| {
                let k = Commitment {
                    momentum: c.momentum_hash,
                    sent: Sent::Payload(c.payload.clone()),
                };
                (*m, k)
            })
            .collect();
        self.commit(step, entries);
        let mut out = Vec::new();
        for (((member, c), screen), hash) in members
            .iter()
            .zip(cs)
            .zip(&verdict.screens)
            .zip(&verdict.hashes)
        {
            if !self.policy.is_auditor(self.me, step, *member) {
                continue;
            }
            let flagged = screen.flagged();
            let certain = screen.needs_audit();
            let signer = &self.signer;
            let duty = self
                .policy
                .duty(self.me, step, *member, hash, certain, |m| {
                    signature(signer, m)
                });
            let k = Commitment {
                momentum: c.momentum_hash,
                sent: Sent::Payload(c.payload.clone()),
            };
            out.extend(self.keep_and_open(step, *member, k, duty, flagged));
        }
        out
    }

    /// The sharded exchange's draw for `step`. No node holds the step's
    /// payloads whole, so the screen is the witness's own, per contribution
    /// it is an auditor of: a root listed twice, or listed at a recent step
    /// (a copy, or a payload sent again), is flagged at once; a coin drawn
    /// on the root may draw it for audit as on the all-to-all exchange;
    /// otherwise one shard's slice, picked by this witness's secret, is
    /// fetched and screened against that shard's sums ([`Guard::sampled`]).
    /// `entries` is the manifest's (member, root) list; `announced` the
    /// announcements this node heard of listed members, computed on the
    /// state the step's contributions are computed on; `sums` every
    /// shard's. Returns the audits opened and the samples to fetch.
    pub(crate) fn draw_sharded(
        &mut self,
        step: u32,
        entries: &[(u32, [u8; 32])],
        announced: &[Announced],
        sums: &[Vec<i32>],
    ) -> (Vec<Target>, Vec<Sample>) {
        if !self.witness {
            return (Vec::new(), Vec::new());
        }
        let heard: BTreeMap<u32, Commitment> = announced
            .iter()
            .map(|a| {
                let k = Commitment {
                    momentum: a.momentum,
                    sent: Sent::Slices(a.root),
                };
                (a.member, k)
            })
            .collect();
        self.commit(step, heard.clone());
        let earlier: BTreeSet<[u8; 32]> = self
            .roots
            .range(step.saturating_sub(audit::RECENT_STEPS)..step)
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        let listed: Vec<[u8; 32]> = entries.iter().map(|e| e.1).collect();
        self.roots.insert(step, listed.clone());
        self.roots
            .retain(|s, _| *s + audit::RECENT_STEPS > step && *s <= step);
        self.sampling
            .retain(|(s, _, _), _| *s + KEEP_WEIGHTS as u32 > step);
        self.confirmed
            .retain(|(s, _, _)| *s + KEEP_WEIGHTS as u32 > step);
        // Too few listed to judge by the others' votes: every auditor
        // audits each of them instead, as on the all-to-all exchange (a
        // leader could otherwise list only itself and a colluder).
        let unjudged = listed.len() < audit::MIN_SCREENED;
        let (mut targets, mut samples) = (Vec::new(), Vec::new());
        for (member, k) in heard {
            if member == self.me || !self.policy.is_auditor(self.me, step, member) {
                continue;
            }
            let root = k.drawn_on(self.select);
            let copied =
                earlier.contains(&root) || listed.iter().filter(|r| **r == root).count() > 1;
            let signer = &self.signer;
            let duty = self
                .policy
                .duty(self.me, step, member, &root, copied || unjudged, |m| {
                    signature(signer, m)
                });
            let drawn = matches!(duty, Duty::Audit { .. });
            targets.extend(self.keep_and_open(step, member, k.clone(), duty, copied));
            if drawn || sums.is_empty() {
                continue;
            }
            let mut msg = b"cohort-sample-v1".to_vec();
            msg.extend_from_slice(&step.to_le_bytes());
            msg.extend_from_slice(&member.to_le_bytes());
            msg.extend_from_slice(&root);
            let pick = blake3::hash(&signature(&self.signer, &msg));
            let shard = (u64::from_le_bytes(pick.as_bytes()[..8].try_into().unwrap_or([0; 8]))
                % sums.len() as u64) as u32;
            self.sampling.insert(
                (step, member, shard),
                Sampling {
                    listed: listed.len(),
                    k,
                },
            );
            samples.push(Sample {
                member,
                shard,
                root,
            });
        }
        (targets, samples)
    }

    /// A sampled slice came in with its shard's accepted sums (None: the
    /// network side got either not): a slice whose signs go against the
    /// others' votes in its shard flags the contribution as the
    /// whole-payload screen would, and its audit opens as a flagged
    /// payload's (a refusal to reveal fails it). The slice is the member's,
    /// proven under the root it signed, and the sums are the step's: the
    /// flag is a fact any holder of both can check, not this witness's
    /// say-so, and the accusation names the shard
    /// ([`Guard::confirm_sample`]).
    pub(crate) fn sampled(
        &mut self,
        step: u32,
        member: u32,
        shard: u32,
        found: Option<(Vec<bool>, Vec<i32>)>,
    ) -> Option<Target> {
        let s = self.sampling.remove(&(step, member, shard))?;
        let (slice, sums) = found?;
        let agreement = audit::slice_agreement(&slice, &sums, s.listed)?;
        let flagged = agreement < audit::SCREEN.agreement;
        tracing::debug!(
            me = self.me,
            member,
            step,
            shard,
            agreement,
            flagged,
            "sampled a slice"
        );
        if !flagged {
            return None;
        }
        self.open(step, member, s.k, Ground::Sampled { shard }, true, true)
    }

    /// Another auditor of `member`'s step-`step` contribution accused it
    /// on its slice of `shard`: this auditor fetches that slice and checks
    /// the flag itself (each auditor samples a shard of its own, so a
    /// cheater that corrupts a few shards would otherwise be flagged by one
    /// auditor and never reach the quorum). Nothing is taken on the
    /// accuser's word: an honest member's slice passes here as it did
    /// everywhere.
    pub(crate) fn confirm_sample(
        &mut self,
        step: u32,
        member: u32,
        shard: u32,
        by: u32,
    ) -> Option<Sample> {
        if !self.witness || self.opened.contains(&(step, member)) {
            return None;
        }
        let k = self.kept.get(&step)?.get(&member)?.clone();
        let Sent::Slices(root) = k.sent else {
            return None;
        };
        let listed = self.roots.get(&step)?.len();
        if self.sampling.contains_key(&(step, member, shard))
            || !self.confirmed.insert((step, member, by))
        {
            return None;
        }
        self.sampling
            .insert((step, member, shard), Sampling { listed, k });
        Some(Sample {
            member,
            shard,
            root,
        })
    }

    /// Remembers every listed member's commitment at `step` (what the
    /// chain check of its next step follows).
    fn commit(&mut self, step: u32, entries: BTreeMap<u32, Commitment>) {
        self.commitments.insert(step, entries);
        while self.commitments.len() > KEEP_WEIGHTS {
            self.commitments.pop_first();
        }
    }

    /// Keeps a contribution this witness is an auditor of (another
    /// auditor's coin may draw it), and opens its audit if `duty` says so.
    fn keep_and_open(
        &mut self,
        step: u32,
        member: u32,
        k: Commitment,
        duty: Duty,
        flagged: bool,
    ) -> Option<Target> {
        self.kept.entry(step).or_default().insert(member, k.clone());
        while self.kept.len() > KEEP_WEIGHTS {
            self.kept.pop_first();
        }
        match duty {
            Duty::Audit { chained, ground } => self.open(step, member, k, ground, chained, flagged),
            Duty::Skip => None,
        }
    }

    /// Another auditor's coin drew `member`'s step-`step` contribution and
    /// its audit failed: this auditor runs the audit too, if the coin
    /// proves the draw and it still holds the contribution.
    pub(crate) fn confirm(
        &mut self,
        step: u32,
        member: u32,
        by: u32,
        coin: [u8; 64],
    ) -> Option<Target> {
        if !self.witness || self.opened.contains(&(step, member)) {
            return None;
        }
        let k = self.kept.get(&step)?.get(&member)?.clone();
        let key = self.keys.get(by as usize)?;
        if !self
            .policy
            .drawn_by(by, key, step, member, &k.drawn_on(self.select), &coin)
        {
            return None;
        }
        self.open(step, member, k, Ground::Drawn { by, coin }, true, false)
    }

    fn open(
        &mut self,
        step: u32,
        member: u32,
        k: Commitment,
        ground: Ground,
        chained: bool,
        refusal_fails: bool,
    ) -> Option<Target> {
        if !self.opened.insert((step, member)) {
            return None;
        }
        // The chain is followed from the momentum committed at the step
        // before and the payload sent then.
        let before = step
            .checked_sub(1)
            .filter(|_| chained)
            .and_then(|s| self.commitments.get(&s)?.get(&member).cloned());
        let mut fetch = Vec::new();
        let mut sent = |s: u32, sent: Sent| match sent {
            Sent::Payload(p) => Wait::Done(Some(p)),
            Sent::Slices(root) => {
                fetch.push((s, root));
                Wait::Pending
            }
        };
        let payload = sent(step, k.sent);
        let previous = before.as_ref().map(|b| b.momentum);
        let previous_sent = before.map(|b| sent(step - 1, b.sent));
        self.awaiting.insert(
            (step, member),
            Awaited {
                payload,
                ground,
                refusal_fails,
                own: Wait::Pending,
                previous: previous.map(|_| Wait::Pending),
                previous_sent,
            },
        );
        Some(Target {
            member,
            hash: k.momentum,
            previous,
            fetch,
        })
    }

    /// A momentum came in: it completes the audit of its own step and/or
    /// the chain check of the step after. Returns the audits now decided.
    pub(crate) fn revealed(
        &mut self,
        trainer: &mut Trainer,
        cfg: &NodeConfig,
        step: u32,
        member: u32,
        outcome: Revealed,
    ) -> Result<Vec<Decided>, String> {
        // Only flagged payloads chain, so the copy is rare.
        if let Some(a) = self.awaiting.get_mut(&(step + 1, member))
            && matches!(a.previous, Some(Wait::Pending))
        {
            a.previous = Some(Wait::Done(outcome.clone()));
        }
        if let Some(a) = self.awaiting.get_mut(&(step, member))
            && matches!(a.own, Wait::Pending)
        {
            a.own = Wait::Done(outcome);
        }
        self.settle(trainer, cfg, step, member)
    }

    /// A member's payload of `step`, assembled from its slices (None if
    /// they could not all be fetched): it completes the audit of that step
    /// and/or the chain check of the step after. Returns the audits now
    /// decided.
    pub(crate) fn sent(
        &mut self,
        trainer: &mut Trainer,
        cfg: &NodeConfig,
        step: u32,
        member: u32,
        payload: Option<Payload>,
    ) -> Result<Vec<Decided>, String> {
        if let Some(a) = self.awaiting.get_mut(&(step + 1, member))
            && matches!(a.previous_sent, Some(Wait::Pending))
        {
            a.previous_sent = Some(Wait::Done(payload.clone()));
        }
        if let Some(a) = self.awaiting.get_mut(&(step, member))
            && matches!(a.payload, Wait::Pending)
        {
            a.payload = Wait::Done(payload);
        }
        self.settle(trainer, cfg, step, member)
    }

    /// Runs the audits of `member` at `step` and `step + 1` that have all
    /// they wait for.
    fn settle(
        &mut self,
        trainer: &mut Trainer,
        cfg: &NodeConfig,
        step: u32,
        member: u32,
    ) -> Result<Vec<Decided>, String> {
        let mut out = Vec::new();
        for key in [(step, member), (step + 1, member)] {
            let ready = self.awaiting.get(&key).is_some_and(Awaited::ready);
            if ready && let Some(a) = self.awaiting.remove(&key) {
                out.push((key.0, key.1, self.audit(trainer, cfg, key.0, key.1, a)?));
            }
        }
        // An audit abandoned with its history (a rewind) is settled too, so
        // the network side does not wait for it.
        if !self.awaiting.contains_key(&(step, member))
            && !out.iter().any(|d| (d.0, d.1) == (step, member))
        {
            out.push((step, member, None));
        }
        Ok(out)
    }

    /// Runs one audit once its momenta are in (or known to be withheld).
    /// None when there is nothing to decide: the weights are no longer
    /// kept, or the member could not be reached (it may have restarted), or
    /// a randomly drawn member refused (a withheld momentum only counts
    /// against a flagged payload).
    fn audit(
        &self,
        trainer: &mut Trainer,
        cfg: &NodeConfig,
        step: u32,
        member: u32,
        a: Awaited,
    ) -> Result<Option<AuditReport>, String> {
        let Awaited {
            payload,
            ground,
            refusal_fails,
            own,
            previous,
            previous_sent,
        } = a;
        let targeted = refusal_fails;
        let Wait::Done(own) = own else {
            return Ok(None);
        };
        let Wait::Done(Some(payload)) = payload else {
            tracing::warn!(
                me = cfg.me,
                member,
                step,
                "audit skipped: the payload's slices could not be fetched"
            );
            return Ok(None);
        };
        let previous_sent = match previous_sent {
            Some(Wait::Done(p)) => p,
            _ => None,
        };
        let Some(weights) = self.computed_on(step).and_then(|s| self.weights_at.get(&s)) else {
            tracing::warn!(
                me = cfg.me,
                member,
                step,
                "audit skipped: the weights it recomputes on are no longer kept"
            );
            return Ok(None);
        };
        let evidence = audit::evidence_id(
            &cfg.job,
            cfg.epoch,
            step,
            member,
            &audit::payload_hash(self.select, &payload),
        );
        let withheld = AuditReport {
            step,
            member,
            passed: false,
            targeted,
            ground,
            comparison: None,
            chain_error: None,
            secs: 0.0,
            evidence,
        };
        let revealed = match judge(&own, refusal_fails) {
            Judged::Check(m) => audit::decode_momentum(m, trainer.momentum()),
            Judged::Fails => None,
            Judged::Undecided => return Ok(None),
        };
        let Some(revealed) = revealed else {
            return Ok(Some(withheld));
        };
        let t0 = Instant::now();
        let (reference, _) = trainer
            .replay_on(weights, &cfg.seed, cfg.epoch, step, member, &revealed)
            .map_err(|e| e.to_string())?;
        let cmp = audit::compare(trainer.layout(), &payload, &reference);
        let mut report = AuditReport {
            passed: cmp.passes(&self.policy.audit),
            comparison: Some(cmp),
            ..withheld
        };
        // The chain: replay the step before from the momentum committed
        // then, on the weights it was computed on; this one must follow.
        let before = step.wrapping_sub(1);
        let chain_weights = step
            .checked_sub(1)
            .and_then(|b| self.computed_on(b))
            .and_then(|s| self.weights_at.get(&s));
        let previous = match previous {
            Some(Wait::Done(r)) if report.passed => Some(r),
            _ => None,
        };
        let judged = previous
            .as_ref()
            .map_or(Judged::Undecided, |r| judge(r, refusal_fails));
        match (judged, chain_weights, previous_sent) {
            (Judged::Check(m), Some(w), Some(sent)) => {
                let prev = audit::decode_momentum(m, trainer.momentum());
                let err = match prev {
                    Some(prev) => {
                        let (_, grads) = trainer
                            .member_gradients_on(w, &cfg.seed, cfg.epoch, before, member)
                            .map_err(|e| e.to_string())?;
                        // Applied payloads fit the model; one that does not
                        // names no coefficients to follow.
                        match trainer.follow_from(&prev, &grads, &sent) {
                            Ok(expected) => audit::chain_error(&revealed, &expected, &grads),
                            Err(_) => f32::INFINITY,
                        }
                    }
                    None => f32::INFINITY,
                };
                report.chain_error = Some(err);
                report.passed = err <= self.policy.audit.max_chain_error;
            }
            // Lying about a signed commitment of the payload's history (or
            // withholding a flagged payload's) is as bad as withholding its
            // own: the chain cannot be followed.
            (Judged::Fails, _, _) => {
                report.chain_error = Some(f32::INFINITY);
                report.passed = false;
            }
            _ => {}
        }
        report.secs = t0.elapsed().as_secs_f64();
        Ok(Some(report))
    }
}

/// An audit decided: (step, member, its report, or None when there was
/// nothing to decide).
pub(crate) type Decided = (u32, u32, Option<AuditReport>);

/// What an audit does with what a member revealed.
#[derive(Debug, PartialEq)]
enum Judged<M> {
    /// Recompute with this momentum.
    Check(M),
    /// The audit fails on the answer alone.
    Fails,
    /// Nothing is decided: the audit (or its chain check) is not run.
    Undecided,
}

/// One rule for a contribution's own momentum and for the one committed
/// the step before (the chain): a momentum that does not match its
/// commitment, or one withheld by a member that is online, always fails;
/// an answer without it fails only a payload the screen flagged, because
/// an honest member that restarted has lost its momenta and says so; a
/// member that cannot be reached is not judged (the network side has
/// already waited for it).
fn judge(r: &Revealed, refusal_fails: bool) -> Judged<&[u8]> {
    match r {
        Revealed::Momentum(m) => Judged::Check(m),
        Revealed::Lied | Revealed::Withheld => Judged::Fails,
        Revealed::Refused if refusal_fails => Judged::Fails,
        Revealed::Refused | Revealed::Unreachable => Judged::Undecided,
    }
}

/// The weight states audits of `steps` recompute on: each step's own, and
/// the step before's for its chain check.
fn pins(steps: impl Iterator<Item = u32>, origin: Option<u32>) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for step in steps {
        out.extend(computed_on(origin, step));
        out.extend(step.checked_sub(1).and_then(|b| computed_on(origin, b)));
    }
    out
}

/// See [`Guard::computed_on`]: `origin` is where the run started fresh.
fn computed_on(origin: Option<u32>, step: u32) -> Option<u32> {
    match origin {
        Some(o) if step <= o + 1 => (step >= o).then_some(o),
        _ => step.checked_sub(1),
    }
}

/// The steps whose weights a witness keeps: the newest `KEEP_WEIGHTS`, and
/// any older one a pending audit pins.
fn kept_weights(
    steps: impl DoubleEndedIterator<Item = u32>,
    pinned: &BTreeSet<u32>,
) -> BTreeSet<u32> {
    let mut steps: Vec<u32> = steps.collect();
    steps.sort_unstable();
    let newest = steps.len().saturating_sub(KEEP_WEIGHTS);
    steps
        .iter()
        .enumerate()
        .filter(|(i, s)| *i >= newest || pinned.contains(s))
        .map(|(_, s)| *s)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lie_or_a_withheld_momentum_fails_any_audit_and_a_refusal_fails_only_a_flagged_one() {
        for flagged in [false, true] {
            assert_eq!(judge(&Revealed::Lied, flagged), Judged::Fails);
            // Silence from a member that is online fails an unflagged
            // payload too: a step too small to screen once let an author
            // that never answered keep its flipped payloads (CI, stop 29).
            assert_eq!(judge(&Revealed::Withheld, flagged), Judged::Fails);
            assert_eq!(judge(&Revealed::Unreachable, flagged), Judged::Undecided);
            assert_eq!(
                judge(&Revealed::Momentum(vec![1, 2]), flagged),
                Judged::Check(&[1u8, 2][..])
            );
        }
        assert_eq!(judge(&Revealed::Refused, true), Judged::Fails);
        assert_eq!(judge(&Revealed::Refused, false), Judged::Undecided);
    }

    #[test]
    fn an_epochs_first_two_steps_are_audited_on_its_starting_weights_and_later_ones_on_the_step_before()
     {
        // Epoch 1 of an 8-step epoch job starts fresh after 8 updates.
        assert_eq!(computed_on(Some(8), 8), Some(8));
        assert_eq!(computed_on(Some(8), 9), Some(8));
        assert_eq!(computed_on(Some(8), 10), Some(9));
        // Nothing of the run before it is held.
        assert_eq!(computed_on(Some(8), 7), None);
        // The job's first epoch: the same rule as always.
        assert_eq!(computed_on(Some(0), 0), Some(0));
        assert_eq!(computed_on(Some(0), 1), Some(0));
        assert_eq!(computed_on(Some(0), 5), Some(4));
        // A member that synced mid-run: the pipelined rule only (another
        // member's step at the sync point was computed on weights it never
        // had, so that audit is not run rather than run on the wrong ones).
        assert_eq!(computed_on(None, 12), Some(11));
        assert_eq!(computed_on(None, 0), None);
    }

    #[test]
    fn a_contribution_kept_for_confirmation_keeps_the_weights_its_audit_needs() {
        // Weights after 0..=11 updates held; contributions of steps 3..12
        // kept for a confirmation that may come late. Before, only open
        // audits pinned weights: the newest 8 (4..=11) stayed, and a
        // confirmation of step 3, 4 or 5 was skipped for want of the
        // weights its recomputation or chain check runs on (1..=3).
        let kept: Vec<u32> = (3..12).collect();
        let weights = kept_weights(0..12, &pins(kept.iter().copied(), Some(0)));
        for s in 1..12 {
            assert!(weights.contains(&s), "weights after {s} updates evicted");
        }
        assert!(!weights.contains(&0), "{weights:?}");
    }

    #[test]
    fn many_pending_old_audits_never_evict_the_newest_weights() {
        let k = KEEP_WEIGHTS as u32;
        let pinned: BTreeSet<u32> = (0..k).collect();
        let kept = kept_weights(0..3 * k, &pinned);
        for s in (0..k).chain(2 * k..3 * k) {
            assert!(kept.contains(&s), "step {s} evicted: {kept:?}");
        }
        assert_eq!(kept.len(), 2 * KEEP_WEIGHTS, "{kept:?}");
    }

    /// Witness `me` of a 6-member job whose every member witnesses, with
    /// no audit drawn by coin.
    fn sharded_witness(me: u32) -> Guard {
        let args: Vec<String> = [
            "--index",
            &me.to_string(),
            "--members",
            "6",
            "--witnesses",
            "0,1,2,3,4,5",
            "--quorum",
            "2",
            "--audit-rate",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (cfg, _) = crate::net::peer::parse(&args).unwrap();
        Guard::new(&cfg)
    }

    fn announced(members: &[u32]) -> (Vec<(u32, [u8; 32])>, Vec<Announced>) {
        let a: Vec<Announced> = members
            .iter()
            .map(|&m| Announced {
                member: m,
                momentum: [m as u8; 32],
                root: [10 + m as u8; 32],
            })
            .collect();
        (a.iter().map(|a| (a.member, a.root)).collect(), a)
    }

    #[test]
    fn a_sharded_witness_samples_each_contribution_it_audits_and_a_slice_against_the_sums_opens_its_audit()
     {
        let mut g = sharded_witness(0);
        let (entries, a) = announced(&[0, 1, 2, 3, 4, 5]);
        // Four shards of eight positions; the others voted + everywhere.
        let sums = vec![vec![4; 8]; 4];
        let (targets, samples) = g.draw_sharded(3, &entries, &a, &sums);
        assert!(targets.is_empty(), "no coin, no copy, six listed");
        let mine: Vec<u32> = (1..6).filter(|&m| g.policy.is_auditor(0, 3, m)).collect();
        assert!(!mine.is_empty());
        assert_eq!(
            samples.iter().map(|s| s.member).collect::<Vec<_>>(),
            mine,
            "one sample per contribution this witness audits, never its own"
        );
        for s in &samples {
            assert!(s.shard < 4);
            assert_eq!(s.root, [10 + s.member as u8; 32]);
        }
        let (bad, good) = (samples[0], samples.get(1).copied());
        // A slice voting against the others everywhere: flagged, and its
        // audit fetches the whole payload as slices under the signed root.
        let t = g
            .sampled(
                3,
                bad.member,
                bad.shard,
                Some((vec![true; 8], sums[0].clone())),
            )
            .expect("flagged");
        assert_eq!((t.member, t.hash), (bad.member, [bad.member as u8; 32]));
        assert_eq!(t.fetch, vec![(3, bad.root)]);
        assert!(g.sampled(3, bad.member, bad.shard, None).is_none(), "once");
        if let Some(s) = good {
            let agreeing = Some((vec![false; 8], sums[0].clone()));
            assert!(g.sampled(3, s.member, s.shard, agreeing).is_none());
            // Another auditor's flag on another shard: this one checks that
            // slice itself, one shard per accuser.
            let other = (s.shard + 1) % 4;
            let c = g.confirm_sample(3, s.member, other, 4).expect("checked");
            assert_eq!((c.member, c.shard, c.root), (s.member, other, s.root));
            assert!(
                g.confirm_sample(3, s.member, other, 5).is_none(),
                "under way"
            );
            let next = (other + 1) % 4;
            assert!(g.confirm_sample(3, s.member, next, 4).is_none(), "one each");
            assert!(g.confirm_sample(3, s.member, next, 5).is_some());
        }
        // Nothing to check of a contribution whose audit is open, or that
        // this witness does not audit.
        assert!(g.confirm_sample(3, bad.member, 0, 4).is_none());
        if let Some(m) = (1..6).find(|m| !mine.contains(m)) {
            assert!(g.confirm_sample(3, m, 0, 4).is_none());
        }
    }

    #[test]
    fn a_copied_root_and_every_contribution_of_a_step_too_small_to_screen_are_audited_at_once() {
        // A witness that audits member 1 at steps 2 and 4, and member 3 at
        // step 3 (found by trying each; the auditors are a seeded draw).
        let me = (0..6)
            .find(|&w| {
                let p = sharded_witness(w).policy;
                w != 1
                    && w != 3
                    && p.is_auditor(w, 2, 1)
                    && p.is_auditor(w, 3, 3)
                    && p.is_auditor(w, 4, 1)
            })
            .expect("some witness audits all three");
        let mut g = sharded_witness(me);
        let audits = |t: &[Target], m: u32| t.iter().any(|t| t.member == m);
        let sums = vec![vec![1; 8]; 4];
        // Members 1 and 2 list the same root: a copy.
        let (mut entries, mut a) = announced(&[1, 2, 3, 4]);
        entries[1].1 = entries[0].1;
        a[1].root = a[0].root;
        let (targets, samples) = g.draw_sharded(2, &entries, &a, &sums);
        assert!(audits(&targets, 1));
        assert!(samples.iter().all(|s| s.member != 1 && s.member != 2));
        // Member 3's root of step 2 listed again at step 3: a re-send.
        let (again, a2) = announced(&[3, 4, 5]);
        let (targets, _) = g.draw_sharded(3, &again, &a2, &sums);
        assert!(audits(&targets, 3));
        // Two listed: no majority to screen by, every auditor audits.
        let (two, a3) = announced(&[1, 5]);
        let two: Vec<_> = two.iter().map(|(m, _)| (*m, [40 + *m as u8; 32])).collect();
        let a3: Vec<_> = a3
            .iter()
            .map(|x| Announced {
                root: [40 + x.member as u8; 32],
                ..*x
            })
            .collect();
        let (targets, samples) = g.draw_sharded(4, &two, &a3, &sums);
        assert!(samples.is_empty());
        assert!(audits(&targets, 1));
    }

    #[test]
    fn unpinned_old_weights_go_and_the_newest_stay() {
        let kept = kept_weights(0..20, &BTreeSet::new());
        assert_eq!(kept, (20 - KEEP_WEIGHTS as u32..20).collect());
        assert_eq!(kept_weights(0..3, &BTreeSet::new()), (0..3).collect());
    }
}
