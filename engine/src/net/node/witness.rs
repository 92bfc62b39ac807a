//! A witness's network side: fetching the momenta its audits need,
//! accusing (on a failed audit or on proof it holds), counting accusations
//! under the defence policy, and the application's co-signing rounds.

use super::gossip::acceptance;
use super::*;

/// How a momentum request ended without the momentum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Failed {
    /// The member answered without it, or with bytes that do not fit.
    Answered,
    /// Sent, and unanswered by its deadline (or the transport's).
    TimedOut,
    /// Never reached the member: no address, a failed dial, a connection
    /// that closed, a protocol it does not speak.
    Undelivered,
}

impl Net {
    /// Starts downloading the momentum `member` committed to (`hash`) at
    /// `step`, unless that download is already under way.
    pub(super) fn fetch_momentum(&mut self, step: u32, member: u32, hash: [u8; 32]) {
        if self.reveals.contains_key(&(step, member)) {
            return;
        }
        let r = Reveal {
            hash,
            buf: Vec::new(),
            tries: 0,
            progress: Instant::now(),
            retry_at: None,
            refused: false,
            silent: 0,
        };
        self.reveals.insert((step, member), r);
        self.ask_momentum(step, member, 0);
    }

    /// Asks `member` for (the rest of) the momentum behind its contribution
    /// to `step`.
    pub(super) fn ask_momentum(&mut self, step: u32, member: u32, offset: u64) {
        let req = Request::Momentum { step, offset };
        if !self.ask(member, req, Pending::Momentum { step, member }) {
            self.reveal_failed(step, member, Failed::Undelivered);
        }
    }

    /// Whether this node holds an open connection to `member`.
    fn connected(&self, member: u32) -> bool {
        self.peers
            .get(member as usize)
            .copied()
            .flatten()
            .is_some_and(|p| self.swarm.is_connected(&p))
    }

    /// A momentum request failed. A member that answered without it (or
    /// sent bytes that do not fit) is asked again from the start, up to 3
    /// times; one that did not answer is asked again (resuming after the
    /// bytes already received) until `AUDIT_PATIENCE` has passed with no
    /// chunk received: a busy or restarting member gets time, and a cheat
    /// gains nothing by going quiet (the audit waits). Then the reveal is
    /// given up (see [`given_up`]).
    pub(super) fn reveal_failed(&mut self, step: u32, member: u32, why: Failed) {
        let connected = self.connected(member);
        let Some(r) = self.reveals.get_mut(&(step, member)) else {
            return;
        };
        r.tries += 1;
        match why {
            Failed::Answered => {
                r.refused = true;
                r.buf.clear();
            }
            Failed::TimedOut if connected => r.silent += 1,
            Failed::TimedOut | Failed::Undelivered => {}
        }
        tracing::debug!(
            me = self.cfg.me,
            member,
            step,
            tries = r.tries,
            ?why,
            connected,
            "momentum fetch failed"
        );
        if !r.refused {
            if r.progress.elapsed() < AUDIT_PATIENCE {
                r.retry_at = Some(Instant::now() + Duration::from_secs(r.tries.min(5) as u64));
                return;
            }
        } else if r.tries < 3 {
            let req = Request::Momentum { step, offset: 0 };
            if self.ask(member, req, Pending::Momentum { step, member }) {
                return;
            }
        }
        if let Some(r) = self.reveals.remove(&(step, member)) {
            // Silent means: unanswered on an open connection, and still
            // heard and connected now.
            let heard = self
                .machine
                .heard_within(self.now(), member, self.heard_window());
            let silent = r.silent > 0 && heard && connected;
            let outcome = given_up(r.refused, silent);
            tracing::debug!(me = self.cfg.me, member, step, ?outcome, "reveal given up");
            let _ = self.to_trainer.send(ToTrainer::Audit {
                step,
                member,
                outcome,
            });
        }
    }

    /// Asks again for the momenta whose last try went unanswered, once
    /// their wait is over, from where the download stopped.
    pub(super) fn retry_reveals(&mut self) {
        let now = Instant::now();
        let due: Vec<(u32, u32, u64)> = self
            .reveals
            .iter_mut()
            .filter(|(_, r)| r.retry_at.is_some_and(|t| t <= now))
            .map(|(k, r)| {
                r.retry_at = None;
                (k.0, k.1, r.buf.len() as u64)
            })
            .collect();
        for (step, member, offset) in due {
            self.ask_momentum(step, member, offset);
        }
    }

