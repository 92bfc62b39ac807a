//! Requests and answers: payloads, manifests, snapshots and momenta,
//! each with a deadline scaled to its size, and what this node serves
//! (members only).

use super::*;

impl Net {
    /// Goes back to the state before `step`: this node's own, if still
    /// kept, else a fresh download of the latest state from a peer.
    pub(super) fn rewind(&mut self, step: u32) {
        self.stats.rewinds += 1;
        tracing::debug!(
            me = self.cfg.me,
            step,
            kept = self.snapshots.contains(step),
            "rewinding"
        );
        self.generation += 1;
        // States after `step` are from the abandoned history.
        self.snapshots.retain(|s| s <= step);
        self.done = None;
        match self.snapshots.read(step) {
            Some(bytes) => {
                self.applied = step;
                let _ = self.to_trainer.send(ToTrainer::Snapshot {
                    bytes,
                    generation: self.generation,
                });
            }
            None => {
                self.machine.unsync();
                self.syncing = true;
                self.sync_buf = None;
                self.sync_requested = None;
                self.sync_retry = None;
            }
        }
    }

    /// Most members went another way and stayed there
    /// ([`crate::net::step::StepMachine::majority_elsewhere`]): this node's
    /// own states are from the abandoned history, so it downloads the state
    /// before `step` from `from`, checked against that step's manifest, and
    /// applies on from there like a joiner.
    pub(super) fn join_majority(&mut self, step: u32, from: u32) {
        tracing::warn!(
            me = self.cfg.me,
            step,
            from,
            "most members are on another history: downloading their state"
        );
        self.stats.rewinds += 1;
        self.generation += 1;
        self.snapshots.clear();
        self.done = None;
        self.sync_buf = None;
        self.sync_requested = None;
        self.sync_retry = None;
        self.request_snapshot(step, from);
        self.machine.unsync();
        self.syncing = true;
    }

    /// Sends `req` to member `member` and remembers what it was for; false
    /// when that member's peer id is unknown.
    pub(super) fn ask(&mut self, member: u32, req: Request, what: Pending) -> bool {
        let Some(Some(peer)) = self.peers.get(member as usize).copied() else {
            return false;
        };
        let id = self.send(&peer, req);
        self.pending.insert(id, what);
        true
    }

    /// Sends a request with a deadline scaled to the answer's size: a peer
    /// that trickles costs that long, not the transport's 20 s.
    pub(super) fn send(&mut self, peer: &PeerId, req: Request) -> OutboundRequestId {
        let bytes = match &req {
            Request::Payload { .. } => self.payload_len.min(msg::PART as u64),
            Request::Snapshot { .. } | Request::Momentum { .. } => msg::PART as u64,
            Request::Manifest { .. } => msg::MAX_GOSSIP as u64,
            Request::Cosign(_)
            | Request::Push { .. }
            | Request::Hand { .. }
            | Request::Claim { .. } => 0,
            Request::Slice { .. } => (msg::MAX_SLICE_SIGNS / 8) as u64,
            Request::Sum { .. } => msg::PART as u64,
        };
        let deadline = Instant::now() + self.cfg.timing.deadline(bytes);
        self.stats.bytes_out += req.encode().len() as u64;
        let id = self.swarm.behaviour_mut().blobs.send_request(peer, req);
        self.deadlines.insert(id, deadline);
        id
    }

    /// The stalling attacker answers a request for its payload only from
    /// that step's first leader (so the payload gets listed) and leaves
    /// everyone else waiting: an author that trickles. The silent revealer
    /// leaves every request for its momentum unanswered.
    pub(super) fn stalls(&self, from: &PeerId, req: &Request) -> bool {
        if self.cfg.defence.adversary == Some(Mode::SilentReveal) {
            return matches!(req, Request::Momentum { .. });
        }
        let Request::Payload { hash, .. } = req else {
            return false;
        };
        if self.cfg.defence.adversary != Some(Mode::Stalling) {
            return false;
        }
        let asker = self.member_of(from);
        let step = self.own_payloads.get(hash).copied();
        match (asker, step) {
            (Some(asker), Some(step)) => self.machine.leader(step, 0) != asker,
            _ => true,
        }
    }

