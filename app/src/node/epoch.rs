//! One epoch of training as one member: the engine's configuration from
//! the chain's view of the epoch, the run itself, and what its events mean
//! for the operator (points credited, words shown, fraud votes sent).

use super::OperatorConfig;
use super::local::Local;
use super::report::{OperatorEvent, Report, StepProgress, say};
use crate::chain::Chain;
use crate::fraud;
use anyhow::{Context, Result, anyhow, bail};
use cohort_engine::audit::AuditConfig;
use cohort_engine::backend::{self, BackendChoice};
use cohort_engine::data::Corpus;
use cohort_engine::defence::Ground;
use cohort_engine::net::node::{self as p2p, Control, Defence, NodeConfig, NodeEvent};
use cohort_engine::net::shaper::Link;
use cohort_engine::net::step::Timing;
use cohort_engine::net::swarm;
use cohort_engine::recipe;
use cohort_program::state::{Epoch, Job};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};
use std::path::Path;
use std::time::Duration;

/// Everything one epoch's training needs, read from the chain and the
/// operator's settings before it starts.
pub(super) struct EpochRun<'a> {
    pub chain: &'a Chain,
    pub me: &'a Keypair,
    pub o: &'a OperatorConfig,
    pub report: Report<'a>,
    pub job: &'a Pubkey,
    pub j: &'a Job,
    /// The epoch's index and its account.
    pub e: u32,
    pub epoch: &'a Epoch,
    /// The epoch's members by index, and this node's index among them.
    pub members: &'a [Pubkey],
    pub index: u32,
    /// This job's folder: the checkpoint and the local record.
    pub dir: &'a Path,
    pub corpus: &'a Corpus,
}

