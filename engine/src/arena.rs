//! N members in one process, some of them adversaries, with the defences
//! every honest node runs: the screen, audits by witnesses, slashing, and
//! robust aggregation. What the robustness tests and `cohort-bench
//! adversary` run.
//!
//! Per step: members compute (attackers forge, seeing every honest payload
//! first); every node screens the step's payloads identically; flagged ones
//! get no vote this step, and among byte-identical payloads only one votes.
//! Who audits what is [`crate::defence`]'s to say, as on the network:
//! flagged contributions by each of their `quorum` auditors, others when an
//! auditor's coin draws them, confirmed by the other auditors if the first
//! audit fails; `quorum` failures on the same evidence slash the member: it
//! gets no vote from then on (on chain, `report_fraud`). The witnesses are
//! the honest members; one engine recomputes for all of them.
//!
//! A flagged payload that passes its one-step audit also gets the momentum
//! chain check (see [`crate::audit`]): the witness replays the member's
//! previous step from its previous revealed momentum, on the weights of
//! that step, and the momentum revealed now must follow.
//!
//! A slashed member's seat stays empty, or, with [`ArenaConfig::standby`],
//! is taken by an honest newcomer some epochs later, as a `cohort node`
//! waiting for work joins any open job it qualifies for: the newcomer
//! starts from the shared weights with no momentum, on the seat's data.
//!
//! Limits, stated plainly: witnesses here are honest (colluding witnesses
//! are what the on-chain quorum is for, and are not modelled).

