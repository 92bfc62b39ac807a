//! The whole job lifecycle inside a real bank, with lamport conservation
//! asserted after every transaction (see `common::Env::send`).

mod common;

use cohort_program::client;
use cohort_program::error::CohortError;
use cohort_program::state::*;
use common::*;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signer};

#[tokio::test]
async fn full_lifecycle_pays_members_refunds_requester_and_closes_everything() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let nodes: Vec<Keypair> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(env.user(SOL).await);
        }
        v
    };
    for n in &nodes {
        env.register(n, PRICE / 2, 5_000, STAKE).await.unwrap();
        let node: Node = env.state(&client::node_address(&n.pubkey())).await;
        assert_eq!(node.stake, STAKE);
        assert_eq!(node.benchmark.device_name(), "test-gpu");
    }

    let s = spec();
    let deposit = s.full_budget().unwrap();
    let requester_before = env.balance(&requester.pubkey()).await;
    let job = env.create_job(&requester, 1, s, deposit).await.unwrap();
    let j: Job = env.state(&job).await;
    assert_eq!(j.state, JobState::Open);
    assert_eq!(j.deposit, deposit);
    let job_rent = env.rent.minimum_balance(Job::LEN);
    assert_eq!(env.balance(&job).await, job_rent + deposit);

    // Too few members: the epoch cannot start.
    env.join(&nodes[0], &job).await.unwrap();
    assert_err(
        env.start_epoch(&job).await.map(|_| ()),
        CohortError::NotEnoughMembers,
    );
    // Join until full; the fifth is refused.
    for n in &nodes[1..4] {
        env.join(n, &job).await.unwrap();
    }
    assert_err(env.join(&nodes[4], &job).await, CohortError::JobFull);
    let members: Vec<&Keypair> = nodes[..4].iter().collect();

    // Member i contributes to (10 - i) of the 10 steps of each epoch.
    let mut cumulative: Vec<(Pubkey, u64)> = members.iter().map(|m| (m.pubkey(), 0)).collect();
    let mut claimed = [0u64; 4];
    for epoch in 0..3u32 {
        let e = env.start_epoch(&job).await.unwrap();
        assert_eq!(e, epoch);
        assert_err(
            env.start_epoch(&job).await.map(|_| ()),
            CohortError::EpochNotFinalized,
        );
        for (i, c) in cumulative.iter_mut().enumerate() {
            c.1 += 10 - i as u64;
        }
        let t = tree(&cumulative);
        let witnesses = env.witnesses(&job, epoch, &members).await;
        assert_eq!(witnesses.len(), 3);
        for (v, w) in witnesses.iter().take(2).enumerate() {
            let kp = find(&nodes, w);
            let ix = client::attest_epoch(w, &job, epoch, [epoch as u8; 32], t.root(), t.total());
            env.send(&[ix], &[kp]).await.unwrap();
            let ep: Epoch = env.state(&client::epoch_address(&job, epoch)).await;
            assert_eq!(
                ep.finalized,
                v == 1,
                "quorum of 2 finalizes on the second vote"
            );
        }
        // The third witness is too late: the epoch is already final.
        let late = find(&nodes, &witnesses[2]);
        let ix = client::attest_epoch(
            &late.pubkey(),
            &job,
            epoch,
            [epoch as u8; 32],
            t.root(),
            t.total(),
        );
        assert_err(env.send(&[ix], &[late]).await, CohortError::EpochFinalized);

        let j: Job = env.state(&job).await;
        assert_eq!(j.epochs_finalized, epoch + 1);
        assert_eq!(j.total_points, t.total());
        // Members claim what the latest root says, pro rata.
        for (i, m) in members.iter().enumerate() {
            let (points, proof) = proof_for(&cumulative, &m.pubkey());
            let before = env.balance(&m.pubkey()).await;
            env.send(&[client::claim(&m.pubkey(), &job, points, proof)], &[m])
                .await
                .unwrap();
            let expected = points * PRICE / 10 - claimed[i];
            assert_eq!(env.balance(&m.pubkey()).await, before + expected);
            claimed[i] += expected;
        }
    }

    let j: Job = env.state(&job).await;
    assert_eq!(j.state, JobState::Completed);
    let owed: u64 = cumulative.iter().map(|(_, p)| p * PRICE / 10).sum();
    assert_eq!(j.owed, owed);
    assert_eq!(j.paid_out, owed);
    // Finalizing paid the requester nothing; it pulls the refund itself.
    assert_eq!(j.refunded, 0);
    env.send(
        &[client::withdraw(&requester.pubkey(), &job)],
        &[&requester],
    )
    .await
    .unwrap();
    let j: Job = env.state(&job).await;
    // (10+9+8+7) of 40 node-steps per epoch were done: the rest comes back.
    assert_eq!(j.refunded, deposit - owed);
    assert_eq!(env.balance(&job).await, job_rent);
    assert_err(
        env.send(
            &[client::withdraw(&requester.pubkey(), &job)],
            &[&requester],
        )
        .await,
        CohortError::NothingToWithdraw,
    );

    // Tear down: members (inside the claim window, with their proofs),
    // epochs, job, then nodes after their cooldown.
    for m in &members {
        let (points, proof) = proof_for(&cumulative, &m.pubkey());
        env.send(
            &[client::close_member(&m.pubkey(), &job, points, proof)],
            &[m],
        )
        .await
        .unwrap();
        assert!(
            env.account(&client::member_address(&job, &m.pubkey()))
                .await
                .is_none()
        );
    }
    let payer = env.ctx.payer.pubkey();
    // Epoch 0 is two epochs old; 1 and 2 may still be reported until the
    // claim window ends.
    env.send(&[client::close_epoch(&payer, &job, 0)], &[])
        .await
        .unwrap();
    assert_err(
        env.send(&[client::close_epoch(&payer, &job, 2)], &[]).await,
        CohortError::EpochReportable,
    );
    env.advance(CLAIM_WINDOW_SECS);
    for e in 1..3 {
        env.send(&[client::close_epoch(&payer, &job, e)], &[])
            .await
            .unwrap();
    }
    env.send(
        &[client::close_job(&requester.pubkey(), &job)],
        &[&requester],
    )
    .await
    .unwrap();
    assert!(env.account(&job).await.is_none());
    let requester_after = env.balance(&requester.pubkey()).await;
    let counter_rent = env.rent.minimum_balance(Requester::LEN);
    assert_eq!(
        requester_after,
        requester_before - owed - counter_rent,
        "requester pays exactly what members earned (and its id counter's rent)"
    );

    for n in &nodes {
        env.send(&[client::deregister_node(&n.pubkey())], &[n])
            .await
            .unwrap();
    }
    assert_err(
        env.send(&[client::close_node(&nodes[0].pubkey())], &[&nodes[0]])
            .await,
        CohortError::CooldownActive,
    );
    env.advance(NODE_COOLDOWN_SECS);
    for n in &nodes {
        let before = env.balance(&n.pubkey()).await;
        let node_balance = env.balance(&client::node_address(&n.pubkey())).await;
        env.send(&[client::close_node(&n.pubkey())], &[n])
            .await
            .unwrap();
        assert_eq!(
            env.balance(&n.pubkey()).await,
            before + node_balance,
            "stake and rent back"
        );
        assert!(
            env.account(&client::node_address(&n.pubkey()))
                .await
                .is_none()
        );
    }
}