impl EpochRun<'_> {
    /// The engine's configuration for this epoch: the job's recipe, the
    /// members' addresses, and the defence the chain seated.
    fn config(&self) -> Result<NodeConfig> {
        let (j, job, e, o) = (self.j, self.job, self.e, self.o);
        if self.corpus.id != j.spec.dataset_id {
            bail!("job {job} trains on a dataset this node does not have");
        }
        let spe = j.spec.steps_per_epoch;
        let train = recipe::check(&j.spec).with_context(|| format!("job {job}"))?;
        let addr = |i: usize| format!("/ip4/{}/tcp/{}", o.p2p_host, o.p2p_port as usize + i);
        let mut bootstrap = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if i as u32 == self.index {
                continue;
            }
            let id = swarm::peer_id(&m.to_bytes()).context("member key is not an ed25519 key")?;
            bootstrap.push(format!("{}/p2p/{id}", addr(i)).parse()?);
        }
        let job_bytes = job.to_bytes();
        // The epoch's witnesses (seated by key at the seal) audit; a quorum
        // of their accusations slashes.
        let witnesses: Vec<u32> = self
            .epoch
            .seated()
            .filter_map(|(_, w)| self.members.iter().position(|m| m == w))
            .map(|i| i as u32)
            .collect();
        let checkpoint = self.dir.join("checkpoint.bin");
        // The one rule for every job: all-to-all below 10 members.
        let exchange = cohort_engine::net::exchange::plan_for(self.members.len(), &train);
        Ok(NodeConfig {
            train,
            job: job_bytes,
            epoch: e,
            seed: self.epoch.seed,
            init_seed: cohort_engine::runner::epoch_seed(&job_bytes, u32::MAX),
            members: self.members.iter().map(|m| m.to_bytes()).collect(),
            me: self.index,
            secret: *self.me.secret_bytes(),
            listen: vec![addr(self.index as usize).parse()?],
            bootstrap,
            steps: (e + 1) * spe,
            // A member that joined a running job has no state of its own
            // from the last epoch: it downloads the members' state instead.
            join: e > 0 && !checkpoint.exists(),
            checkpoint: Some(checkpoint),
            link: Link::new(0.0, Duration::ZERO),
            timing: Timing::default(),
            mdns: false,
            min_peers: 0,
            epoch_start: Some(e * spe),
            pause: o.pause.clone(),
            release_memory_when_paused: o.release_memory_when_paused,
            defence: Defence {
                audit: AuditConfig {
                    quorum: j.spec.quorum as usize,
                    rate: f64::from(j.spec.audit_rate_bp) / 10_000.0,
                    ..AuditConfig::default()
                },
                witnesses,
                adversary: o.adversary,
                // Each witness votes on chain by itself (see `fraud`).
                cosigner: None,
            },
            spill_above: p2p::SPILL_ABOVE,
            gossip_signing: Default::default(),
            exchange,
        })
    }

    /// Trains the epoch; the model hash and loss of its last step. Points
    /// are credited to `local` (and saved) after every applied step.
    pub async fn train(&self, local: &mut Local) -> Result<([u8; 32], f32)> {
        let (e, report, members) = (self.e, self.report, self.members);
        let my_index = self.index;
        let pk = self.me.pubkey();
        let cfg = self.config()?;
        let spe = self.j.spec.steps_per_epoch;
        say(
            report,
            &pk,
            format!(
                "epoch {e}: training steps {}..{} as member {} of {}",
                e * spe,
                (e + 1) * spe,
                self.index,
                members.len()
            ),
        );
        let engine = match self.o.device {
            BackendChoice::Cpu => backend::cpu(),
            choice => {
                let s = backend::select(choice).map_err(|e| anyhow!("training device: {e}"))?;
                say(report, &pk, &s.reason);
                s.engine
            }
        };
        let mut last_hash = None;
        let mut last_loss = f32::NAN;
        let mut failure = None;
        // This witness's fraud votes go to a task of their own, so training
        // never waits on the chain; the epoch ends only once they are sent.
        let (cases, case_rx) = tokio::sync::mpsc::unbounded_channel::<fraud::Case>();
        let (control, control_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut voted_against = std::collections::BTreeSet::new();
        let reporter = self.send_votes(case_rx);
        let training = async {
            let out =
                p2p::run_with_control(cfg, self.corpus.clone(), engine, Some(control_rx), |ev| {
                    if let Some(line) = describe(ev) {
                        say(report, &pk, line);
                    }
                    match ev {
                        NodeEvent::Applied {
                            step,
                            model_hash,
                            contributors,
                            credits,
                            loss,
                            times,
                        } => {
                            last_hash = Some(*model_hash);
                            last_loss = *loss;
                            if local.credit(e, members, credits)
                                && let Err(err) = local.save(self.dir)
                            {
                                failure.get_or_insert(err);
                            }
                            report(
                                &pk,
                                OperatorEvent::Step(StepProgress {
                                    epoch: e,
                                    done: (step + 1).saturating_sub(e * spe),
                                    of: spe,
                                    loss: *loss,
                                    contributors: contributors.len(),
                                    compute: times.compute,
                                    comm: times.comm + times.wait,
                                }),
                            );
                        }
                        // A loaded state (a restart's download, a rewind)
                        // brings the epoch's credits as every member on
                        // this history has them, the steps this node did
                        // not apply itself included.
                        NodeEvent::Synced { credits, .. } | NodeEvent::Rewound { credits, .. }
                            if local.credit(e, members, credits) =>
                        {
                            if let Err(err) = local.save(self.dir) {
                                failure.get_or_insert(err);
                            }
                        }
                        NodeEvent::Links(l) => report(&pk, OperatorEvent::Links(l)),
                        NodeEvent::Diverged { step } => {
                            failure.get_or_insert(anyhow!(
                                "model diverged from the job's at step {step}"
                            ));
                        }
                        NodeEvent::Audited(r) => report(&pk, OperatorEvent::Audit(r)),
                        // Every accusation this witness makes (a failed
                        // audit, or proof against a leader) is its vote on
                        // chain, once per member.
                        NodeEvent::Accused {
                            member, evidence, ..
                        } if voted_against.insert(*member) => {
                            let _ = cases.send(fraud::Case {
                                accused: *member,
                                evidence: *evidence,
                            });
                        }
                        // Votes go on chain one by one, so the node need not
                        // stay up as the lead of a co-signed report.
                        NodeEvent::Slashed {
                            member, witnesses, ..
                        } => {
                            if *member == my_index {
                                report(
                                    &pk,
                                    OperatorEvent::Convicted {
                                        witnesses: witnesses.len(),
                                    },
                                );
                            }
                            let _ = control.send(Control::Settled { member: *member });
                        }
                        _ => {}
                    }
                })
                .await;
            // Ends the reporter once the reports asked for are sent.
            drop(cases);
            out
        };
        let (out, ()) = tokio::join!(training, reporter);
        let stats = out.map_err(|err| anyhow!("training epoch {e}: {err}"))?;
        if stats.audits > 0 {
            say(
                report,
                &pk,
                format!(
                    "epoch {e}: audited {} contributions as a witness, {} failed; audits took {:.2} s, {:.1}% of this node's training compute",
                    stats.audits,
                    stats.audits_failed,
                    stats.audit_secs,
                    100.0 * stats.audit_secs / stats.compute_secs.max(1e-9)
                ),
            );
        }
        if let Some(err) = failure {
            return Err(err);
        }
        let hash = last_hash.ok_or_else(|| anyhow!("epoch {e} applied no step"))?;
        Ok((hash, last_loss))
    }

    /// Sends this witness's fraud votes as they come (three tries each),
    /// saying what each did.
    async fn send_votes(&self, mut cases: tokio::sync::mpsc::UnboundedReceiver<fraud::Case>) {
        let pk = self.me.pubkey();
        let quorum = self.j.spec.quorum;
        while let Some(case) = cases.recv().await {
            let mut outcome = Err(anyhow!("not sent"));
            for _ in 0..3 {
                outcome =
                    fraud::vote(self.chain, self.me, self.job, self.e, self.members, &case).await;
                if outcome.is_ok() {
                    break;
                }
            }
            let line = match outcome {
                Ok(fraud::Voted::Slashed) => format!(
                    "reported member {} on chain: a quorum of {quorum} witnesses voted, slashed",
                    case.accused
                ),
                Ok(fraud::Voted::Recorded) => format!(
                    "voted against member {} on chain (a quorum of {quorum} slashes)",
                    case.accused
                ),
                Err(err) => format!("could not report member {}: {err:#}", case.accused),
            };
            say(self.report, &pk, line);
        }
    }
}