use crate::adversary::{self, Attack, Mode};
use crate::audit::{self, AuditConfig, Comparison};
use crate::backend::GradientEngine;
use crate::compress::{Draw, Payload};
use crate::data::Corpus;
use crate::defence::{self, Accusation, Duty, Policy, Tally};
use crate::error::EngineError;
use crate::net::msg;
use crate::params::ParamSet;
use crate::runner::{RunConfig, epoch_seed, member_key};
use crate::trainer::{Identity, Trainer};
use crate::wire::Contribution;
use libp2p::identity::ed25519;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct ArenaConfig {
    pub run: RunConfig,
    /// Member index → its attack. Everyone else is honest.
    pub adversaries: BTreeMap<usize, Mode>,
    pub audit: AuditConfig,
    /// Off: plain majority vote with no screen, audits or slashing (what
    /// the defences are measured against).
    pub defend: bool,
    /// Relative noise the witness adds to recomputed gradients, standing
    /// in for another GPU's rounding (0 = same hardware).
    pub witness_jitter: f32,
    /// Micro-batch the witness computes with (0 = the job's): another
    /// summation order, so other rounding, like another GPU.
    pub witness_micro_batch: usize,
    /// Epochs after the epoch of a slash at which an honest newcomer takes
    /// the seat (None: it stays empty).
    pub standby: Option<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct ArenaReport {
    pub final_val_loss: f32,
    pub val_curve: Vec<(u32, f32)>,
    /// Member → step at which it was slashed.
    pub slashed: BTreeMap<usize, u32>,
    /// Seat → step from which an honest newcomer held it.
    pub refilled: BTreeMap<usize, u32>,
    /// Honest members slashed (must stay 0).
    pub false_accusations: usize,
    pub audits: usize,
    /// Of which drawn by the screen rather than at random.
    pub targeted: usize,
    pub failed_audits: usize,
    /// Lowest score any honest member's audit got.
    pub worst_honest: Option<Comparison>,
    /// Momentum chain checks run, how many failed, and the largest chain
    /// error an honest member's check measured.
    pub chain_checks: usize,
    pub chain_failed: usize,
    pub worst_honest_chain: Option<f32>,
    /// The smallest chain error an attacker's check measured.
    pub least_attacker_chain: Option<f32>,
    /// Honest members' payloads the screen flagged (each then audited).
    pub honest_flagged: usize,
    /// Gradient compute of the members' own contributions, and of audits.
    pub train_secs: f64,
    pub audit_secs: f64,
}

impl ArenaReport {
    /// Extra compute audits cost, as a share of training compute.
    pub fn audit_overhead(&self) -> f64 {
        self.audit_secs / self.train_secs.max(1e-9)
    }
}

/// Runs `cfg` with one engine per member plus one for the witness.
pub fn run(
    cfg: &ArenaConfig,
    corpus: &Corpus,
    engines: Vec<Box<dyn GradientEngine>>,
    witness_engine: Box<dyn GradientEngine>,
) -> Result<ArenaReport, EngineError> {
    let run = &cfg.run;
    if engines.len() != run.members {
        return Err(EngineError::Config(format!(
            "{} engines for {} members",
            engines.len(),
            run.members
        )));
    }
    if let Some(&bad) = cfg.adversaries.keys().find(|&&i| i >= run.members) {
        return Err(EngineError::Config(format!(
            "adversary {bad} is not one of {} members",
            run.members
        )));
    }
    let init = epoch_seed(&run.job, u32::MAX);
    let identity = |i: usize| Identity {
        job: run.job,
        member: member_key(i),
        index: i as u32,
    };
    let mut trainers = engines
        .into_iter()
        .enumerate()
        .map(|(i, e)| Trainer::new(run.train, &init, corpus.clone(), e, identity(i)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut witness_train = run.train;
    if cfg.witness_micro_batch > 0 {
        witness_train.micro_batch = cfg.witness_micro_batch;
    }
    let mut witness = Trainer::new(
        witness_train,
        &init,
        corpus.clone(),
        witness_engine,
        identity(0),
    )?;
    // The witnesses are the honest members, each with a key of its own for
    // its audit coins.
    let witnesses: Vec<u32> = (0..run.members as u32)
        .filter(|w| !cfg.adversaries.contains_key(&(*w as usize)))
        .collect();
    let witness_keys: Vec<ed25519::Keypair> = (0..run.members as u32)
        .map(|w| {
            let mut h = blake3::Hasher::new();
            h.update(b"cohort-arena-witness");
            h.update(&run.job);
            h.update(&w.to_le_bytes());
            msg::keypair(h.finalize().as_bytes())
        })
        .collect();
    let mut report = ArenaReport::default();
    let mut first_sent: BTreeMap<usize, Payload> = BTreeMap::new();
    let mut recent: Vec<[u8; 32]> = Vec::new();
    // Each member's revealed momentum at the previous step (if it computed
    // then) with the payload it sent, and the weights that step was
    // computed on: the chain check's starting point.
    let mut last_revealed: BTreeMap<usize, (Vec<Vec<f32>>, Payload)> = BTreeMap::new();
    let mut last_weights: Option<ParamSet> = None;
    for step in 0..run.steps {
        // Only audits replay an earlier step.
        let weights_now = cfg.defend.then(|| witness.params().clone());
        let epoch = step / run.steps_per_epoch.max(1);
        let seed = epoch_seed(&run.job, epoch);
        // A slashed seat taken by a newcomer from this epoch on.
        if let Some(after) = cfg.standby {
            let due: Vec<usize> = report
                .slashed
                .iter()
                .filter(|(i, at)| {
                    !report.refilled.contains_key(i)
                        && epoch >= *at / run.steps_per_epoch.max(1) + after
                })
                .map(|(i, _)| *i)
                .collect();
            for i in due {
                trainers[i].reset_momentum();
                first_sent.remove(&i);
                last_revealed.remove(&i);
                report.refilled.insert(i, step);
            }
        }
        let refilled: BTreeSet<usize> = report.refilled.keys().copied().collect();
        let active: Vec<usize> = (0..run.members)
            .filter(|i| !report.slashed.contains_key(i) || refilled.contains(i))
            .collect();
        // 1. Compute, in parallel as separate machines would. The momentum
        //    before the step is what a member reveals if audited. A
        //    newcomer in an attacker's seat is honest.
        let mode = |i: usize| {
            if refilled.contains(&i) {
                None
            } else {
                cfg.adversaries.get(&i).copied()
            }
        };
        let computed: Vec<Option<Computed>> = std::thread::scope(|s| {
            let handles: Vec<_> = trainers
                .iter_mut()
                .enumerate()
                .map(|(i, t)| {
                    let computes = active.contains(&i)
                        && mode(i).is_none_or(|m| m.computes(!first_sent.contains_key(&i)));
                    let scale = mode(i).map_or(1.0, Mode::grad_scale);
                    let seed = &seed;
                    let forger = mode(i) == Some(Mode::ForgedMomentum);
                    s.spawn(move || {
                        if !computes {
                            return Ok(None);
                        }
                        let before = t.momentum().to_vec();
                        let (c, stats) = t.compute_scaled(seed, epoch, step, scale)?;
                        // What it reveals: its real momentum, or one forged
                        // so its flipped payload recomputes exactly.
                        let revealed = if forger {
                            let (_, g) = t.gradients_for(seed, epoch, step)?;
                            adversary::forged_momentum(&before, &g, t.decay())
                        } else {
                            before
                        };
                        Ok(Some((revealed, c, stats.compute_secs)))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(EngineError::Backend("member thread panicked".into()))
                    })
                })
                .collect::<Result<Vec<_>, EngineError>>()
        })?;
        report.train_secs += computed.iter().flatten().map(|c| c.2).sum::<f64>();
        // 2. Attackers forge, seeing every honest payload of the step.
        let honest: Vec<&Payload> = active
            .iter()
            .filter(|i| mode(**i).is_none())
            .filter_map(|i| computed[*i].as_ref().map(|c| &c.1.payload))
            .collect();
        let layout = trainers[0].layout().clone();
        let crew: Vec<usize> = active
            .iter()
            .copied()
            .filter(|i| mode(*i).is_some())
            .collect();
        let mut sent: Vec<(usize, Payload)> = Vec::with_capacity(active.len());
        for &i in &active {
            let own = computed[i].as_ref().map(|c| &c.1.payload);
            let payload = match mode(i) {
                None => own.cloned().unwrap_or_default(),
                Some(m) => {
                    let mut s =
                        *blake3::hash(&[&seed[..], &step.to_le_bytes(), &i.to_le_bytes()].concat())
                            .as_bytes();
                    s[31] ^= 0x5a;
                    adversary::forge(
                        m,
                        &Attack {
                            layout: &layout,
                            honest: &honest,
                            own,
                            first: first_sent.get(&i),
                            seed: s,
                            crew: crew.len(),
                            rank: crew.iter().position(|c| *c == i).unwrap_or(0),
                        },
                    )
                }
            };
            // Under the shared rule only signs at the step's drawn
            // positions travel: a forger's payload arrives as the signs it
            // meant for those positions (the strongest reading of its
            // intent), whatever other positions it named.
            let payload = payload.as_sent(&layout, Draw::for_step(&run.job, step));
            first_sent.entry(i).or_insert_with(|| payload.clone());
            sent.push((i, payload));
        }
        // 3. The screen and the step's weights, identical on every node.
        let refs: Vec<&Payload> = sent.iter().map(|s| &s.1).collect();
        let audit::StepScreen {
            screens,
            hashes,
            mut weights,
        } = audit::screen_step(&layout, &refs, &recent);
        if !cfg.defend {
            weights.fill(1);
        }
        recent.extend(hashes.iter().copied());
        let keep = audit::RECENT_STEPS as usize * run.members;
        if recent.len() > keep {
            recent.drain(..recent.len() - keep);
        }
        // 4. Audits, on the weights the contributions were computed on, as
        //    the defence policy assigns them (the same module and seeds as
        //    the network node): a flagged contribution by each of its
        //    auditors, one drawn by an auditor's coin first by that auditor
        //    and, if it fails, by the others to confirm.
        if cfg.defend {
            let policy = Policy {
                audit: cfg.audit,
                witnesses: (0..run.members as u32)
                    .filter(|w| {
                        let w = *w as usize;
                        (witnesses.contains(&(w as u32)) && !report.slashed.contains_key(&w))
                            || report.refilled.contains_key(&w)
                    })
                    .collect(),
                seed,
                job: run.job,
                epoch,
            };
            for (j, (i, payload)) in sent.iter().enumerate() {
                let member = *i as u32;
                let flagged = screens[j].needs_audit();
                let auditors = policy.auditors(step, member);
                let duties: Vec<(u32, Duty)> = auditors
                    .iter()
                    .map(|&a| {
                        let key = &witness_keys[a as usize];
                        let duty = policy.duty(a, step, member, &hashes[j], flagged, |m| {
                            defence::signature(key, m)
                        });
                        (a, duty)
                    })
                    .collect();
                let Some(&(first, Duty::Audit { chained, ground })) =
                    duties.iter().find(|(_, d)| matches!(d, Duty::Audit { .. }))
                else {
                    continue;
                };
                report.audits += 1;
                report.targeted += usize::from(flagged);
                if mode(*i).is_none() && flagged {
                    report.honest_flagged += 1;
                }
                // A member that computed nothing reveals a zero momentum.
                let revealed = computed[*i]
                    .as_ref()
                    .map_or_else(|| zeros(&trainers[*i]), |c| c.0.clone());
                let prev_step = step.checked_sub(1);
                let previous = || match (prev_step, &last_weights, last_revealed.get(i)) {
                    (Some(s), Some(w), Some((m, sent))) => Some(Previous {
                        weights: w,
                        seed: epoch_seed(&run.job, s / run.steps_per_epoch.max(1)),
                        epoch: s / run.steps_per_epoch.max(1),
                        momentum: m,
                        sent,
                    }),
                    _ => None,
                };
                let case = |chained: bool| Audited {
                    seed: &seed,
                    epoch,
                    step,
                    member: *i,
                    momentum: &revealed,
                    sent: payload,
                    previous: previous().filter(|_| chained),
                };
                let evidence = audit::evidence_id(&run.job, epoch, step, member, &hashes[j]);
                let mut tally = Tally::default();
                // Who audits, in order: the first auditor, then (flagged)
                // every other auditor, or (drawn) the others only once the
                // first audit failed.
                let mut order = vec![(first, chained)];
                order.extend(auditors.iter().filter(|a| **a != first).map(|a| (*a, true)));
                let mut convicted = false;
                for (k, (auditor, chained)) in order.into_iter().enumerate() {
                    let verdict = case(chained).check(&mut witness, cfg, &mut report.audit_secs)?;
                    if k == 0 {
                        note_first_audit(&mut report, &verdict, mode(*i).is_none(), &cfg.audit);
                    }
                    if verdict.passes(&cfg.audit) {
                        if flagged {
                            continue;
                        }
                        break;
                    }
                    if k == 0 {
                        report.failed_audits += 1;
                    }
                    let accusation = Accusation {
                        witness: auditor,
                        accused: member,
                        step,
                        evidence,
                        ground,
                    };
                    convicted |= matches!(tally.add(&policy, &accusation), Ok(Some(_)));
                }
                if convicted {
                    // A newcomer convicted leaves its seat empty again.
                    report.refilled.remove(i);
                    report.slashed.insert(*i, step);
                    if mode(*i).is_none() {
                        report.false_accusations += 1;
                    }
                }
            }
        }
        // 5. Every node applies the same weighted contributions.
        let contributions: Vec<Contribution> = sent
            .iter()
            .map(|(i, payload)| Contribution {
                job: run.job,
                epoch,
                step,
                member: member_key(*i),
                train_loss: 0.0,
                momentum_hash: [0; 32],
                // One history: every member computed on the same state.
                basis: [0; 32],
                payload: payload.clone(),
            })
            .collect();
        for t in trainers.iter_mut().chain(std::iter::once(&mut witness)) {
            t.apply_weighted(&contributions, &weights)?;
        }
        let mut sent_by: BTreeMap<usize, Payload> = sent.into_iter().collect();
        last_revealed = computed
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, (c?.0, sent_by.remove(&i)?))))
            .collect();
        last_weights = weights_now;
        let last = step + 1 == run.steps;
        if run.eval_windows > 0
            && (last || (run.eval_every > 0 && (step + 1) % run.eval_every == 0))
        {
            let v = witness.validation_loss(run.eval_windows)?;
            report.val_curve.push((step + 1, v));
            report.final_val_loss = v;
        }
    }
    Ok(report)
}

