//! One named test per attack class, each asserting the exact program error.
//! Lamport conservation is checked after every transaction by the harness.

mod common;

use cohort_program::client;
use cohort_program::error::CohortError;
use cohort_program::pda::JOB_SEED;
use cohort_program::state::*;
use common::*;
use solana_sdk::account::{Account, AccountSharedData};
use solana_sdk::instruction::Instruction;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};

struct Running {
    env: Env,
    requester: Keypair,
    nodes: Vec<Keypair>,
    job: Pubkey,
}

impl Running {
    async fn by_index(&mut self) -> Vec<Option<Pubkey>> {
        let nodes: Vec<Keypair> = self.nodes.iter().map(|k| k.insecure_clone()).collect();
        let refs: Vec<&Keypair> = nodes.iter().collect();
        self.env.members_by_index(&self.job, &refs).await
    }

    async fn witnesses(&mut self, epoch: u32) -> Vec<Pubkey> {
        let members: Vec<&Keypair> = self.nodes.iter().collect();
        self.env.witnesses(&self.job, epoch, &members).await
    }

    fn attest(&self, w: &Pubkey, epoch: u32, root: [u8; 32], total: u64) -> Instruction {
        client::attest_epoch(w, &self.job, epoch, [5; 32], root, total)
    }

    async fn send_as(
        &mut self,
        ix: Instruction,
        who: &Pubkey,
    ) -> Result<(), solana_program_test::BanksClientError> {
        let kp = find(&self.nodes, who).insecure_clone();
        self.env.send(&[ix], &[&kp]).await
    }

    /// The node owners `seal_epoch` must name for `epoch` right now.
    async fn witnesses_drawn(&mut self, epoch: u32) -> Vec<Pubkey> {
        let ix = self.env.seal_ix(&self.job, epoch).await;
        ix.accounts[4..]
            .iter()
            .map(|m| {
                self.nodes
                    .iter()
                    .map(|n| n.pubkey())
                    .find(|k| client::member_address(&self.job, k) == m.pubkey)
                    .unwrap()
            })
            .collect()
    }

    /// A member that holds no witness seat in `epoch`.
    async fn non_witness(&mut self, epoch: u32) -> Pubkey {
        let ws = self.witnesses(epoch).await;
        self.nodes
            .iter()
            .map(|n| n.pubkey())
            .find(|k| !ws.contains(k))
            .expect("a non-witness member")
    }

    /// The member at the highest index (what `leave_job`/`report_fraud` swap in).
    async fn last_member(&mut self) -> Pubkey {
        self.by_index()
            .await
            .last()
            .copied()
            .flatten()
            .expect("a last member")
    }

    async fn claim(
        &mut self,
        who: &Pubkey,
        points: u64,
        proof: Vec<[u8; 32]>,
    ) -> Result<(), solana_program_test::BanksClientError> {
        let ix = client::claim(who, &self.job, points, proof);
        self.send_as(ix, who).await
    }

    /// Finalizes `epoch` with the given cumulative points.
    async fn finalize(&mut self, epoch: u32, points: &[(Pubkey, u64)]) {
        let t = tree(points);
        let ws = self.witnesses(epoch).await;
        for w in ws.iter().take(2) {
            let ix = self.attest(w, epoch, t.root(), t.total());
            self.send_as(ix, w).await.unwrap();
        }
    }
}

/// `n` registered nodes, a job with 3..=4 members of which the first `n.min(4)` joined.
async fn open_job(n: usize) -> Running {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let nodes = env.nodes(n).await;
    let s = spec();
    let job = env
        .create_job(&requester, 1, s, s.full_budget().unwrap())
        .await
        .unwrap();
    for k in nodes.iter().take(4) {
        env.join(k, &job).await.unwrap();
    }
    Running {
        env,
        requester,
        nodes,
        job,
    }
}

async fn running_job() -> Running {
    let mut r = open_job(4).await;
    r.env.start_epoch(&r.job).await.unwrap();
    r
}

fn points(r: &Running, each: u64) -> Vec<(Pubkey, u64)> {
    r.nodes.iter().map(|n| (n.pubkey(), each)).collect()
}

#[tokio::test]
async fn missing_signer_is_refused() {
    let mut env = Env::new().await;
    let node = env.user(SOL).await;
    let mut ix = client::register_node(&node.pubkey(), terms(PRICE, 5_000), STAKE);
    ix.accounts[0].is_signer = false;
    assert_err(env.send(&[ix], &[]).await, CohortError::MissingSigner);
}

#[tokio::test]
async fn wrong_owner_is_refused() {
    let mut r = open_job(4).await;
    // A byte-perfect copy of the job owned by another program.
    let real = r.env.account(&r.job).await.unwrap();
    let fake = Pubkey::new_unique();
    r.env.ctx.set_account(
        &fake,
        &AccountSharedData::from(Account {
            owner: Pubkey::new_unique(),
            ..real
        }),
    );
    let extra = r.env.user(SOL).await;
    r.env.register(&extra, PRICE, 5_000, STAKE).await.unwrap();
    let mut ix = client::join_job(&extra.pubkey(), &r.job);
    ix.accounts[2].pubkey = fake;
    assert_err(r.env.send(&[ix], &[&extra]).await, CohortError::WrongOwner);
}

#[tokio::test]
async fn member_or_epoch_of_another_job_is_refused() {
    let mut r = running_job().await;
    let s = spec();
    let other = r
        .env
        .create_job(
            &r.requester.insecure_clone(),
            2,
            s,
            s.full_budget().unwrap(),
        )
        .await
        .unwrap();
    let w = r.witnesses(0).await[0];
    // A Member of job 1 presented for job 2.
    let mut ix = client::attest_epoch(&w, &other, 0, [0; 32], [0; 32], 0);
    ix.accounts[2].pubkey = client::member_address(&r.job, &w);
    ix.accounts[4].pubkey = client::epoch_address(&r.job, 0);
    assert_err(r.send_as(ix, &w).await, CohortError::AccountMismatch);
    // Job 1's own member and epoch presented under job 2's key.
    let mut ix = r.attest(&w, 0, [0; 32], 0);
    ix.accounts[3].pubkey = other;
    assert_err(r.send_as(ix, &w).await, CohortError::AccountMismatch);
}

