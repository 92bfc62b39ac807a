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
#[derive(Clone)]
pub(crate) enum Revealed {
    /// The encoded momentum, matching its commitment.
    Momentum(Vec<u8>),
    /// A momentum that does not hash to the commitment: a lie.
    Lied,
    /// The member answered without it.
    Refused,
    /// The member could not be reached (it may have restarted honestly).
    Unreachable,
}

/// Weight states a witness keeps to audit on (see [`Guard::weights_at`]).
/// Audits run while the trainer waits for manifests, so on a busy machine
/// one can trail its step by several applies.
pub(crate) const KEEP_WEIGHTS: usize = 8;

/// A contribution a witness audits: whose, the momentum commitment, and
/// the member's commitment at the step before when the chain is checked.
pub(crate) struct Target {
    pub(crate) member: u32,
    pub(crate) hash: [u8; 32],
    pub(crate) previous: Option<[u8; 32]>,
}

/// One side of an audit that is still downloading.
enum Wait<T> {
    Pending,
    Done(T),
}

/// A contribution drawn for audit, waiting for what its author reveals.
struct Awaited {
    c: Contribution,
    /// Why it is audited: the screen (a refusal then fails the audit), or
    /// a coin's draw.
    ground: Ground,
    own: Wait<Revealed>,
    /// The momentum committed at the step before, for the chain check.
    previous: Option<Wait<Revealed>>,
}

/// The training thread's side of proof of contribution: the screen's
/// memory, and a witness's pending audits. Who audits what is the
/// [`defence::Policy`]'s to say.
pub(crate) struct Guard {
    pub(crate) policy: Policy,
    me: u32,
    witness: bool,
    /// Signs this witness's audit coins.
    signer: ed25519::Keypair,
    /// Members' keys: what another auditor's coin is checked against.
    keys: Vec<[u8; 32]>,
    /// Payload hashes applied per step: the screen's memory of recent steps.
    pub(crate) recent: Recent,
    /// Weights after s updates, for the last few s (witnesses only). The
    /// node computes step t on the weights after t-1 updates (pipelining),
    /// so that is what an audit of step t recomputes on.
    weights_at: BTreeMap<u32, ParamSet>,
    /// Contributions drawn for audit, waiting for their momenta.
    awaiting: BTreeMap<(u32, u32), Awaited>,
    /// Audits opened, per (step, member): each is run once.
    opened: BTreeSet<(u32, u32)>,
    /// Contributions this witness audits if asked to confirm (recent
    /// steps, only those it is an auditor of).
    kept: BTreeMap<u32, BTreeMap<u32, Contribution>>,
    /// Each member's momentum commitment per recent step (witnesses only):
    /// what a chain check fetches the previous momentum against.
    commitments: BTreeMap<u32, BTreeMap<u32, [u8; 32]>>,
}

impl Guard {
    pub(crate) fn new(cfg: &NodeConfig) -> Self {
        Guard {
            policy: cfg.policy(),
            me: cfg.me,
            witness: cfg.defence.witnesses.contains(&cfg.me),
            signer: msg::keypair(&cfg.secret),
            keys: cfg.members.clone(),
            recent: BTreeMap::new(),
            weights_at: BTreeMap::new(),
            awaiting: BTreeMap::new(),
            opened: BTreeSet::new(),
            kept: BTreeMap::new(),
            commitments: BTreeMap::new(),
        }
    }

    pub(crate) fn remember(&mut self, t: &Trainer) {
        if !self.witness {
            return;
        }
        // Anything kept past this step belongs to an abandoned history.
        self.weights_at.retain(|s, _| *s < t.step());
        self.awaiting.retain(|(s, _), _| *s < t.step());
        self.opened.retain(|(s, _)| *s < t.step());
        self.kept.retain(|s, _| *s < t.step());
        self.commitments.retain(|s, _| *s < t.step());
        self.weights_at.insert(t.step(), t.params().clone());
        // A pending audit pins the weights it recomputes on: a witness that
        // falls behind audits late, it never drops the audit.
        let pinned = self.pinned();
        while self.weights_at.len() > KEEP_WEIGHTS {
            let Some(old) = self
                .weights_at
                .keys()
                .find(|s| !pinned.contains(s))
                .copied()
            else {
                break;
            };
            if Some(&old) == self.weights_at.keys().next_back() {
                break;
            }
            self.weights_at.remove(&old);
        }
    }