    pub(super) fn on_momentum_chunk(
        &mut self,
        step: u32,
        member: u32,
        total: u64,
        offset: u64,
        chunk: Vec<u8>,
    ) {
        let Some(r) = self.reveals.get_mut(&(step, member)) else {
            return;
        };
        // An honest member serves full parts of one blob, and a momentum
        // has exactly the model's size: anything else is a trickle or
        // nonsense, not progress.
        let end = offset + chunk.len() as u64;
        if total != self.momentum_len
            || !msg::part_continues(r.buf.len(), total, offset, chunk.len())
        {
            self.stats.drop(Drop::BadBlob);
            self.reveal_failed(step, member, Failed::Answered);
            return;
        }
        r.progress = Instant::now();
        r.buf.extend_from_slice(&chunk);
        if end < total {
            let next = end;
            self.ask_momentum(step, member, next);
            return;
        }
        let Some(r) = self.reveals.remove(&(step, member)) else {
            return;
        };
        // A momentum that does not hash to what the member signed is a lie,
        // not a transfer error: the blob protocol already framed it whole.
        let outcome = if audit::momentum_hash_bytes(&r.buf) == r.hash {
            Revealed::Momentum(r.buf)
        } else {
            Revealed::Lied
        };
        let _ = self.to_trainer.send(ToTrainer::Audit {
            step,
            member,
            outcome,
        });
    }

    /// This witness's audit of `report.member` failed: tell everyone.
    pub(super) fn accuse(&mut self, report: &AuditReport) {
        let bp = |x: f32| (x.clamp(0.0, 1.0) * 10_000.0).round() as u16;
        self.accuse_with(
            report.member,
            report.step,
            report.evidence,
            report.ground,
            report
                .comparison
                .map_or((0, 0), |c| (bp(c.overlap), bp(c.agreement))),
        );
    }

    /// This witness holds proof against `leader` by itself (two signed
    /// manifests for one attempt on one history, or an entry its member
    /// never signed): it accuses, once per evidence.
    pub(super) fn accuse_leader(
        &mut self,
        leader: u32,
        step: u32,
        evidence: [u8; 32],
        ground: Ground,
    ) {
        let me = self.cfg.me;
        if leader == me || !self.policy.witnesses.contains(&me) || !self.proofs.insert(evidence) {
            return;
        }
        tracing::info!(
            me,
            leader,
            step,
            ?ground,
            "accusing a leader on proof it holds"
        );
        self.accuse_with(leader, step, evidence, ground, (0, 0));
    }

    pub(super) fn accuse_with(
        &mut self,
        accused: u32,
        step: u32,
        evidence: [u8; 32],
        ground: Ground,
        (overlap, agreement): (u16, u16),
    ) {
        let a = Accuse {
            job: self.cfg.job,
            epoch: self.cfg.epoch,
            step,
            accused,
            witness: self.cfg.me,
            evidence,
            overlap,
            agreement,
            ground,
        };
        self.accused_by_me.insert(accused);
        self.events.push(NodeEvent::Accused {
            member: accused,
            step,
            evidence,
            ground,
        });
        self.publish(msg::sign(&Body::Accuse(a.clone()), &self.key));
        self.on_accuse(&a);
    }