#[tokio::test]
async fn non_canonical_pda_bump_is_refused() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let id = 11u64.to_le_bytes();
    let rk = requester.pubkey();
    let seeds: &[&[u8]] = &[JOB_SEED, rk.as_ref(), &id];
    let (_, canonical) = Pubkey::find_program_address(seeds, &cohort_program::ID);
    let other = (0..canonical)
        .rev()
        .find_map(|b| {
            let mut s = seeds.to_vec();
            let bump = [b];
            s.push(&bump);
            Pubkey::create_program_address(&s, &cohort_program::ID).ok()
        })
        .expect("a non-canonical bump exists");
    env.track(other);
    let s = spec();
    let mut ix = client::create_job(&requester.pubkey(), 11, s, s.full_budget().unwrap());
    ix.accounts[1].pubkey = other;
    assert_err(
        env.send(&[ix], &[&requester]).await,
        CohortError::InvalidPda,
    );
}

#[tokio::test]
async fn arithmetic_overflow_is_refused() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let mut s = spec();
    s.max_price = u64::MAX / 2;
    s.max_nodes = u16::MAX;
    s.epochs = u32::MAX;
    let ix = client::create_job(&requester.pubkey(), 1, s, u64::MAX);
    assert_err(env.send(&[ix], &[&requester]).await, CohortError::Overflow);
    // Topping up a stake past u64::MAX.
    let node = env.user(SOL).await;
    env.register(&node, PRICE, 5_000, u64::MAX / 2 - SOL)
        .await
        .unwrap_err();
    env.register(&node, PRICE, 5_000, STAKE).await.unwrap();
    let ix = client::update_node(&node.pubkey(), terms(PRICE, 5_000), u64::MAX - 1);
    assert_err(env.send(&[ix], &[&node]).await, CohortError::Overflow);
}

#[tokio::test]
async fn an_audit_rate_above_every_contribution_is_refused() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let mut s = spec();
    s.audit_rate_bp = MAX_AUDIT_RATE_BP + 1;
    let deposit = s.full_budget().unwrap();
    let refused = env.create_job(&requester, 1, s, deposit).await;
    assert_err(refused.map(|_| ()), CohortError::InvalidSpec);
    s.audit_rate_bp = MAX_AUDIT_RATE_BP;
    let job = env.create_job(&requester, 1, s, deposit).await.unwrap();
    let j: Job = env.state(&job).await;
    assert_eq!(j.spec.audit_rate_bp, MAX_AUDIT_RATE_BP);
}

#[tokio::test]
async fn reinitialization_is_refused() {
    let mut env = Env::new().await;
    let node = env.user(SOL).await;
    env.register(&node, PRICE, 5_000, STAKE).await.unwrap();
    assert_err(
        env.register(&node, PRICE * 2, 9_000, STAKE).await,
        CohortError::AlreadyInitialized,
    );
    let requester = env.user(10 * SOL).await;
    let s = spec();
    env.create_job(&requester, 1, s, s.full_budget().unwrap())
        .await
        .unwrap();
    // The same id again: refused by the requester's id counter before the
    // address is even looked at (job addresses are never reused).
    let res = env
        .create_job(&requester, 1, s, s.full_budget().unwrap())
        .await
        .map(|_| ());
    assert_err(res, CohortError::JobIdUsed);
}

#[tokio::test]
async fn use_after_close_is_refused() {
    let mut r = open_job(4).await;
    let requester = r.requester.insecure_clone();
    r.env
        .send(
            &[client::cancel_job(&requester.pubkey(), &r.job)],
            &[&requester],
        )
        .await
        .unwrap();
    r.env
        .send(
            &[client::close_job(&requester.pubkey(), &r.job)],
            &[&requester],
        )
        .await
        .unwrap();
    let res = r
        .env
        .send(
            &[client::cancel_job(&requester.pubkey(), &r.job)],
            &[&requester],
        )
        .await;
    assert_err(res, CohortError::WrongOwner);
    // A member of the closed job may still close its own account, once.
    let n = r.nodes[0].insecure_clone();
    r.env
        .send(
            &[client::close_member(&n.pubkey(), &r.job, 0, vec![])],
            &[&n],
        )
        .await
        .unwrap();
    let res = r
        .env
        .send(
            &[client::close_member(&n.pubkey(), &r.job, 0, vec![])],
            &[&n],
        )
        .await;
    assert_err(res, CohortError::WrongOwner);
}

#[tokio::test]
async fn duplicate_mutable_accounts_are_refused() {
    let mut r = running_job().await;
    let ws = r.witnesses(0).await;
    let accused = r.non_witness(0).await;
    let last = r.last_member().await;
    // One witness listed twice must not count as two votes.
    r.env.track(client::fraud_case_address(&r.job, &accused, 0));
    let ix = client::report_fraud(&r.job, 0, &accused, &last, &ws[0], &[ws[0], ws[0]], [1; 32]);
    let w0 = find(&r.nodes, &ws[0]).insecure_clone();
    assert_err(
        r.env.send(&[ix], &[&w0]).await,
        CohortError::DuplicateAccount,
    );
}

#[tokio::test]
async fn type_cosplay_is_refused() {
    let mut r = open_job(5).await;
    // A Node account passed where a Job is expected.
    let extra = r.nodes[4].insecure_clone();
    let mut ix = client::join_job(&extra.pubkey(), &r.job);
    ix.accounts[2].pubkey = client::node_address(&r.nodes[0].pubkey());
    assert_err(
        r.env.send(&[ix], &[&extra]).await,
        CohortError::WrongAccountType,
    );
}

#[tokio::test]
async fn double_claim_is_refused() {
    let mut r = running_job().await;
    let pts = points(&r, 10);
    r.finalize(0, &pts).await;
    let m = r.nodes[0].insecure_clone();
    let (p, proof) = proof_for(&pts, &m.pubkey());
    r.claim(&m.pubkey(), p, proof.clone()).await.unwrap();
    let res = r.claim(&m.pubkey(), p, proof).await;
    assert_err(res, CohortError::NothingToClaim);
}

#[tokio::test]
async fn forged_or_stale_proof_is_refused() {
    let mut r = running_job().await;
    let pts0 = points(&r, 5);
    r.finalize(0, &pts0).await;
    let m = r.nodes[0].insecure_clone();
    let (p, proof) = proof_for(&pts0, &m.pubkey());
    // Inflated points with a genuine proof.
    let res = r.claim(&m.pubkey(), p + 1, proof.clone()).await;
    assert_err(res, CohortError::InvalidProof);
    // Another member's proof.
    let (_, other_proof) = proof_for(&pts0, &r.nodes[1].pubkey());
    let res = r.claim(&m.pubkey(), p, other_proof).await;
    assert_err(res, CohortError::InvalidProof);
    // After epoch 1 finalizes, epoch 0's proof is stale.
    r.env.start_epoch(&r.job).await.unwrap();
    let pts1 = points(&r, 10);
    r.finalize(1, &pts1).await;
    let res = r.claim(&m.pubkey(), p, proof).await;
    assert_err(res, CohortError::InvalidProof);
}

