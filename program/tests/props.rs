//! Property tests: random instruction sequences against a real bank, and
//! random bytes against the instruction decoder and processor.

mod common;

use cohort_program::client;
use cohort_program::error::CohortError;
use cohort_program::instruction::CohortInstruction;
use cohort_program::processor::process_instruction;
use cohort_program::state::*;
use common::*;
use proptest::prelude::*;
use solana_program::account_info::AccountInfo;
use solana_program::program_error::ProgramError;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};

#[derive(Debug, Clone)]
enum Op {
    Join(usize),
    Leave(usize),
    Start,
    /// Honest witnesses attest; each member earns `steps - (i * skew) % steps` points.
    Attest(usize, u64),
    /// The first `quorum` witnesses collude: they attest a table that gives
    /// member `i` the whole epoch's budget.
    Forge(usize),
    Claim(usize),
    Cancel,
    Expire,
    /// Skip the open epoch (refused before its deadline).
    Skip,
    Advance(i64),
    /// A quorum of the epoch's witnesses reports member `i` (who may have left).
    Fraud(usize),
    /// A single witness (below quorum) reports member `i`: never slashes.
    MinorityFraud(usize),
    /// Without a proof, or with the member's proof of its points.
    CloseMember(usize, bool),
    CloseEpoch(u32),
    Withdraw,
    /// Close the job; if it closes, its members close too and a new job
    /// takes its place (the old id is refused).
    CloseJob,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..5usize).prop_map(Op::Join),
        1 => (0..5usize).prop_map(Op::Leave),
        4 => Just(Op::Start),
        8 => ((0..3usize), (0..4u64)).prop_map(|(w, s)| Op::Attest(w, s)),
        1 => (0..5usize).prop_map(Op::Forge),
        4 => (0..5usize).prop_map(Op::Claim),
        1 => Just(Op::Cancel),
        1 => Just(Op::Expire),
        1 => Just(Op::Skip),
        1 => prop_oneof![Just(60i64), Just(4_000i64), Just(CLAIM_WINDOW_SECS)].prop_map(Op::Advance),
        1 => (0..5usize).prop_map(Op::Fraud),
        1 => (0..5usize).prop_map(Op::MinorityFraud),
        1 => ((0..5usize), any::<bool>()).prop_map(|(i, p)| Op::CloseMember(i, p)),
        1 => (0..3u32).prop_map(Op::CloseEpoch),
        1 => Just(Op::Withdraw),
        1 => Just(Op::CloseJob),
    ]
}

async fn stakes(env: &mut Env, nodes: &[Keypair]) -> Vec<u64> {
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        let node: Node = env.state(&client::node_address(&n.pubkey())).await;
        out.push(node.stake);
    }
    out
}