    /// Counts an accusation under the defence policy (an auditor of that
    /// contribution, or proof; a quorum on the same evidence convicts), and
    /// confirms another auditor's drawn audit this node is an auditor of.
    pub(super) fn on_accuse(&mut self, a: &Accuse) -> MessageAcceptance {
        let n = self.cfg.members.len() as u32;
        if a.accused >= n {
            self.stats.drop(Drop::NotMember);
            return acceptance(Drop::NotMember);
        }
        if a.epoch != self.cfg.epoch {
            self.stats.drop(Drop::OutOfWindow);
            return acceptance(Drop::OutOfWindow);
        }
        let accusation = defence::Accusation {
            witness: a.witness,
            accused: a.accused,
            step: a.step,
            evidence: a.evidence,
            ground: a.ground,
        };
        let conviction = match self.tally.add(&self.policy, &accusation) {
            Ok(c) => c,
            Err(why) => {
                // Who counts changes as witnesses are slashed, so a
                // forwarder may still have counted it: not held against it.
                tracing::debug!(me = self.cfg.me, witness = a.witness, accused = a.accused, %why, "accusation not counted");
                self.stats.drop(Drop::NotMember);
                return MessageAcceptance::Ignore;
            }
        };
        let me = self.cfg.me;
        if a.witness != me && self.policy.is_auditor(me, a.step, a.accused) {
            match a.ground {
                Ground::Drawn { by, coin } => {
                    let _ = self.to_trainer.send(ToTrainer::Confirm {
                        step: a.step,
                        member: a.accused,
                        by,
                        coin,
                    });
                }
                // Only a shard the job has: the accuser picks the number.
                Ground::Sampled { shard } if self.is_shard(shard) => {
                    let _ = self.to_trainer.send(ToTrainer::ConfirmSample {
                        step: a.step,
                        member: a.accused,
                        shard,
                        by: a.witness,
                    });
                }
                _ => {}
            }
        }
        let Some(c) = conviction else {
            return MessageAcceptance::Accept;
        };
        if self.machine.is_slashed(c.accused) {
            return MessageAcceptance::Accept;
        }
        self.machine.slash(c.accused);
        self.policy.slash(c.accused);
        self.stats.slashed.insert(c.accused);
        // Its open audits are moot now: nobody waits for them.
        let accused = c.accused;
        self.auditing.retain(|(_, m)| *m != accused);
        self.reveals.retain(|(_, m), _| *m != accused);
        // Only the first `quorum` accusers sign the report; the first
        // of them sends it.
        let quorum = self.policy.audit.quorum.max(1).min(c.witnesses.len());
        let signers = &c.witnesses[..quorum];
        let owes = if signers.first() == Some(&me) {
            self.reports
        } else {
            signers.contains(&me) && self.cfg.defence.cosigner.is_some()
        };
        if owes {
            self.owed_reports.insert(c.accused, None);
        }
        let _ = self.to_trainer.send(ToTrainer::Slashed(c.accused));
        self.events.push(NodeEvent::Slashed {
            member: c.accused,
            step: c.step,
            witnesses: c.witnesses,
            evidence: c.evidence,
        });
        MessageAcceptance::Accept
    }

    pub(super) fn on_control(&mut self, c: Control) {
        match c {
            Control::Cosign {
                message,
                from,
                reply,
            } => {
                let round = self.next_round;
                self.next_round += 1;
                let mut waiting = BTreeSet::new();
                for m in from {
                    let req = Request::Cosign(message.clone());
                    if m != self.cfg.me && self.ask(m, req, Pending::Cosign { round, member: m }) {
                        waiting.insert(m);
                    }
                }
                self.cosigns.insert(
                    round,
                    CosignRound {
                        waiting,
                        got: Vec::new(),
                        reply,
                        deadline: Instant::now() + Duration::from_secs(10),
                    },
                );
                self.finish_cosigns();
            }
            Control::Settled { member } => {
                self.owed_reports.remove(&member);
            }
        }
    }

    pub(super) fn on_cosign(&mut self, round: u64, member: u32, sig: Option<[u8; 64]>) {
        if let Some(r) = self.cosigns.get_mut(&round) {
            r.waiting.remove(&member);
            r.got.extend(sig.map(|s| (member, s)));
        }
        self.finish_cosigns();
    }

    /// Answers rounds with every member heard from, or past their deadline.
    pub(super) fn finish_cosigns(&mut self) {
        let now = Instant::now();
        let done: Vec<u64> = self
            .cosigns
            .iter()
            .filter(|(_, r)| r.waiting.is_empty() || now > r.deadline)
            .map(|(k, _)| *k)
            .collect();
        for k in done {
            if let Some(r) = self.cosigns.remove(&k) {
                let _ = r.reply.send(r.got);
            }
        }
    }
}

/// What a reveal given up on tells the audit. An answer without the
/// momentum is a refusal (an honest member that restarted has lost it).
/// Silence for the whole patience (requests unanswered on an open
/// connection to a member still heard and connected now) is withholding:
/// an honest node answers momentum requests from its network thread
/// whatever its trainer does (counting it as gone let an author that
/// ignored every reveal keep its flipped payloads when its steps were too
/// small to screen, `--adversary silent-reveal`). Anything else (never
/// reached, no longer heard) may be an honest departure or a bad link, and
/// is not judged.
pub(super) fn given_up(answered: bool, silent: bool) -> Revealed {
    match (answered, silent) {
        (true, _) => Revealed::Refused,
        (false, true) => Revealed::Withheld,
        (false, false) => Revealed::Unreachable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_on_an_open_connection_is_withholding_and_an_unreached_member_is_not_judged() {
        assert!(matches!(given_up(false, true), Revealed::Withheld));
        assert!(matches!(given_up(false, false), Revealed::Unreachable));
        // An answer without the momentum is a refusal whether or not the
        // member is silent otherwise.
        assert!(matches!(given_up(true, true), Revealed::Refused));
        assert!(matches!(given_up(true, false), Revealed::Refused));
    }
}