#[tokio::test]
async fn attest_by_non_witness_is_refused() {
    let mut r = running_job().await;
    let outsider = r.non_witness(0).await;
    let ix = r.attest(&outsider, 0, [1; 32], 4);
    assert_err(r.send_as(ix, &outsider).await, CohortError::NotWitness);
}

#[tokio::test]
async fn attest_twice_is_refused() {
    let mut r = running_job().await;
    let w = r.witnesses(0).await[0];
    r.send_as(r.attest(&w, 0, [1; 32], 4), &w).await.unwrap();
    let res = r.send_as(r.attest(&w, 0, [2; 32], 4), &w).await;
    assert_err(res, CohortError::AlreadyVoted);
}

#[tokio::test]
async fn attest_for_non_current_epoch_is_refused() {
    let mut r = running_job().await;
    let pts = points(&r, 3);
    r.finalize(0, &pts).await;
    r.env.start_epoch(&r.job).await.unwrap();
    let w = r.witnesses(1).await[0];
    // Epoch 0's account, named as epoch 1.
    let mut ix = r.attest(&w, 1, [1; 32], 20);
    ix.accounts[4].pubkey = client::epoch_address(&r.job, 0);
    assert_err(r.send_as(ix, &w).await, CohortError::WrongEpoch);
    // Epoch 0 itself is closed for votes.
    let ix = r.attest(&w, 0, [1; 32], 20);
    assert_err(r.send_as(ix, &w).await, CohortError::EpochFinalized);
}

#[tokio::test]
async fn join_when_full_underpowered_overpriced_or_unstaked_is_refused() {
    let mut r = open_job(4).await;
    let full = r.env.user(SOL).await;
    r.env.register(&full, PRICE, 5_000, STAKE).await.unwrap();
    assert_err(r.env.join(&full, &r.job).await, CohortError::JobFull);

    let s = spec();
    let requester = r.requester.insecure_clone();
    let job2 = r
        .env
        .create_job(&requester, 2, s, s.full_budget().unwrap())
        .await
        .unwrap();
    let weak = r.env.user(SOL).await;
    r.env.register(&weak, PRICE, 999, STAKE).await.unwrap();
    assert_err(r.env.join(&weak, &job2).await, CohortError::Underpowered);
    let greedy = r.env.user(SOL).await;
    r.env
        .register(&greedy, PRICE + 1, 5_000, STAKE)
        .await
        .unwrap();
    assert_err(r.env.join(&greedy, &job2).await, CohortError::Overpriced);
    let unstaked = r.env.user(SOL).await;
    r.env.register(&unstaked, PRICE, 5_000, 0).await.unwrap();
    assert_err(
        r.env.join(&unstaked, &job2).await,
        CohortError::InsufficientStake,
    );
    // A node already in a job cannot take a second one.
    assert_err(
        r.env.join(&r.nodes[0].insecure_clone(), &job2).await,
        CohortError::NodeBusy,
    );
}

#[tokio::test]
async fn cancel_by_non_requester_is_refused() {
    let mut r = open_job(4).await;
    let n = r.nodes[0].insecure_clone();
    let mut ix = client::cancel_job(&r.requester.pubkey(), &r.job);
    ix.accounts[0].pubkey = n.pubkey();
    assert_err(r.env.send(&[ix], &[&n]).await, CohortError::NotRequester);
}

#[tokio::test]
async fn expire_before_deadline_is_refused() {
    let mut r = open_job(2).await;
    let ix = client::expire_job(&r.job);
    assert_err(
        r.env.send(std::slice::from_ref(&ix), &[]).await,
        CohortError::DeadlineNotReached,
    );
    r.env.advance(spec().join_window_secs as i64 + 1);
    r.env.send(&[ix], &[]).await.unwrap();
    let requester = r.requester.insecure_clone();
    r.env
        .send(
            &[client::withdraw(&requester.pubkey(), &r.job)],
            &[&requester],
        )
        .await
        .unwrap();
    let j: Job = r.env.state(&r.job).await;
    assert_eq!((j.state, j.refunded), (JobState::Expired, j.deposit));
}

#[tokio::test]
async fn payout_beyond_deposit_is_refused() {
    let mut r = running_job().await;
    // More points than 4 members x 10 steps can earn in one epoch.
    let w = r.witnesses(0).await[0];
    let res = r.send_as(r.attest(&w, 0, [1; 32], 41), &w).await;
    assert_err(res, CohortError::PointsExceedBudget);
    // A colluding quorum attests a root whose leaves exceed its stated total:
    // the claim would pay more than is owed, and is refused.
    let m = r.nodes[0].insecure_clone();
    let forged = vec![(m.pubkey(), 10u64)];
    let t = tree(&forged);
    let ws = r.witnesses(0).await;
    for w in ws.iter().take(2) {
        r.send_as(r.attest(w, 0, t.root(), 1), w).await.unwrap();
    }
    let (p, proof) = proof_for(&forged, &m.pubkey());
    let res = r.claim(&m.pubkey(), p, proof).await;
    assert_err(res, CohortError::PayoutExceedsDeposit);
}

#[tokio::test]
async fn slash_without_quorum_is_refused_and_with_quorum_slashes() {
    let mut r = running_job().await;
    let ws = r.witnesses(0).await;
    let accused = r.non_witness(0).await;
    let last = r.last_member().await;
    let w0 = find(&r.nodes, &ws[0]).insecure_clone();
    let w1 = find(&r.nodes, &ws[1]).insecure_clone();
    let case = client::fraud_case_address(&r.job, &accused, 0);
    r.env.track(case);
    // One witness below the quorum: its vote is recorded, nothing is taken.
    let ix = client::report_fraud(&r.job, 0, &accused, &last, &ws[0], &[ws[0]], [1; 32]);
    r.env.send(std::slice::from_ref(&ix), &[&w0]).await.unwrap();
    let n: Node = r.env.state(&client::node_address(&accused)).await;
    assert_eq!(n.stake, STAKE);
    let c: FraudCase = r.env.state(&case).await;
    assert_eq!((c.votes, c.slashed), (1, false));
    // Voting again does not count twice.
    r.env.send(&[ix], &[&w0]).await.unwrap();
    let c: FraudCase = r.env.state(&case).await;
    assert_eq!(c.votes, 1);
    // A non-witness co-signing does not make a quorum either.
    let ix = client::report_fraud(
        &r.job,
        0,
        &accused,
        &last,
        &ws[0],
        &[ws[0], accused],
        [1; 32],
    );
    let acc_kp = find(&r.nodes, &accused).insecure_clone();
    assert_err(
        r.env.send(&[ix], &[&w0, &acc_kp]).await,
        CohortError::NotWitness,
    );

    // The second witness, in its own transaction, completes the quorum.
    let job_before = r.env.balance(&r.job).await;
    let burned_before = r.env.burned;
    let ix = client::report_fraud(&r.job, 0, &accused, &last, &ws[1], &[ws[1]], [2; 32]);
    r.env.send(&[ix], &[&w1]).await.unwrap();
    let m: Member = r.env.state(&client::member_address(&r.job, &accused)).await;
    assert_eq!(
        (m.status, m.slashed, m.evidence),
        (MemberStatus::Slashed, STAKE, [1; 32])
    );
    let n: Node = r.env.state(&client::node_address(&accused)).await;
    assert_eq!((n.stake, n.slashes), (0, 1));
    let j: Job = r.env.state(&r.job).await;
    assert_eq!((j.slashed, j.member_count), (STAKE, 3));
    // Burned, not paid into the job (nor to the requester).
    assert_eq!(r.env.balance(&r.job).await, job_before);
    assert_eq!(r.env.burned, burned_before + STAKE);
    // Indices stay dense: 0..3 are all active.
    let by_index = r.by_index().await;
    assert!(by_index.iter().all(|m| m.is_some()));
    // The slashed member cannot claim, even with a valid proof.
    let pts = points(&r, 2);
    r.finalize(0, &pts).await;
    let (p, proof) = proof_for(&pts, &accused);
    let res = r.claim(&accused, p, proof).await;
    assert_err(res, CohortError::NotActiveMember);
}