#[tokio::test]
async fn leave_swaps_the_last_member_into_the_gap_and_rejoin_works() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let nodes = env.nodes(4).await;
    let s = spec();
    let job = env
        .create_job(&requester, 7, s, s.full_budget().unwrap())
        .await
        .unwrap();
    for n in &nodes {
        env.join(n, &job).await.unwrap();
    }
    // Member 1 leaves; the last member (index 3) takes index 1.
    let ix = client::leave_job(&nodes[1].pubkey(), &job, &nodes[3].pubkey());
    env.send(&[ix], &[&nodes[1]]).await.unwrap();
    let moved: Member = env
        .state(&client::member_address(&job, &nodes[3].pubkey()))
        .await;
    assert_eq!(moved.index, 1);
    let left: Member = env
        .state(&client::member_address(&job, &nodes[1].pubkey()))
        .await;
    assert_eq!(left.status, MemberStatus::Left);
    let j: Job = env.state(&job).await;
    assert_eq!(j.member_count, 3);
    let node: Node = env.state(&client::node_address(&nodes[1].pubkey())).await;
    assert_eq!(node.active_job, Pubkey::default());
    // Rejoining takes the next free index.
    env.join(&nodes[1], &job).await.unwrap();
    let back: Member = env
        .state(&client::member_address(&job, &nodes[1].pubkey()))
        .await;
    assert_eq!((back.index, back.status), (3, MemberStatus::Active));
}

