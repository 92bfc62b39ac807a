//! Gossip in: the cheap checks before a signature, announcements and
//! manifests handed to the step machine, the evidence they carry, and what
//! gossipsub is told about each message.

use super::*;

impl Net {
    /// What a lying leader does to its manifest before signing it: states
    /// a state hash that is not the state's, and lists under another
    /// member's name a copy of that member's payload with one byte changed
    /// (served by the leader itself), leaving out the next other member's
    /// contribution. It then signs a second manifest for the same attempt
    /// (see `drive`).
    pub(super) fn lie(&mut self, m: &mut Manifest) {
        m.state_hash = *blake3::hash(&m.state_hash).as_bytes();
        let me = self.cfg.me;
        if let Some(entry) = m.entries.iter_mut().find(|(who, _)| *who != me)
            && let Some(real) = self.payloads.get(&entry.1)
        {
            let mut forged = real.clone();
            let at = forged.len().saturating_sub(crate::wire::SIGNATURE_LEN + 1);
            if let Some(b) = forged.get_mut(at) {
                *b ^= 1;
            }
            let hash = *blake3::hash(&forged).as_bytes();
            self.payloads.insert(hash, forged);
            // Held in the machine too, or `prune` drops the bytes and the
            // manifest becomes unservable (and is replaced) before anyone
            // sees the forgery.
            let now = self.now();
            let _ = self.machine.on_payload(now, hash);
            entry.1 = hash;
            // And it censors: the next other member is left out.
            let forged = entry.0;
            if let Some(pos) = m
                .entries
                .iter()
                .position(|(who, _)| *who != me && *who != forged)
            {
                m.entries.remove(pos);
            }
        }
    }

    pub(super) fn retry_unpublished(&mut self) {
        for raw in std::mem::take(&mut self.unpublished) {
            self.publish(raw);
        }
    }

    /// Checks membership, job and replay; the signature was checked by
    /// [`msg::open`].
    /// The checks that need no signature: job, membership, the node's own
    /// messages coming back, and the step window. They run before the
    /// signature is verified, so floods by outsiders cost no curve maths.
    pub(super) fn pre_admit(&self, body: &Body, signer: &[u8; 32]) -> Result<(), Drop> {
        if *body.job() != self.cfg.job {
            return Err(Drop::WrongJob);
        }
        if self.cfg.members.get(body.member() as usize) != Some(signer) {
            return Err(Drop::NotMember);
        }
        // Gossip never hands a node its own messages: one coming back was
        // re-published by someone else.
        if body.member() == self.cfg.me {
            return Err(Drop::Replayed);
        }
        let step = match body {
            Body::Announce(a) => Some(a.step),
            Body::Manifest(m) => Some(m.step),
            Body::SumHash(h) => Some(h.step),
            Body::Withheld(w) => Some(w.step),
            _ => None,
        };
        if step.is_some_and(|s| !self.machine.in_window(s)) {
            return Err(Drop::OutOfWindow);
        }
        Ok(())
    }

    /// What needs the signature checked first: heartbeat sequence numbers.
    pub(super) fn admit(&mut self, s: &Signed) -> Result<(), Drop> {
        if let Body::Heartbeat(h) = &s.body {
            // Another epoch's: at an epoch boundary an honest forwarder may
            // still be in it.
            if h.epoch != self.cfg.epoch {
                return Err(Drop::OutOfWindow);
            }
            let last = self.heartbeat_seq.entry(s.signer).or_insert(0);
            if h.seq <= *last {
                return Err(Drop::Replayed);
            }
            *last = h.seq;
        }
        Ok(())
    }

    pub(super) fn on_gossip(&mut self, raw: &[u8]) -> MessageAcceptance {
        self.stats.bytes_in += raw.len() as u64;
        let opened = msg::open_checked(raw, |b, k| self.pre_admit(b, k));
        let signed = match opened.and_then(|s| self.admit(&s).map(|_| s)) {
            Ok(s) => s,
            Err(d) => {
                self.stats.drop(d);
                return acceptance(d);
            }
        };
        let now = self.now();
        // Signs of life come from fresh messages only (a heartbeat with a
        // new sequence number, a new announcement or manifest): anyone can
        // re-gossip a dead leader's old ones.
        match signed.body {
            Body::Announce(a) => match self.machine.on_announce(now, &a) {
                Verdict::Accepted => {
                    self.stats.accepted += 1;
                    self.sharded_announce(&a);
                    // It stands in for its member's heartbeat: the member
                    // is on this history, and still training.
                    self.on_peer_history(now, a.member, a.chain_step, a.chain);
                    self.peers_done.remove(&a.member);
                }
                Verdict::Duplicate => {
                    self.stats.drop(Drop::Replayed);
                    return acceptance(Drop::Replayed);
                }
                // The first announcement that contradicts the one held is
                // forwarded as proof, so that every node learns the member
                // announced twice (`StepMachine::on_announce`); further
                // ones are not. Neither is held against the forwarder
                // (which may have seen the other one first).
                Verdict::Equivocation => {
                    self.stats.equivocations += 1;
                }
                Verdict::Equivocated => return MessageAcceptance::Ignore,
                Verdict::TooFar => {
                    self.stats.drop(Drop::OutOfWindow);
                    return MessageAcceptance::Ignore;
                }
                _ => self.stats.late += 1,
            },
            Body::Manifest(m) => return self.on_manifest(m, signed.raw),
            Body::Heartbeat(h) => {
                self.stats.accepted += 1;
                self.machine.on_alive(now, h.member);
                self.on_peer_history(now, h.member, h.chain_step, h.chain);
                // Done, and auditing nobody: a witness that still audits
                // may yet ask this node for a momentum.
                // Done on the same history: a peer done on another one is
                // waited for until one of the two has rewound.
                if h.applied >= self.cfg.steps
                    && h.auditing == 0
                    && self.machine.agrees(h.chain_step, &h.chain)
                {
                    self.peers_done.insert(h.member);
                } else {
                    self.peers_done.remove(&h.member);
                }
                if h.auditing > 0 {
                    self.peers_auditing.insert(h.member);
                } else {
                    self.peers_auditing.remove(&h.member);
                }
                self.machine.on_ready(h.member, h.ready_from);
            }
            Body::Accuse(a) => {
                // A false-sum accusation quotes the aggregator's signed
                // claim: one that does not check out is forged, and one
                // that does counts once this node's own recomputation
                // agrees (forwarded meanwhile, so others recompute too).
                match self.on_false_sum(&a) {
                    sharded::FalseSum::Forged => {
                        self.stats.drop(Drop::BadSignature);
                        return acceptance(Drop::BadSignature);
                    }
                    sharded::FalseSum::Held => return MessageAcceptance::Accept,
                    sharded::FalseSum::Refused => return MessageAcceptance::Ignore,
                    sharded::FalseSum::Other | sharded::FalseSum::Confirmed => {}
                }
                return self.on_accuse(&a);
            }
            // Since message version 9 a seat sends its hash to each member
            // by request (`Request::Claim`): no honest node gossips one.
            Body::SumHash(_) => {
                self.stats.drop(Drop::Malformed);
                return acceptance(Drop::Malformed);
            }
            Body::Withheld(w) => return self.on_withheld_gossip(w),
        }
        MessageAcceptance::Accept
    }