// Issue 15: each hole, performed as an attacker would. Balances are checked
// to the lamport; the harness checks conservation after every transaction.

impl Running {
    fn kp(&self, k: &Pubkey) -> Keypair {
        find(&self.nodes, k).insecure_clone()
    }

    async fn as_requester(
        &mut self,
        ix: Instruction,
    ) -> Result<(), solana_program_test::BanksClientError> {
        let r = self.requester.insecure_clone();
        self.env.send(&[ix], &[&r]).await
    }

    async fn leave(&mut self, who: &Pubkey) -> Result<(), solana_program_test::BanksClientError> {
        let last = self.last_member().await;
        let ix = client::leave_job(who, &self.job, &last);
        self.send_as(ix, who).await
    }

    /// The first two witnesses of `epoch` report `accused`.
    async fn report(
        &mut self,
        epoch: u32,
        accused: &Pubkey,
        evidence: [u8; 32],
    ) -> Result<(), solana_program_test::BanksClientError> {
        let ws: Vec<Pubkey> = self.witnesses(epoch).await.into_iter().take(2).collect();
        let last = self.last_member().await;
        self.env
            .track(client::fraud_case_address(&self.job, accused, epoch));
        let ix = client::report_fraud(&self.job, epoch, accused, &last, &ws[0], &ws, evidence);
        let signers: Vec<Keypair> = ws.iter().map(|w| self.kp(w)).collect();
        let refs: Vec<&Keypair> = signers.iter().collect();
        self.env.send(&[ix], &refs).await
    }

    /// `who` claims its leaf of `pts` and must be paid exactly `want`.
    async fn claim_exactly(&mut self, who: &Pubkey, pts: &[(Pubkey, u64)], want: u64) {
        let before = self.env.balance(who).await;
        let (p, proof) = proof_for(pts, who);
        self.claim(who, p, proof).await.unwrap();
        assert_eq!(self.env.balance(who).await, before + want, "{who} paid");
    }
}

#[tokio::test]
async fn hole_1_a_recreated_member_cannot_claim_the_same_points_twice() {
    let mut r = running_job().await;
    let pts = points(&r, 10);
    r.finalize(0, &pts).await;
    let attacker = r.nodes[0].pubkey();
    r.claim_exactly(&attacker, &pts, PRICE).await;
    let paid = r.env.balance(&attacker).await;
    // leave, close, rejoin, claim again: the Member cannot be closed while
    // the job lives, and a rejoin keeps `claimed`.
    r.leave(&attacker).await.unwrap();
    let ix = client::close_member(&attacker, &r.job, 0, vec![]);
    assert_err(r.send_as(ix, &attacker).await, CohortError::MemberLocked);
    let kp = r.kp(&attacker);
    r.env.join(&kp, &r.job).await.unwrap();
    let m: Member = r
        .env
        .state(&client::member_address(&r.job, &attacker))
        .await;
    assert_eq!((m.status, m.claimed), (MemberStatus::Active, PRICE));
    let (p, proof) = proof_for(&pts, &attacker);
    assert_err(
        r.claim(&attacker, p, proof).await,
        CohortError::NothingToClaim,
    );
    assert_eq!(r.env.balance(&attacker).await, paid);

    // A slashed member can neither close (to top up and rejoin) nor rejoin.
    let ws = r.witnesses(0).await;
    let cheat = r
        .nodes
        .iter()
        .map(|n| n.pubkey())
        .find(|k| *k != attacker && !ws.iter().take(2).any(|w| w == k))
        .unwrap();
    r.report(0, &cheat, [3; 32]).await.unwrap();
    let ix = client::close_member(&cheat, &r.job, 0, vec![]);
    assert_err(r.send_as(ix, &cheat).await, CohortError::MemberLocked);
    let ck = r.kp(&cheat);
    let ix = client::update_node(&cheat, terms(PRICE, 5_000), STAKE);
    r.env.send(&[ix], &[&ck]).await.unwrap();
    assert_err(r.env.join(&ck, &r.job).await, CohortError::NotActiveMember);
    let (p, proof) = proof_for(&pts, &cheat);
    assert_err(
        r.claim(&cheat, p, proof).await,
        CohortError::NotActiveMember,
    );

    // The honest members are paid in full.
    for k in r.nodes.iter().map(|n| n.pubkey()).collect::<Vec<_>>() {
        if k != attacker && k != cheat {
            r.claim_exactly(&k, &pts, PRICE).await;
        }
    }
    // Once the job has ended, the slashed member may close, and can never
    // come back: a terminal job takes no members.
    let requester = r.requester.pubkey();
    r.as_requester(client::cancel_job(&requester, &r.job))
        .await
        .unwrap();
    let ix = client::close_member(&cheat, &r.job, 0, vec![]);
    r.send_as(ix, &cheat).await.unwrap();
    assert_err(r.env.join(&ck, &r.job).await, CohortError::InvalidJobState);
}