#[tokio::test]
async fn cancel_while_open_refunds_the_whole_deposit() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let s = spec();
    let deposit = s.full_budget().unwrap();
    let before = env.balance(&requester.pubkey()).await;
    let job = env.create_job(&requester, 3, s, deposit).await.unwrap();
    env.send(
        &[client::cancel_job(&requester.pubkey(), &job)],
        &[&requester],
    )
    .await
    .unwrap();
    env.send(
        &[client::withdraw(&requester.pubkey(), &job)],
        &[&requester],
    )
    .await
    .unwrap();
    let j: Job = env.state(&job).await;
    assert_eq!((j.state, j.refunded), (JobState::Cancelled, deposit));
    env.send(
        &[client::close_job(&requester.pubkey(), &job)],
        &[&requester],
    )
    .await
    .unwrap();
    assert_eq!(
        env.balance(&requester.pubkey()).await,
        before - env.rent.minimum_balance(Requester::LEN)
    );
}

#[tokio::test]
async fn an_epoch_that_misses_its_deadline_is_skipped_without_paying_it() {
    let mut env = Env::new().await;
    let requester = env.user(10 * SOL).await;
    let nodes = env.nodes(3).await;
    let s = spec();
    let deposit = s.full_budget().unwrap();
    let job = env.create_job(&requester, 4, s, deposit).await.unwrap();
    for n in &nodes {
        env.join(n, &job).await.unwrap();
    }
    env.start_epoch(&job).await.unwrap();
    let skip = client::skip_epoch(&job, 0);
    assert_err(
        env.send(std::slice::from_ref(&skip), &[]).await,
        CohortError::DeadlineNotReached,
    );
    env.advance(s.max_epoch_secs as i64 + 1);
    // Witnesses are too late now.
    let members: Vec<&Keypair> = nodes.iter().collect();
    let w = env.witnesses(&job, 0, &members).await[0];
    let ix = client::attest_epoch(&w, &job, 0, [1; 32], [2; 32], 3);
    assert_err(
        env.send(&[ix], &[find(&nodes, &w)]).await,
        CohortError::DeadlinePassed,
    );
    env.send(&[skip], &[]).await.unwrap();
    let j: Job = env.state(&job).await;
    assert_eq!(
        (j.state, j.owed, j.reserve, j.epochs_skipped),
        (JobState::Running, 0, 0, 1)
    );
    // Nobody starts the next epoch in time: then the job expires.
    let expire = client::expire_job(&job);
    assert_err(
        env.send(std::slice::from_ref(&expire), &[]).await,
        CohortError::DeadlineNotReached,
    );
    env.advance(s.max_epoch_secs as i64 + 1);
    env.send(&[expire], &[]).await.unwrap();
    env.send(
        &[client::withdraw(&requester.pubkey(), &job)],
        &[&requester],
    )
    .await
    .unwrap();
    let j: Job = env.state(&job).await;
    assert_eq!(
        (j.state, j.owed, j.refunded, j.reserve),
        (JobState::Expired, 0, deposit, 0)
    );
}