/// The words an operator sees for an engine event, when it has any.
pub(super) fn describe(ev: &NodeEvent) -> Option<String> {
    Some(match ev {
        NodeEvent::Rewound { step, .. } => {
            format!("a better manifest turned up: applying again from step {step}")
        }
        NodeEvent::ForgedEntry {
            step,
            leader,
            member,
        } => format!(
            "member {leader} led step {step} listing bytes under member {member}'s name \
             that {member} never signed: skipped, evidence against the leader"
        ),
        NodeEvent::WrongStateHash { step, leader } => format!(
            "member {leader} led step {step} with a state hash nobody else has: \
             its manifest was applied, the mismatch kept as evidence against it"
        ),
        NodeEvent::Audited(r) if !r.passed => {
            // The chain is checked only after the recomputation passed.
            let why = match (r.comparison, r.chain_error) {
                (None, _) => "withheld or misstated its momentum",
                (Some(_), None) => "does not match its recomputation",
                (Some(_), Some(_)) => "rests on a momentum that does not follow from its last one",
            };
            format!(
                "audit: member {}'s step {} {why}: accused",
                r.member, r.step
            )
        }
        NodeEvent::Accused {
            member,
            step,
            ground: Ground::Equivocation,
            ..
        } => format!("member {member} signed two different manifests for step {step}: accused"),
        NodeEvent::Accused {
            member,
            step,
            ground: Ground::ForgedEntry,
            ..
        } => format!(
            "member {member} led step {step} with bytes another member never signed: accused"
        ),
        NodeEvent::Accused {
            member,
            step,
            ground: Ground::ForeignBasis,
            ..
        } => format!(
            "member {member} led step {step} listing its own work computed on another state: accused"
        ),
        NodeEvent::Slashed {
            member, witnesses, ..
        } => format!("member {member} convicted by witnesses {witnesses:?}: dropped from the job"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_protocol_events_have_no_words_and_proof_against_a_leader_names_it() {
        assert_eq!(
            describe(&NodeEvent::Synced {
                step: 3,
                resumed: false,
                credits: vec![3, 3],
            }),
            None
        );
        assert_eq!(
            describe(&NodeEvent::Omitted {
                step: 1,
                leader: 2,
                member: 0
            }),
            None
        );
        let line = describe(&NodeEvent::Accused {
            member: 2,
            step: 5,
            evidence: [0; 32],
            ground: Ground::Equivocation,
        })
        .unwrap();
        assert!(
            line.contains("member 2") && line.contains("step 5"),
            "{line}"
        );
        // A failed audit's accusation is worded by its audit, not twice.
        assert_eq!(
            describe(&NodeEvent::Accused {
                member: 2,
                step: 5,
                evidence: [0; 32],
                ground: Ground::Screened,
            }),
            None
        );
    }
}