#[tokio::test]
async fn hole_2_a_job_address_is_never_reused() {
    let mut r = open_job(4).await;
    let requester = r.requester.pubkey();
    let before = r.env.balance(&requester).await;
    r.as_requester(client::cancel_job(&requester, &r.job))
        .await
        .unwrap();
    r.as_requester(client::close_job(&requester, &r.job))
        .await
        .unwrap();
    // Same id again, with a one-seat committee the requester would hold:
    // refused, so the old members can never be attached to a new job.
    let mut one = spec();
    (one.min_nodes, one.witness_count, one.quorum) = (1, 1, 1);
    let rq = r.requester.insecure_clone();
    let res = r
        .env
        .create_job(&rq, 1, one, one.full_budget().unwrap())
        .await
        .map(|_| ());
    assert_err(res, CohortError::JobIdUsed);
    assert!(r.env.account(&r.job).await.is_none());
    let ids: Requester = r.env.state(&client::requester_address(&requester)).await;
    assert_eq!(ids.next_job_id, 2);
    // The requester got back exactly its deposit and the job's rent.
    let job_rent = r.env.rent.minimum_balance(Job::LEN);
    assert_eq!(
        r.env.balance(&requester).await,
        before + spec().full_budget().unwrap() + job_rent
    );
    // The old members leave with their whole stake.
    for n in r.nodes.clone_keys() {
        let ix = client::close_member(&n.pubkey(), &r.job, 0, vec![]);
        r.env.send(&[ix], &[&n]).await.unwrap();
        let node: Node = r.env.state(&client::node_address(&n.pubkey())).await;
        assert_eq!((node.stake, node.active_job), (STAKE, Pubkey::default()));
        r.env
            .send(&[client::deregister_node(&n.pubkey())], &[&n])
            .await
            .unwrap();
    }
    // A new id works.
    r.env
        .create_job(&rq, 2, one, one.full_budget().unwrap())
        .await
        .unwrap();
}

trait CloneKeys {
    fn clone_keys(&self) -> Vec<Keypair>;
}

impl CloneKeys for Vec<Keypair> {
    fn clone_keys(&self) -> Vec<Keypair> {
        self.iter().map(|k| k.insecure_clone()).collect()
    }
}

#[tokio::test]
async fn hole_3_lamports_sent_to_a_closed_job_do_not_lock_its_members() {
    let mut r = running_job().await;
    let pts = points(&r, 10);
    r.finalize(0, &pts).await;
    for k in r.nodes.iter().map(|n| n.pubkey()).collect::<Vec<_>>() {
        r.claim_exactly(&k, &pts, PRICE).await;
    }
    let requester = r.requester.pubkey();
    r.as_requester(client::cancel_job(&requester, &r.job))
        .await
        .unwrap();
    r.as_requester(client::withdraw(&requester, &r.job))
        .await
        .unwrap();
    r.as_requester(client::close_job(&requester, &r.job))
        .await
        .unwrap();
    // The griefer revives the address with lamports (a system account).
    let min = r.env.rent.minimum_balance(0);
    let job = r.job;
    r.env.fund(&job, min).await;
    assert_eq!(r.env.balance(&job).await, min);
    // Members still close, the epoch still closes, nodes still leave.
    let payer = r.env.ctx.payer.pubkey();
    r.env
        .send(&[client::close_epoch(&payer, &job, 0)], &[])
        .await
        .unwrap();
    for n in r.nodes.clone_keys() {
        let ix = client::close_member(&n.pubkey(), &job, 0, vec![]);
        r.env.send(&[ix], &[&n]).await.unwrap();
        r.env
            .send(&[client::deregister_node(&n.pubkey())], &[&n])
            .await
            .unwrap();
    }
    r.env.advance(NODE_COOLDOWN_SECS);
    for n in r.nodes.clone_keys() {
        let before = r.env.balance(&n.pubkey()).await;
        r.env
            .send(&[client::close_node(&n.pubkey())], &[&n])
            .await
            .unwrap();
        let rent = r.env.rent.minimum_balance(Node::LEN);
        assert_eq!(r.env.balance(&n.pubkey()).await, before + STAKE + rent);
    }
}

#[tokio::test]
async fn hole_4_leaving_just_before_the_report_does_not_dodge_the_slash() {
    let mut r = running_job().await;
    let cheat = r.non_witness(0).await;
    r.leave(&cheat).await.unwrap();
    let burned = r.env.burned;
    r.report(0, &cheat, [4; 32]).await.unwrap();
    let m: Member = r.env.state(&client::member_address(&r.job, &cheat)).await;
    assert_eq!((m.status, m.slashed), (MemberStatus::Slashed, STAKE));
    let n: Node = r.env.state(&client::node_address(&cheat)).await;
    assert_eq!(n.stake, 0);
    assert_eq!(r.env.burned, burned + STAKE);
    // Its points for the epoch it cheated in are not paid.
    let pts = points(&r, 10);
    r.finalize(0, &pts).await;
    let (p, proof) = proof_for(&pts, &cheat);
    assert_err(
        r.claim(&cheat, p, proof).await,
        CohortError::NotActiveMember,
    );
    for k in r.nodes.iter().map(|n| n.pubkey()).collect::<Vec<_>>() {
        if k != cheat {
            r.claim_exactly(&k, &pts, PRICE).await;
        }
    }
}

#[tokio::test]
async fn hole_4_closing_the_finalized_epoch_does_not_block_reports() {
    let mut r = running_job().await;
    let pts = points(&r, 10);
    r.finalize(0, &pts).await;
    let payer = r.env.ctx.payer.pubkey();
    let close = client::close_epoch(&payer, &r.job, 0);
    assert_err(
        r.env.send(std::slice::from_ref(&close), &[]).await,
        CohortError::EpochReportable,
    );
    // The report for the finalized epoch lands.
    let cheat = r.non_witness(0).await;
    r.report(0, &cheat, [4; 32]).await.unwrap();
    let m: Member = r.env.state(&client::member_address(&r.job, &cheat)).await;
    assert_eq!(m.status, MemberStatus::Slashed);
    // Two epochs later it is past reporting, and closes.
    for e in 1..3 {
        r.env.start_epoch(&r.job).await.unwrap();
        if e == 1 {
            assert_err(
                r.env.send(std::slice::from_ref(&close), &[]).await,
                CohortError::EpochReportable,
            );
        }
        let pts: Vec<(Pubkey, u64)> = r
            .nodes
            .iter()
            .map(|n| {
                (
                    n.pubkey(),
                    if n.pubkey() == cheat {
                        10
                    } else {
                        10 * (e + 1)
                    },
                )
            })
            .collect();
        r.finalize(e as u32, &pts).await;
    }
    r.env.send(&[close], &[]).await.unwrap();
}