    /// Requests past their deadline fail now (a late answer is ignored).
    pub(super) fn expire_requests(&mut self) {
        let now = Instant::now();
        let late: Vec<OutboundRequestId> = self
            .deadlines
            .iter()
            .filter(|(_, d)| now >= **d)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.deadlines.remove(&id);
            self.stats.timed_out += 1;
            if let Some(Pending::Momentum { step, member }) = self.pending.get(&id) {
                self.late_reveals.insert(id, (*step, *member));
            }
            self.on_failure(id, Failed::TimedOut);
        }
        // Only downloads still open can use a late answer.
        let open = &self.reveals;
        self.late_reveals.retain(|_, k| open.contains_key(k));
    }

    pub(super) fn request_snapshot(&mut self, step: u32, from: u32) {
        let fresh = self
            .sync_requested
            .is_none_or(|t| t.elapsed() > Duration::from_secs(5));
        if !fresh || from == self.cfg.me {
            return;
        }
        let Some(Some(peer)) = self.peers.get(from as usize).copied() else {
            return;
        };
        let Some(m) = self.machine.manifest(step) else {
            return;
        };
        self.sync_buf = Some(Download {
            step,
            state_hash: m.state_hash,
            buf: Vec::new(),
            from,
            parent: m.parent,
        });
        self.sync_requested = Some(Instant::now());
        tracing::debug!(me = self.cfg.me, step, from, "downloading a state");
        let id = self.send(&peer, Request::Snapshot { step, offset: 0 });
        self.pending.insert(id, Pending::Snapshot { step, peer });
    }

    /// Answers members only: snapshots, momenta and co-signatures are for
    /// the job's members, and an outsider's requests cost nothing but this
    /// check.
    pub(super) fn serve(&mut self, from: &PeerId, req: Request) -> Response {
        if !self.peers.contains(&Some(*from)) {
            self.stats.drop(Drop::NotMember);
            return Response::NotFound;
        }
        match req {
            Request::Payload { hash, offset } => self
                .payloads
                .get(&hash)
                .map_or(Response::NotFound, |b| blobs::part_of(b, offset)),
            // The manifest this node holds for the step now (what it applied,
            // or will): after a rewind or a disqualification that is not
            // the first one it stored.
            Request::Manifest { step } => self
                .machine
                .manifest(step)
                .and_then(|m| self.ranked_raw.get(&m.id()))
                .map(|(_, raw)| raw)
                .or_else(|| self.manifests_raw.get(&step))
                .map_or(Response::NotFound, |b| Response::Manifest(b.clone())),
            Request::Push { .. }
            | Request::Slice { .. }
            | Request::Sum { .. }
            | Request::Hand { .. }
            | Request::Claim { .. } => match self.member_of(from) {
                Some(m) => self.serve_sharded(m, req),
                None => Response::NotFound,
            },
            Request::Snapshot { step, offset } => self.snapshots.part(step, offset),
            Request::Momentum { step, offset } => self.momenta.part(step, offset),
            Request::Cosign(message) => {
                let accused: Vec<[u8; 32]> = self
                    .accused_by_me
                    .iter()
                    .filter_map(|m| self.cfg.members.get(*m as usize).copied())
                    .collect();
                let agrees = self
                    .cfg
                    .defence
                    .cosigner
                    .as_ref()
                    .is_some_and(|c| !accused.is_empty() && (c.0)(&message, &accused));
                if agrees {
                    let until = Instant::now() + Duration::from_secs(5);
                    for (m, t) in self.owed_reports.iter_mut() {
                        if self.accused_by_me.contains(m) {
                            *t = Some(until);
                        }
                    }
                }
                match self.key.sign(&message).try_into() {
                    Ok(sig) if agrees => Response::Signature(sig),
                    _ => Response::NotFound,
                }
            }
        }
    }

    pub(super) fn on_response(&mut self, id: OutboundRequestId, resp: Response) {
        self.deadlines.remove(&id);
        let Some(p) = self.pending.remove(&id) else {
            // Past its deadline, and asked again elsewhere meanwhile.
            // A late piece of a momentum: the member is answering, slowly.
            if let Some(k) = self.late_reveals.remove(&id)
                && matches!(resp, Response::Part { .. })
                && let Some(r) = self.reveals.get_mut(&k)
            {
                r.progress = Instant::now();
            }
            // A payload is content-addressed, so a late one is as good as a
            // timely one: on a loaded machine answers come late, and
            // dropping them made the node give up on a manifest every other
            // node applied. (Only a payload whole in one part: a late part
            // of a longer one is asked again from where the download is.)
            if let Response::Part {
                total,
                offset: 0,
                chunk,
            } = resp
                && chunk.len() as u64 == total
            {
                self.late_payload(chunk);
            }
            return;
        };
        match (p, resp) {
            (
                Pending::Payload { hash, from },
                Response::Part {
                    total,
                    offset,
                    chunk,
                },
            ) => {
                self.on_payload_part(hash, from, total, offset, chunk);
            }
            (Pending::Payload { hash, .. }, _) => self.machine.on_fetch_failed(hash),
            (Pending::Manifest, Response::Manifest(raw)) => {
                match msg::open(&raw).and_then(|s| self.admit(&s).map(|_| s)) {
                    Ok(Signed {
                        body: Body::Manifest(m),
                        raw,
                        ..
                    }) => {
                        self.on_manifest(m, raw);
                    }
                    Ok(_) => self.stats.drop(Drop::BadBlob),
                    Err(d) => self.stats.drop(d),
                }
            }
            (Pending::Manifest, _) => {}
            (
                Pending::Snapshot { step, peer },
                Response::Part {
                    total,
                    offset,
                    chunk,
                },
            ) => {
                let Some(Download {
                    step: want_step,
                    state_hash: hash,
                    buf,
                    parent,
                    ..
                }) = self.sync_buf.as_mut()
                else {
                    return;
                };
                if *want_step != step
                    || total > self.state_cap
                    || !msg::part_continues(buf.len(), total, offset, chunk.len())
                {
                    tracing::debug!(
                        me = self.cfg.me,
                        step,
                        want = *want_step,
                        offset,
                        "state chunk dropped"
                    );
                    self.stats.drop(Drop::BadBlob);
                    return;
                }
                // Progress: the stall watchdog counts from the last chunk.
                self.sync_requested = Some(Instant::now());
                buf.extend_from_slice(&chunk);
                if (buf.len() as u64) < total && !chunk.is_empty() {
                    let offset = buf.len() as u64;
                    let id = self.send(&peer, Request::Snapshot { step, offset });
                    self.pending.insert(id, Pending::Snapshot { step, peer });
                    return;
                }
                if *blake3::hash(buf).as_bytes() != *hash {
                    self.stats.drop(Drop::BadBlob);
                    self.retry_snapshot(step);
                    return;
                }
                let bytes = std::mem::take(buf);
                let parent = *parent;
                self.sync_buf = None;
                self.sync_retry = None;
                self.syncing = false;
                self.machine.resync(step, parent);
                let _ = self.to_trainer.send(ToTrainer::Snapshot {
                    bytes,
                    generation: self.generation,
                });
            }
            (Pending::Snapshot { step, peer }, _) if self.is_current_download(step, &peer) => {
                tracing::debug!(
                    me = self.cfg.me,
                    step,
                    "state not served: asking the next member"
                );
                self.retry_snapshot(step)
            }
            // An answer to a request this node has moved on from.
            (Pending::Snapshot { .. }, _) => {}
            (
                Pending::Momentum { step, member },
                Response::Part {
                    total,
                    offset,
                    chunk,
                },
            ) => {
                self.on_momentum_chunk(step, member, total, offset, chunk);
            }
            (Pending::Momentum { step, member }, _) => {
                self.reveal_failed(step, member, Failed::Answered)
            }
            (Pending::Cosign { round, member }, Response::Signature(sig)) => {
                self.on_cosign(round, member, Some(sig))
            }
            (Pending::Cosign { round, member }, _) => self.on_cosign(round, member, None),
            (
                p @ (Pending::Push { .. }
                | Pending::Slice { .. }
                | Pending::Sum { .. }
                | Pending::Hand
                | Pending::Claim),
                resp,
            ) => self.on_sharded_response(p, resp),
        }
    }

    /// A part of a payload download from member `from`. Parts must continue
    /// the bytes held at the size the first one announced; a finished
    /// payload must hash to what its author signed. A holder that lies
    /// costs at most one payload's bytes (at most [`msg::MAX_PAYLOAD`]),
    /// and the step machine asks the next holder.
    fn on_payload_part(
        &mut self,
        hash: [u8; 32],
        from: u32,
        total: u64,
        offset: u64,
        chunk: Vec<u8>,
    ) {
        if !self.machine.wants(&hash) {
            // Pruned or already held: nothing to resume.
            self.partial.remove(&hash);
            return;
        }
        if offset == 0 {
            // A download starts over with the size its first part states.
            self.partial.insert(hash, (Vec::new(), total));
        }
        let Some((buf, want)) = self.partial.get_mut(&hash) else {
            self.machine.on_fetch_failed(hash);
            return;
        };
        if total != *want {
            // This holder and an earlier one disagree on the size: which
            // one lies is only known once a payload hashes right, so the
            // next holder starts over.
            self.partial.remove(&hash);
            self.machine.on_fetch_failed(hash);
            return;
        }
        if offset != buf.len() as u64 {
            // Not where this download is (an answer to an older request):
            // asked again, it resumes from the right place.
            self.machine.on_fetch_failed(hash);
            return;
        }
        let end = offset + chunk.len() as u64;
        let fits = total > 0
            && total <= msg::MAX_PAYLOAD
            && msg::part_continues(buf.len(), total, offset, chunk.len());
        if !fits {
            self.partial.remove(&hash);
            self.stats.drop(Drop::BadBlob);
            self.machine.on_fetch_failed(hash);
            return;
        }
        buf.extend_from_slice(&chunk);
        if end < total {
            let req = Request::Payload { hash, offset: end };
            if !self.ask(from, req, Pending::Payload { hash, from }) {
                self.machine.on_fetch_failed(hash);
            }
            return;
        }
        let bytes = self.partial.remove(&hash).map(|p| p.0).unwrap_or_default();
        if *blake3::hash(&bytes).as_bytes() == hash {
            self.payloads.insert(hash, bytes);
            let now = self.now();
            // A manifest this node had given up on is whole again and
            // outranks what it applied.
            if let Some(step) = self.machine.on_payload(now, hash) {
                self.rewind(step);
            }
        } else {
            self.stats.drop(Drop::BadBlob);
            self.machine.on_fetch_failed(hash);
        }
    }

    /// A payload that answered a request already given up: kept if this
    /// node still wants it.
    fn late_payload(&mut self, bytes: Vec<u8>) {
        let hash = *blake3::hash(&bytes).as_bytes();
        if bytes.len() > msg::PART || !self.machine.wants(&hash) {
            return;
        }
        self.partial.remove(&hash);
        self.payloads.insert(hash, bytes);
        let now = self.now();
        if let Some(step) = self.machine.on_payload(now, hash) {
            self.rewind(step);
        }
    }

    /// The snapshot download failed or did not match: ask the next member,
    /// for the newest state a manifest names (members keep their last 4
    /// states only: asking again for the same step, a late joiner went
    /// round the members for minutes once they had all pruned it), after
    /// [`SYNC_RETRY`].
    pub(super) fn retry_snapshot(&mut self, step: u32) {
        let step = self
            .machine
            .latest_manifest()
            .map_or(step, |m| m.step.max(step));
        let from = self.sync_buf.take().map_or(0, |b| b.from);
        self.sync_requested = None;
        self.retry_snapshot_after(step, from);
    }

    /// Asks the member after `tried` (never this node) for the state
    /// before `step`, after [`SYNC_RETRY`].
    pub(super) fn retry_snapshot_after(&mut self, step: u32, tried: u32) {
        let n = self.cfg.members.len() as u32;
        let mut next = (tried + 1) % n;
        if next == self.cfg.me {
            next = (next + 1) % n;
        }
        self.sync_retry = Some((step, next, Instant::now() + SYNC_RETRY));
    }

    /// Whether a snapshot request for `step` to `peer` is the download
    /// under way: a late failure of one this node already replaced must
    /// neither restart the rotation nor abandon the download in progress.
    fn is_current_download(&self, step: u32, peer: &PeerId) -> bool {
        self.sync_buf.as_ref().is_some_and(|b| {
            b.step == step && self.peers.get(b.from as usize) == Some(&Some(*peer))
        })
    }

    pub(super) fn on_failure(&mut self, id: OutboundRequestId, why: Failed) {
        self.deadlines.remove(&id);
        match self.pending.remove(&id) {
            Some(Pending::Payload { hash, .. }) => self.machine.on_fetch_failed(hash),
            Some(Pending::Snapshot { step, peer }) if self.is_current_download(step, &peer) => {
                self.retry_snapshot(step)
            }
            Some(Pending::Momentum { step, member }) => self.reveal_failed(step, member, why),
            Some(Pending::Cosign { round, member }) => self.on_cosign(round, member, None),
            Some(p) if p.is_sharded() => self.on_sharded_failure(p),
            _ => {}
        }
    }
}