/// Runs `ops`; the harness asserts conservation and rent exemption after each
/// transaction, and this asserts: no member was ever paid beyond what the
/// chain let it earn (one point per step of each epoch it was present in,
/// and its share of the finalized table), no stake was taken but by a
/// quorum's recorded fraud vote, and no minority ever slashed anyone.
async fn run(ops: Vec<Op>) {
    let mut env = Env::new().await;
    let requester = env.user(100 * SOL).await;
    let nodes = env.nodes(5).await;
    let s = spec();
    let mut job_id = 1u64;
    let mut job = env
        .create_job(&requester, job_id, s, s.full_budget().unwrap())
        .await
        .unwrap();
    for n in &nodes[..3] {
        env.join(n, &job).await.unwrap();
    }
    // Ground truth: cumulative points each node earned per the finalized tables.
    let mut cumulative: Vec<(Pubkey, u64)> = nodes.iter().map(|n| (n.pubkey(), 0)).collect();
    let mut pending: Option<(u32, Vec<(Pubkey, u64)>)> = None;
    let refs: Vec<&Keypair> = nodes.iter().collect();
    for op in ops {
        let j: Job = match env.account(&job).await {
            Some(acc) if acc.owner == cohort_program::ID => Job::decode(&acc.data).unwrap(),
            _ => break,
        };
        let by_index = env.members_by_index(&job, &refs).await;
        let last = by_index.last().copied().flatten();
        let stakes_before = stakes(&mut env, &nodes).await;
        let mut quorum_fraud: Option<(usize, u32)> = None;
        let res = match op.clone() {
            Op::Join(i) => env.join(&nodes[i], &job).await,
            Op::Leave(i) => {
                let Some(last) = last else { continue };
                env.send(
                    &[client::leave_job(&nodes[i].pubkey(), &job, &last)],
                    &[&nodes[i]],
                )
                .await
            }
            Op::Start => {
                let r = env.start_epoch(&job).await;
                if let Ok(e) = r {
                    // Members active at start earn points this epoch.
                    let mut next = cumulative.clone();
                    for (k, p) in next.iter_mut() {
                        if by_index.contains(&Some(*k)) {
                            *p += s.steps_per_epoch as u64 / 2;
                        }
                    }
                    pending = Some((e, next));
                }
                r.map(|_| ())
            }
            Op::Attest(seat, skew) => {
                let Some((e, next)) = pending.clone() else {
                    continue;
                };
                let mut pts = next.clone();
                // A dishonest minority vote differs in points; honest ones agree.
                if skew == 3 {
                    pts[0].1 += 1;
                }
                let t = tree(&pts);
                let ws = env.witnesses(&job, e, &refs).await;
                let Some(w) = ws.get(seat) else { continue };
                let ix = client::attest_epoch(w, &job, e, [1; 32], t.root(), t.total());
                let r = env.send(&[ix], &[find(&nodes, w)]).await;
                let ep: Epoch = env.state(&client::epoch_address(&job, e)).await;
                if ep.finalized && pending.is_some() {
                    if ep.root == tree(&next).root() {
                        cumulative = next;
                    } else {
                        cumulative = pts;
                    }
                    pending = None;
                }
                r
            }
            Op::Forge(i) => {
                let Some((e, _)) = pending.clone() else {
                    continue;
                };
                let ep: Epoch = env.state(&client::epoch_address(&job, e)).await;
                let budget = s.steps_per_epoch as u64 * ep.members_at_start as u64;
                let mut forged: Vec<(Pubkey, u64)> = cumulative.clone();
                forged[i].1 += budget;
                let t = tree(&forged);
                let ws = env.witnesses(&job, e, &refs).await;
                let mut r = Ok(());
                for w in ws.iter().take(s.quorum as usize) {
                    let ix = client::attest_epoch(w, &job, e, [1; 32], t.root(), t.total());
                    r = env.send(&[ix], &[find(&nodes, w)]).await;
                }
                let ep: Epoch = env.state(&client::epoch_address(&job, e)).await;
                if ep.finalized && ep.root == t.root() {
                    cumulative = forged;
                    pending = None;
                }
                r
            }
            Op::Claim(i) => {
                let (p, proof) = proof_for(&cumulative, &nodes[i].pubkey());
                env.send(
                    &[client::claim(&nodes[i].pubkey(), &job, p, proof)],
                    &[&nodes[i]],
                )
                .await
            }
            Op::Cancel => {
                env.send(
                    &[client::cancel_job(&requester.pubkey(), &job)],
                    &[&requester],
                )
                .await
            }
            Op::Expire => env.send(&[client::expire_job(&job)], &[]).await,
            Op::Skip => {
                let Some(e) = j.current_epoch() else { continue };
                let r = env.send(&[client::skip_epoch(&job, e)], &[]).await;
                if r.is_ok() {
                    // A skipped epoch's table never pays.
                    pending = None;
                }
                r
            }
            Op::Advance(secs) => {
                env.advance(secs);
                continue;
            }
            Op::Fraud(i) | Op::MinorityFraud(i) => {
                let (Some(e), Some(last)) = (j.current_epoch(), last) else {
                    continue;
                };
                let minority = matches!(op, Op::MinorityFraud(_));
                let mut ws = env.witnesses(&job, e, &refs).await;
                if minority {
                    ws.truncate(s.quorum as usize - 1);
                }
                let Some(payer) = ws.first().copied() else {
                    continue;
                };
                let accused = nodes[i].pubkey();
                env.track(client::fraud_case_address(&job, &accused, e));
                let signers: Vec<&Keypair> = ws.iter().map(|w| find(&nodes, w)).collect();
                let ix = client::report_fraud(&job, e, &accused, &last, &payer, &ws, [9; 32]);
                let r = env.send(&[ix], &signers).await;
                if r.is_ok() {
                    quorum_fraud = Some((i, e));
                }
                r
            }
            Op::CloseMember(i, with_proof) => {
                let (p, proof) = if with_proof {
                    proof_for(&cumulative, &nodes[i].pubkey())
                } else {
                    (0, vec![])
                };
                env.send(
                    &[client::close_member(&nodes[i].pubkey(), &job, p, proof)],
                    &[&nodes[i]],
                )
                .await
            }
            Op::CloseEpoch(e) => {
                let payer = env.ctx.payer.pubkey();
                env.send(&[client::close_epoch(&payer, &job, e)], &[]).await
            }
            Op::Withdraw => {
                env.send(
                    &[client::withdraw(&requester.pubkey(), &job)],
                    &[&requester],
                )
                .await
            }
            Op::CloseJob => {
                let r = env
                    .send(
                        &[client::close_job(&requester.pubkey(), &job)],
                        &[&requester],
                    )
                    .await;
                if r.is_ok() {
                    // The old address can never be a job again.
                    let again = env
                        .create_job(&requester, job_id, s, s.full_budget().unwrap())
                        .await
                        .map(|_| ());
                    assert_err(again, CohortError::JobIdUsed);
                    // Every member of the closed job may close and leave.
                    for n in &nodes {
                        let addr = client::member_address(&job, &n.pubkey());
                        if env.account(&addr).await.is_some() {
                            let ix = client::close_member(&n.pubkey(), &job, 0, vec![]);
                            env.send(&[ix], &[n]).await.unwrap();
                        }
                    }
                    job_id += 1;
                    job = env
                        .create_job(&requester, job_id, s, s.full_budget().unwrap())
                        .await
                        .unwrap();
                    cumulative = nodes.iter().map(|n| (n.pubkey(), 0)).collect();
                    pending = None;
                }
                r
            }
        };
        let _ = res;
        // No stake moves but by a quorum's fraud vote, and then at most the
        // job's minimum, only the accused's, with the evidence recorded.
        let stakes_after = stakes(&mut env, &nodes).await;
        for (i, (b, a)) in stakes_before.iter().zip(&stakes_after).enumerate() {
            if a < b {
                // Only a recorded vote of a quorum of distinct witnesses:
                // a minority, in one transaction or over many, never slashes.
                let Some((who, e)) = quorum_fraud else {
                    panic!("stake of {i} taken by {op:?}");
                };
                assert_eq!(who, i, "stake of {i} taken by a report against {who}");
                let case: FraudCase = env
                    .state(&client::fraud_case_address(&job, &nodes[i].pubkey(), e))
                    .await;
                assert!(case.slashed && case.votes >= s.quorum, "{case:?}");
                assert!(b - a <= s.min_stake);
                let m: Member = env
                    .state(&client::member_address(&job, &nodes[i].pubkey()))
                    .await;
                assert_eq!((m.status, m.evidence), (MemberStatus::Slashed, [9; 32]));
            }
        }
        if let Some(acc) = env.account(&job).await
            && let Ok(j) = Job::decode(&acc.data)
        {
            assert!(j.paid_out <= j.owed, "paid beyond owed");
            assert!(
                j.owed + j.reserve + j.refunded <= j.deposit,
                "owed beyond deposit"
            );
            for (k, p) in &cumulative {
                if let Some(acc) = env.account(&client::member_address(&job, k)).await
                    && let Ok(m) = Member::decode(&acc.data)
                {
                    // Over-attested points (the skewed minority) never finalize alone.
                    let share = j.points_value(*p + 1).unwrap();
                    assert!(
                        m.claimed <= share,
                        "member {k} paid {} > share {share}",
                        m.claimed
                    );
                    // Never more than the chain let it earn.
                    let cap = j
                        .points_value(j.points_cap(m.epochs_present(j.epochs_started)))
                        .unwrap();
                    assert!(
                        m.claimed <= cap,
                        "member {k} paid {} > cap {cap}",
                        m.claimed
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_instruction_sequences_conserve_lamports(ops in prop::collection::vec(op(), 10..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(ops));
    }
}

fn call(
    data: &[u8],
    accounts: &mut [(Pubkey, u64, Vec<u8>, Pubkey, bool)],
) -> Result<(), ProgramError> {
    let infos: Vec<AccountInfo> = accounts
        .iter_mut()
        .map(|(key, lamports, data, owner, signer)| {
            AccountInfo::new(key, *signer, true, lamports, data, owner, false)
        })
        .collect();
    process_instruction(&cohort_program::ID, &infos, data)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random bytes never panic the decoder, and whatever decodes re-encodes to the same bytes.
    #[test]
    fn malformed_instruction_data_is_an_error_never_a_panic(data in prop::collection::vec(any::<u8>(), 0..400)) {
        match CohortInstruction::unpack(&data) {
            Ok(ix) => prop_assert_eq!(ix.pack(), data),
            Err(_) => {
                let r = call(&data, &mut []);
                prop_assert_eq!(r, Err(CohortError::InvalidInstruction.into()));
            }
        }
    }

    /// Valid tags with random accounts (random owners, random data) fail cleanly.
    #[test]
    fn random_accounts_are_an_error_never_a_panic(
        tag in 0u8..17,
        tail in prop::collection::vec(any::<u8>(), 0..300),
        account_data in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..700), 0..9),
        owned in prop::collection::vec(any::<bool>(), 9),
    ) {
        let mut data = vec![tag];
        data.extend_from_slice(&tail);
        let mut accounts: Vec<_> = account_data
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let owner = if owned[i] { cohort_program::ID } else { Pubkey::new_unique() };
                (Pubkey::new_unique(), 1_000_000u64, d, owner, true)
            })
            .collect();
        // Random accounts are never a valid set: always an error.
        prop_assert!(call(&data, &mut accounts).is_err());
    }
}

#[tokio::test]
async fn malformed_instruction_in_a_real_transaction_is_invalid_instruction() {
    let mut env = Env::new().await;
    for data in [
        vec![],
        vec![255],
        vec![0, 1, 2],
        CohortInstruction::StartEpoch.pack().repeat(2),
    ] {
        let ix = solana_sdk::instruction::Instruction {
            program_id: cohort_program::ID,
            accounts: vec![],
            data,
        };
        assert_err(env.send(&[ix], &[]).await, CohortError::InvalidInstruction);
    }
}