    /// Weight states that audits still waiting for momenta will recompute
    /// on: the step before each, and the one before that for a chain check.
    fn pinned(&self) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for ((step, _), a) in &self.awaiting {
            out.insert(step.saturating_sub(1));
            if a.previous.is_some() {
                out.insert(step.saturating_sub(2));
            }
        }
        out
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
        let verdict = audit::screen_step(layout, &refs, &window, &self.policy.audit);
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
        self.commitments.insert(
            step,
            members
                .iter()
                .zip(cs)
                .map(|(m, c)| (*m, c.momentum_hash))
                .collect(),
        );
        while self.commitments.len() > KEEP_WEIGHTS {
            self.commitments.pop_first();
        }
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
            let flagged = screen.flagged(&self.policy.audit);
            let signer = &self.signer;
            let duty = self
                .policy
                .duty(self.me, step, *member, hash, flagged, |m| {
                    signature(signer, m)
                });
            self.kept
                .entry(step)
                .or_default()
                .insert(*member, c.clone());
            if let Duty::Audit { chained, ground } = duty
                && let Some(t) = self.open(step, *member, c.clone(), ground, chained)
            {
                out.push(t);
            }
        }
        while self.kept.len() > KEEP_WEIGHTS {
            self.kept.pop_first();
        }
        out
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
        let c = self.kept.get(&step)?.get(&member)?.clone();
        let key = self.keys.get(by as usize)?;
        let hash = audit::payload_hash(&c.payload);
        if !self.policy.drawn_by(by, key, step, member, &hash, &coin) {
            return None;
        }
        self.open(step, member, c, Ground::Drawn { by, coin }, true)
    }

    fn open(
        &mut self,
        step: u32,
        member: u32,
        c: Contribution,
        ground: Ground,
        chained: bool,
    ) -> Option<Target> {
        if !self.opened.insert((step, member)) {
            return None;
        }
        let previous = step
            .checked_sub(1)
            .filter(|_| chained)
            .and_then(|s| self.commitments.get(&s)?.get(&member).copied());
        let hash = c.momentum_hash;
        self.awaiting.insert(
            (step, member),
            Awaited {
                c,
                ground,
                own: Wait::Pending,
                previous: previous.map(|_| Wait::Pending),
            },
        );
        Some(Target {
            member,
            hash,
            previous,
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
    ) -> Result<Vec<(u32, u32, Option<AuditReport>)>, String> {
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
        let mut out = Vec::new();
        for key in [(step, member), (step + 1, member)] {
            let ready = self.awaiting.get(&key).is_some_and(|a| {
                matches!(a.own, Wait::Done(_)) && !matches!(a.previous, Some(Wait::Pending))
            });
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
            c,
            ground,
            own,
            previous,
        } = a;
        let targeted = ground == Ground::Screened;
        let Wait::Done(own) = own else {
            return Ok(None);
        };
        let Some(weights) = self.weights_at.get(&step.saturating_sub(1)) else {
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
            &audit::payload_hash(&c.payload),
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
        let revealed = match own {
            Revealed::Momentum(m) => audit::decode_momentum(&m, trainer.momentum()),
            Revealed::Unreachable => return Ok(None),
            Revealed::Refused if !targeted => return Ok(None),
            Revealed::Lied | Revealed::Refused => None,
        };
        let Some(revealed) = revealed else {
            return Ok(Some(withheld));
        };
        let t0 = Instant::now();
        let (reference, _) = trainer
            .replay_on(weights, &cfg.seed, cfg.epoch, step, member, &revealed)
            .map_err(|e| e.to_string())?;
        let cmp = audit::compare(trainer.layout(), &c.payload, &reference);
        let mut report = AuditReport {
            passed: cmp.passes(&self.policy.audit),
            comparison: Some(cmp),
            ..withheld
        };
        // The chain: replay the step before from the momentum committed
        // then, on the weights it was computed on; this one must follow.
        let before = step.wrapping_sub(1);
        let chain_weights = self.weights_at.get(&before.saturating_sub(1));
        match (report.passed, previous, chain_weights) {
            (true, Some(Wait::Done(Revealed::Momentum(m))), Some(w)) => {
                if let Some(prev) = audit::decode_momentum(&m, trainer.momentum()) {
                    let (_, expected) = trainer
                        .replay_on(w, &cfg.seed, cfg.epoch, before, member, &prev)
                        .map_err(|e| e.to_string())?;
                    let err = audit::chain_error(&revealed, &expected);
                    report.chain_error = Some(err);
                    report.passed = err <= self.policy.audit.max_chain_error;
                }
            }
            // Lying about, or withholding, a signed commitment of a flagged
            // payload's history is as bad as withholding its own: the chain
            // cannot be followed.
            (true, Some(Wait::Done(Revealed::Lied | Revealed::Refused)), _) => {
                report.chain_error = Some(f32::INFINITY);
                report.passed = false;
            }
            _ => {}
        }
        report.secs = t0.elapsed().as_secs_f64();
        Ok(Some(report))
    }
}