    /// A member's history, as its heartbeat or announcement says it: a
    /// fork is asked about, and a majority elsewhere joined.
    fn on_peer_history(&mut self, now: Duration, member: u32, step: u32, chain: [u8; 32]) {
        self.machine.on_peer_history(now, member, step, chain);
        if !self.syncing
            && let Some((step, from)) = self.machine.majority_elsewhere(now)
        {
            self.join_majority(step, from);
        }
    }

    /// A signed manifest: applied, ranked or dropped by the step machine;
    /// a leader's second manifest for one attempt on one history is proof
    /// against it.
    pub(super) fn on_manifest(&mut self, m: Manifest, raw: Vec<u8>) -> MessageAcceptance {
        let seen = self.machine.evidence.len();
        let verdict = self.rank_manifest(m, raw);
        for o in std::mem::take(&mut self.machine.omissions) {
            *self.stats.omissions.entry(o.leader).or_default() += 1;
            self.events.push(NodeEvent::Omitted {
                step: o.step,
                leader: o.leader,
                member: o.member,
            });
        }
        let fresh: Vec<(u32, u32, u8)> = self.machine.evidence[seen..]
            .iter()
            .filter(|e| e.proves_fraud())
            .map(|e| (e.first.leader, e.first.step, e.first.attempt))
            .collect();
        for (leader, step, attempt) in fresh {
            let evidence = defence::equivocation_evidence(
                &self.cfg.job,
                self.cfg.epoch,
                step,
                attempt,
                leader,
            );
            self.accuse_leader(leader, step, evidence, Ground::Equivocation);
        }
        verdict
    }

    pub(super) fn rank_manifest(&mut self, m: Manifest, raw: Vec<u8>) -> MessageAcceptance {
        let step = m.step;
        let leader = m.leader;
        let id = m.id();
        let now = self.now();
        let verdict = self.machine.on_manifest(now, m);
        // Kept by the machine: a sign of life, and bytes to serve.
        if matches!(
            verdict,
            Verdict::Accepted | Verdict::Superseded | Verdict::Rewind | Verdict::Equivocation
        ) {
            self.machine.on_alive(now, leader);
            self.ranked_raw.insert(id, (step, raw));
        }
        match verdict {
            Verdict::Accepted => {
                self.stats.accepted += 1;
                if self.syncing {
                    self.request_snapshot(step, leader);
                }
                MessageAcceptance::Accept
            }
            Verdict::Duplicate => {
                self.stats.drop(Drop::Replayed);
                acceptance(Drop::Replayed)
            }
            Verdict::WrongLeader => {
                self.stats.drop(Drop::WrongLeader);
                acceptance(Drop::WrongLeader)
            }
            // Forwarded: the second signed manifest is the proof other
            // witnesses need (the machine keeps a bounded number per
            // attempt; past that they are duplicates).
            Verdict::Equivocation => {
                self.stats.equivocations += 1;
                MessageAcceptance::Accept
            }
            Verdict::Superseded => {
                self.stats.superseded += 1;
                MessageAcceptance::Accept
            }
            Verdict::Rewind => {
                self.rewind(step);
                MessageAcceptance::Accept
            }
            Verdict::Stale => {
                self.stats.late += 1;
                MessageAcceptance::Ignore
            }
            Verdict::TooFar => {
                self.stats.drop(Drop::OutOfWindow);
                MessageAcceptance::Ignore
            }
            // Announcements only.
            Verdict::Equivocated => MessageAcceptance::Ignore,
        }
    }
}

/// What gossipsub is told about a dropped message: rejected (and held
/// against the forwarder's score) only when every honest node drops it too.
pub(super) fn acceptance(d: Drop) -> MessageAcceptance {
    if d.blames_forwarder() {
        MessageAcceptance::Reject
    } else {
        MessageAcceptance::Ignore
    }
}