/// Records what the first audit of a contribution measured.
fn note_first_audit(report: &mut ArenaReport, verdict: &Verdict, honest: bool, cfg: &AuditConfig) {
    let c = verdict.comparison;
    if let Some(err) = verdict.chain_error {
        report.chain_checks += 1;
        report.chain_failed += usize::from(err > cfg.max_chain_error);
        if honest {
            let worst = report.worst_honest_chain.get_or_insert(err);
            *worst = worst.max(err);
        } else {
            let least = report.least_attacker_chain.get_or_insert(err);
            *least = least.min(err);
        }
    }
    if honest {
        let worst = report.worst_honest.get_or_insert(c);
        if c.overlap < worst.overlap || c.agreement < worst.agreement {
            *worst = Comparison {
                overlap: c.overlap.min(worst.overlap),
                agreement: c.agreement.min(worst.agreement),
            };
        }
    }
}

/// A member's work for one step: the momentum it reveals if audited (before
/// the step), its contribution, and the compute seconds.
type Computed = (Vec<Vec<f32>>, Contribution, f64);

fn zeros(t: &Trainer) -> Vec<Vec<f32>> {
    t.momentum().iter().map(|m| vec![0.0; m.len()]).collect()
}

/// One contribution under audit: what the member sent and revealed.
struct Audited<'a> {
    seed: &'a [u8; 32],
    epoch: u32,
    step: u32,
    member: usize,
    momentum: &'a [Vec<f32>],
    sent: &'a Payload,
    /// The member's previous step, for the chain check (flagged payloads
    /// whose author computed the step before).
    previous: Option<Previous<'a>>,
}