#[tokio::test]
async fn hole_5_a_colluding_quorum_cannot_pay_one_member_everything() {
    let mut r = running_job().await;
    // The quorum gives the whole epoch's budget (4 members x 10 steps) to one.
    let greedy = r.nodes[0].pubkey();
    let forged: Vec<(Pubkey, u64)> = r
        .nodes
        .iter()
        .map(|n| (n.pubkey(), if n.pubkey() == greedy { 40 } else { 0 }))
        .collect();
    r.finalize(0, &forged).await;
    let before = r.env.balance(&greedy).await;
    let (p, proof) = proof_for(&forged, &greedy);
    assert_err(
        r.claim(&greedy, p, proof).await,
        CohortError::PointsExceedPresence,
    );
    assert_eq!(r.env.balance(&greedy).await, before);
    // An honest epoch after it pays everyone what the chain let them earn.
    r.env.start_epoch(&r.job).await.unwrap();
    let honest = points(&r, 10);
    r.finalize(1, &honest).await;
    for k in r.nodes.iter().map(|n| n.pubkey()).collect::<Vec<_>>() {
        r.claim_exactly(&k, &honest, PRICE).await;
    }
}

#[tokio::test]
async fn hole_5_a_requester_holding_a_quorum_gains_nothing_from_slashing() {
    let mut r = open_job(4).await;
    // The victim staked twice the job's minimum: at most the minimum is taken.
    let ws_candidates = r.nodes.clone_keys();
    r.env.start_epoch(&r.job).await.unwrap();
    let victim = r.non_witness(0).await;
    let vk = find(&ws_candidates, &victim).insecure_clone();
    let ix = client::update_node(&victim, terms(PRICE, 5_000), STAKE);
    r.env.send(&[ix], &[&vk]).await.unwrap();
    let requester = r.requester.pubkey();
    let start = r.env.balance(&requester).await;
    let deposit = spec().full_budget().unwrap();
    let pts = points(&r, 10);
    r.finalize(0, &pts).await;
    // The requester's Sybil witnesses (the quorum) slash the honest victim.
    let burned = r.env.burned;
    r.report(0, &victim, [5; 32]).await.unwrap();
    let m: Member = r.env.state(&client::member_address(&r.job, &victim)).await;
    assert_eq!((m.slashed, m.evidence), (STAKE, [5; 32]));
    let n: Node = r.env.state(&client::node_address(&victim)).await;
    assert_eq!(n.stake, STAKE, "only min_stake is taken");
    assert_eq!(r.env.burned, burned + STAKE, "burned, not paid to anyone");
    assert_eq!(r.env.balance(&requester).await, start);
    for k in r.nodes.iter().map(|n| n.pubkey()).collect::<Vec<_>>() {
        if k != victim {
            r.claim_exactly(&k, &pts, PRICE).await;
        }
    }
    r.as_requester(client::cancel_job(&requester, &r.job))
        .await
        .unwrap();
    r.as_requester(client::withdraw(&requester, &r.job))
        .await
        .unwrap();
    // What the victim earned but could not claim is burned at close too.
    r.env.advance(CLAIM_WINDOW_SECS);
    r.as_requester(client::close_job(&requester, &r.job))
        .await
        .unwrap();
    assert_eq!(r.env.burned, burned + STAKE + PRICE);
    let job_rent = r.env.rent.minimum_balance(Job::LEN);
    // The requester paid for all four members' work, the victim's included.
    assert_eq!(
        r.env.balance(&requester).await,
        start + deposit - 4 * PRICE + job_rent
    );
}

#[tokio::test]
async fn hole_9_an_empty_requester_wallet_cannot_block_finalization() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let nodes = env.nodes(4).await;
    let mut s = spec();
    s.epochs = 1;
    let job = env
        .create_job(&requester, 1, s, s.full_budget().unwrap())
        .await
        .unwrap();
    for n in &nodes {
        env.join(n, &job).await.unwrap();
    }
    let mut r = Running {
        env,
        requester: requester.insecure_clone(),
        nodes,
        job,
    };
    r.env.start_epoch(&job).await.unwrap();
    // The requester empties its wallet: a pushed refund of 0.1 epoch-price
    // would leave it below rent and fail the finalizing vote.
    let sink = Keypair::new();
    r.env.track(sink.pubkey());
    let all = r.env.balance(&requester.pubkey()).await;
    let ix =
        solana_system_interface::instruction::transfer(&requester.pubkey(), &sink.pubkey(), all);
    r.env.send(&[ix], &[&requester]).await.unwrap();
    let mut pts = points(&r, 10);
    pts[3].1 = 9;
    r.finalize(0, &pts).await;
    let j: Job = r.env.state(&job).await;
    assert_eq!((j.state, j.refunded), (JobState::Completed, 0));
    assert_eq!(r.env.balance(&requester.pubkey()).await, 0);
    for k in r.nodes.iter().map(|n| n.pubkey()).collect::<Vec<_>>() {
        let (p, _) = proof_for(&pts, &k);
        r.claim_exactly(&k, &pts, p * PRICE / 10).await;
    }
    // The requester pulls its refund when its wallet can hold it.
    r.env.fund(&requester.pubkey(), SOL).await;
    r.as_requester(client::withdraw(&requester.pubkey(), &job))
        .await
        .unwrap();
    assert_eq!(r.env.balance(&requester.pubkey()).await, SOL + PRICE / 10);
}

#[tokio::test]
async fn hole_10_a_late_finalization_restarts_the_claim_window() {
    let mut r = running_job().await;
    let requester = r.requester.pubkey();
    r.as_requester(client::cancel_job(&requester, &r.job))
        .await
        .unwrap();
    // The open epoch finalizes late, just before its deadline.
    r.env.advance(spec().max_epoch_secs as i64 - 10);
    let pts = points(&r, 10);
    r.finalize(0, &pts).await;
    // A week after the cancel, but not after the finalization.
    r.env.advance(CLAIM_WINDOW_SECS - 1_000);
    assert_err(
        r.as_requester(client::close_job(&requester, &r.job)).await,
        CohortError::ClaimWindowOpen,
    );
    // A member that closes without claiming first is paid by the close.
    let m = r.nodes[0].pubkey();
    let before = r.env.balance(&m).await;
    let (p, proof) = proof_for(&pts, &m);
    let ix = client::close_member(&m, &r.job, p, proof);
    assert_err(
        r.send_as(client::close_member(&m, &r.job, 0, vec![]), &m)
            .await,
        CohortError::InvalidProof,
    );
    r.send_as(ix, &m).await.unwrap();
    let rent = r.env.rent.minimum_balance(Member::LEN);
    assert_eq!(r.env.balance(&m).await, before + PRICE + rent);
    for k in r
        .nodes
        .iter()
        .skip(1)
        .map(|n| n.pubkey())
        .collect::<Vec<_>>()
    {
        r.claim_exactly(&k, &pts, PRICE).await;
    }
    r.as_requester(client::close_job(&requester, &r.job))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_spoofed_sysvar_is_refused() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    // A look-alike Clock account, far in the future, at another address.
    let real = env
        .account(&solana_sdk::sysvar::clock::ID)
        .await
        .expect("clock");
    let fake = Pubkey::new_unique();
    env.ctx
        .set_account(&fake, &AccountSharedData::from(Account { ..real }));
    let s = spec();
    let mut ix = client::create_job(&requester.pubkey(), 1, s, s.full_budget().unwrap());
    ix.accounts[5].pubkey = fake;
    assert_err(
        env.send(&[ix], &[&requester]).await,
        CohortError::WrongSysvar,
    );
}