/// A member's previous step as a witness replays it.
struct Previous<'a> {
    weights: &'a ParamSet,
    seed: [u8; 32],
    epoch: u32,
    momentum: &'a [Vec<f32>],
    /// The payload sent then: the coefficients that left its momentum.
    sent: &'a Payload,
}

/// One witness's decision on one contribution.
struct Verdict {
    comparison: Comparison,
    /// Set when the chain was checked.
    chain_error: Option<f32>,
}

impl Verdict {
    fn passes(&self, cfg: &AuditConfig) -> bool {
        self.comparison.passes(cfg) && self.chain_error.is_none_or(|e| e <= cfg.max_chain_error)
    }
}

impl Audited<'_> {
    /// One witness's audit; its compute time is added to `secs`. The chain
    /// is checked only when the one-step audit passes: a payload that
    /// fails it is decided already.
    fn check(
        &self,
        witness: &mut Trainer,
        cfg: &ArenaConfig,
        secs: &mut f64,
    ) -> Result<Verdict, EngineError> {
        let t0 = Instant::now();
        let index = self.member as u32;
        let noise = |grads: &mut [Vec<f32>], step: u32| {
            if cfg.witness_jitter > 0.0 {
                jitter(grads, cfg.witness_jitter, step ^ index << 16);
            }
        };
        let (_, mut grads) = witness.member_gradients(self.seed, self.epoch, self.step, index)?;
        noise(&mut grads, self.step);
        let (again, _) = witness.compress_from(self.momentum, &grads, self.step)?;
        let comparison = audit::compare(witness.layout(), self.sent, &again);
        let mut chain_error = None;
        if let Some(p) = self
            .previous
            .as_ref()
            .filter(|_| comparison.passes(&cfg.audit))
        {
            let before = self.step - 1;
            let (_, mut grads) =
                witness.member_gradients_on(p.weights, &p.seed, p.epoch, before, index)?;
            noise(&mut grads, before);
            chain_error = Some(match witness.follow_from(p.momentum, &grads, p.sent) {
                Ok(expected) => audit::chain_error(self.momentum, &expected, &grads),
                // A payload that fits no model names no coefficients to
                // follow: the chain cannot be followed.
                Err(EngineError::Shape(_)) => f32::INFINITY,
                Err(e) => return Err(e),
            });
        }
        *secs += t0.elapsed().as_secs_f64();
        Ok(Verdict {
            comparison,
            chain_error,
        })
    }
}

/// Multiplies every value by (1 + u·scale), u uniform in [-1, 1].
fn jitter(grads: &mut [Vec<f32>], scale: f32, seed: u32) {
    let mut x = u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for g in grads.iter_mut().flatten() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let u = (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        *g *= 1.0 + u * scale;
    }
}