#[tokio::test]
async fn a_fake_system_program_is_refused() {
    let mut env = Env::new().await;
    let node = env.user(SOL).await;
    let mut ix = client::register_node(&node.pubkey(), terms(PRICE, 5_000), STAKE);
    ix.accounts[2].pubkey = cohort_program::ID;
    assert_err(
        env.send(&[ix], &[&node]).await,
        CohortError::WrongSystemProgram,
    );
}

#[tokio::test]
async fn a_prefunded_address_does_not_block_creation() {
    let mut env = Env::new().await;
    let node = env.user(SOL).await;
    let addr = client::node_address(&node.pubkey());
    let min = env.rent.minimum_balance(0);
    env.fund(&addr, min).await;
    env.register(&node, PRICE, 5_000, STAKE).await.unwrap();
    let n: Node = env.state(&addr).await;
    assert_eq!(n.stake, STAKE);
    assert_eq!(
        env.balance(&addr).await,
        env.rent.minimum_balance(Node::LEN) + STAKE
    );
}

#[tokio::test]
async fn hole_7_a_16_seat_committee_with_quorum_9_slashes_over_several_transactions() {
    let mut env = Env::new().await;
    let requester = env.user(100 * SOL).await;
    let nodes = env.nodes(17).await;
    let mut s = spec();
    (s.min_nodes, s.max_nodes, s.witness_count, s.quorum) = (16, 17, 16, 9);
    let job = env
        .create_job(&requester, 1, s, s.full_budget().unwrap())
        .await
        .unwrap();
    for n in &nodes {
        env.join(n, &job).await.unwrap();
    }
    let mut r = Running {
        env,
        requester,
        nodes,
        job,
    };
    r.env.start_epoch(&job).await.unwrap();
    let ws = r.witnesses(0).await;
    assert_eq!(ws.len(), 16);
    let cheat = r.non_witness(0).await;
    let case = client::fraud_case_address(&job, &cheat, 0);
    r.env.track(case);
    let burned = r.env.burned;
    // Nine votes in three transactions of three witnesses each.
    for (k, chunk) in ws[..9].chunks(3).enumerate() {
        let last = r.last_member().await;
        let ix = client::report_fraud(&job, 0, &cheat, &last, &chunk[0], chunk, [7; 32]);
        let signers: Vec<Keypair> = chunk.iter().map(|w| r.kp(w)).collect();
        let refs: Vec<&Keypair> = signers.iter().collect();
        r.env.send(&[ix], &refs).await.unwrap();
        let c: FraudCase = r.env.state(&case).await;
        assert_eq!(c.votes as usize, 3 * (k + 1));
        let m: Member = r.env.state(&client::member_address(&job, &cheat)).await;
        assert_eq!(
            m.status == MemberStatus::Slashed,
            k == 2,
            "after {} votes",
            c.votes
        );
    }
    let n: Node = r.env.state(&client::node_address(&cheat)).await;
    assert_eq!(n.stake, 0);
    assert_eq!(r.env.burned, burned + STAKE);
    // A tenth vote finds the member already slashed.
    let last = r.last_member().await;
    let ix = client::report_fraud(&job, 0, &cheat, &last, &ws[9], &ws[9..10], [7; 32]);
    let w9 = r.kp(&ws[9]);
    assert_err(
        r.env.send(&[ix], &[&w9]).await,
        CohortError::NotActiveMember,
    );
    // The settled case gives its rent back to whoever opened it.
    let before = r.env.balance(&ws[0]).await;
    let rent = r.env.rent.minimum_balance(FraudCase::LEN);
    r.env
        .send(&[client::close_fraud_case(&ws[0], &job, &cheat, 0)], &[])
        .await
        .unwrap();
    assert_eq!(r.env.balance(&ws[0]).await, before + rent);
}

/// What the old rule (the newest slot hash when `start_epoch` runs) would
/// have drawn, and what the seal draws, for a 10-member job with 3 colluders.
fn colluders_hold_quorum(seed_hash: &[u8; 32], job: &Pubkey, n: u32, colluders: &[u32]) -> bool {
    let s = spec();
    let (_, c) = cohort_program::schedule::seal_committee(seed_hash, job, 0, n, s.witness_count);
    c.members().filter(|m| colluders.contains(m)).count() >= s.quorum as usize
}

#[tokio::test]
async fn hole_6_the_member_who_cranks_start_epoch_cannot_choose_its_committee() {
    use cohort_program::schedule::SEAL_DELAY_SLOTS;
    use solana_sdk::hash::Hash;
    let mut r = open_job(4).await;
    let cranker = r.nodes[0].insecure_clone();
    let by_index = r.by_index().await;
    let colluders: Vec<u32> = [0usize, 1]
        .iter()
        .map(|i| {
            by_index
                .iter()
                .position(|k| *k == Some(r.nodes[*i].pubkey()))
                .unwrap() as u32
        })
        .collect();
    // The cranker grinds the slot it starts in: it waits until the newest
    // slot hash (all it can see) would seat a colluding quorum.
    let mut waited = 0;
    loop {
        r.env.advance_slots(1);
        let newest = r.env.hashes[0].1.to_bytes();
        if colluders_hold_quorum(&newest, &r.job, 4, &colluders) {
            break;
        }
        waited += 1;
        assert!(waited < 1_000, "a suitable slot hash was never seen");
    }
    let ix = client::start_epoch(&cranker.pubkey(), &r.job, 0);
    r.env.send(&[ix], &[&cranker]).await.unwrap();
    let e: Epoch = r.env.state(&client::epoch_address(&r.job, 0)).await;
    assert!(
        !e.sealed && e.seed == [0; 32],
        "no seed exists at the start"
    );
    assert_eq!(e.seal_slot, r.env.slot + SEAL_DELAY_SLOTS);
    // Nothing can be attested or reported until the seal.
    let w = cranker.pubkey();
    let ix = r.attest(&w, 0, [1; 32], 0);
    assert_err(r.send_as(ix, &w).await, CohortError::EpochNotSealed);
    // Sealing before the seal slot has a hash is refused.
    let job = r.job;
    let early = client::seal_epoch(&job, 0, &[]);
    assert_err(r.env.send(&[early], &[]).await, CohortError::SealTooEarly);
    // The seal slot's hash is one nobody saw at the start; here the test
    // makes it one under which the colluders hold no quorum.
    r.env.advance_slots(SEAL_DELAY_SLOTS + 1);
    let mut hashes = r.env.hashes.clone();
    let at = hashes.iter().position(|(s, _)| *s == e.seal_slot).unwrap();
    let mut k = 0u8;
    loop {
        let h = [k; 32];
        if !colluders_hold_quorum(&h, &r.job, 4, &colluders) {
            hashes[at].1 = Hash::new_from_array(h);
            break;
        }
        k += 1;
    }
    r.env.set_slot_hashes(&hashes);
    // A seal naming the colluders' accounts instead of the drawn ones fails.
    let seats = r.witnesses_drawn(0).await;
    let mut forged: Vec<Pubkey> = seats.clone();
    let colluder_keys = [r.nodes[0].pubkey(), r.nodes[1].pubkey()];
    if let Some(j) = forged.iter().position(|k| !colluder_keys.contains(k)) {
        forged[j] = *colluder_keys.iter().find(|c| !forged.contains(c)).unwrap();
        let ix = client::seal_epoch(&job, 0, &forged);
        assert_err(r.env.send(&[ix], &[]).await, CohortError::AccountMismatch);
    }
    let ix = client::seal_epoch(&job, 0, &seats[..seats.len() - 1]);
    assert_err(
        r.env.send(&[ix], &[]).await,
        CohortError::InvalidInstruction,
    );
    // Waiting to seal later changes nothing: the seal slot is fixed.
    r.env.advance_slots(20);
    r.env.seal(&job, 0).await.unwrap();
    let e: Epoch = r.env.state(&client::epoch_address(&job, 0)).await;
    let seated: Vec<Pubkey> = e.seated().map(|(_, k)| *k).collect();
    assert_eq!(seated, seats);
    let held = seated.iter().filter(|k| colluder_keys.contains(k)).count();
    assert!(
        held < spec().quorum as usize,
        "the grind still won: {held} seats"
    );
    assert_err(r.env.seal(&job, 0).await, CohortError::EpochSealed);
}

#[tokio::test]
async fn hole_6_a_seal_slot_the_sysvar_forgot_is_retargeted_not_chosen() {
    let mut r = open_job(4).await;
    let job = r.job;
    r.env.start_unsealed(&job).await.unwrap();
    let e: Epoch = r.env.state(&client::epoch_address(&job, 0)).await;
    // 600 slots pass unsealed: SlotHashes keeps 512, the seal slot is gone.
    r.env.advance_slots(600);
    let ix = client::seal_epoch(&job, 0, &[]);
    r.env.send(&[ix], &[]).await.unwrap();
    let after: Epoch = r.env.state(&client::epoch_address(&job, 0)).await;
    assert!(!after.sealed);
    assert!(after.seal_slot > r.env.slot && after.seal_slot > e.seal_slot);
    r.env.advance_slots(3);
    r.env.seal(&job, 0).await.unwrap();
    assert!(r.witnesses(0).await.len() == 3);
}

#[tokio::test]
async fn hole_8_a_member_leaving_mid_epoch_moves_no_seat() {
    let mut r = running_job().await;
    let ws = r.witnesses(0).await;
    let by_index = r.by_index().await;
    // The member at the lowest index leaves: the last member is swapped
    // into its index, which used to hand it (or take from it) a seat.
    let leaver = by_index[0].unwrap();
    let last = r.last_member().await;
    let ix = client::leave_job(&leaver, &r.job, &last);
    r.send_as(ix, &leaver).await.unwrap();
    assert_eq!(r.witnesses(0).await, ws, "seats are keys fixed at the seal");
    let everyone = points(&r, 10);
    let t = tree(&everyone);
    // A member that holds no seat cannot vote, wherever it moved.
    let outsider = r
        .nodes
        .iter()
        .map(|n| n.pubkey())
        .find(|k| !ws.contains(k))
        .unwrap();
    let ix = r.attest(&outsider, 0, t.root(), t.total());
    assert_err(r.send_as(ix, &outsider).await, CohortError::NotWitness);
    // Every seated witness still votes, the leaver too if it holds a seat.
    r.finalize(0, &everyone).await;
    let j: Job = r.env.state(&r.job).await;
    assert_eq!(j.epochs_finalized, 1);
}

#[tokio::test]
async fn hole_8_a_timed_out_epoch_is_skipped_unpaid_and_the_job_goes_on() {
    let mut r = running_job().await;
    let job = r.job;
    let each = spec().steps_per_epoch as u64;
    r.finalize(0, &points(&r, each)).await;
    r.env.start_epoch(&job).await.unwrap();
    let skip = client::skip_epoch(&job, 1);
    assert_err(
        r.env.send(std::slice::from_ref(&skip), &[]).await,
        CohortError::DeadlineNotReached,
    );
    r.env.advance(spec().max_epoch_secs as i64 + 1);
    // Ending the whole job is no longer what a stalled epoch does.
    assert_err(
        r.env.send(&[client::expire_job(&job)], &[]).await,
        CohortError::EpochOpen,
    );
    r.env.send(std::slice::from_ref(&skip), &[]).await.unwrap();
    assert_err(r.env.send(&[skip], &[]).await, CohortError::WrongEpoch);
    let w = r.witnesses(1).await[0];
    let ix = r.attest(&w, 1, [1; 32], 0);
    assert_err(r.send_as(ix, &w).await, CohortError::WrongEpoch);
    let j: Job = r.env.state(&job).await;
    assert_eq!(
        (j.state, j.epochs_skipped, j.epochs_finalized),
        (JobState::Running, 1, 1)
    );
    assert_eq!(j.latest_finalized(), Some(0));
    // Epoch 2 runs and pays; the skipped epoch's steps are worth nothing.
    r.env.start_epoch(&job).await.unwrap();
    let total = points(&r, 2 * each);
    r.finalize(2, &total).await;
    let j: Job = r.env.state(&job).await;
    assert_eq!(
        (j.state, j.latest_finalized()),
        (JobState::Completed, Some(2))
    );
    let keys: Vec<Pubkey> = r.nodes.iter().map(|n| n.pubkey()).collect();
    for k in keys {
        let before = r.env.balance(&k).await;
        let (p, proof) = proof_for(&total, &k);
        r.claim(&k, p, proof).await.unwrap();
        assert_eq!(r.env.balance(&k).await - before, 2 * PRICE);
    }
}
