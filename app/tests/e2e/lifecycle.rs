//! The whole system as separate processes: `cohort localnet`, three
//! `cohort node`s training over libp2p on 127.0.0.1, and a requester using
//! `cohort job`. Also the requester's bad inputs, each a one-line error.

use crate::common::*;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn three_nodes_train_attest_and_get_paid_through_an_rpc_outage() {
    let _cores = cores_shared();
    let h = home("e2e");
    let (mut chain, url) = localnet(&h);
    let job = post_job(&h, &url, "12", "4");
    let base = p2p_base().to_string();
    let nodes: Vec<Proc> = (0..3)
        .map(|i| spawn_node(&h, i, &url, &job, &base))
        .collect();
    // Mid-epoch, the RPC server goes away for a while, then comes back.
    nodes[0].wait_for("epoch 0 step", Duration::from_secs(180));
    let pid = chain.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-USR1", &pid])
            .status()
            .unwrap()
            .success()
    );
    chain.wait_for("RPC server stopped", Duration::from_secs(10));
    // Stay down until a node's chain call has failed and is being retried
    // (it needs the chain once its epoch ends), then come back.
    let t = Instant::now();
    while !nodes
        .iter()
        .any(|n| n.log().iter().any(|l| l.contains("retrying")))
    {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no node noticed the outage"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        Command::new("kill")
            .args(["-USR2", &pid])
            .status()
            .unwrap()
            .success()
    );
    chain.wait_for("RPC server back", Duration::from_secs(10));

    let mut done = Vec::new();
    for n in &nodes {
        done.push(n.wait_for("done:", Duration::from_secs(300)));
    }
    for mut n in nodes {
        let st = n.child.wait().unwrap();
        assert!(st.success(), "{:?}", n.log());
    }
    // Every node trained both epochs, holds the same model after each, and
    // was paid for its contributions.
    let (models, claimed) = same_models_all_paid(&done);
    assert_eq!(models.split(',').count(), 2, "{done:?}");
    for d in &done {
        assert!(d.contains("trained 2 epochs"), "{d}");
    }
    let status = ok(&cohort(&h, &["job", "status", &job, "--url", &url]));
    assert!(field(&status, "state").contains("Completed"), "{status}");
    assert!(field(&status, "epochs").contains("2 attested"), "{status}");
    // Refund correct to the lamport: deposit = owed + refunded, and the
    // chain paid exactly what the nodes say they received (nothing twice).
    // Each claim rounds its own share down, so when a node missed a step
    // (a late payload under load) up to a lamport per node stays behind
    // until the requester closes the job.
    let deposit: u64 = field(&status, "deposit")
        .split('(')
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let (owed, paid, refunded) = spend(&status);
    assert_eq!(paid, claimed, "{status}");
    assert!(paid <= owed && owed - paid < 3, "{status}");
    assert_eq!(deposit, owed + refunded, "{status}");
    // Three of four slots filled for two epochs at 0.001 SOL: at least the
    // empty slot's budget comes back, plus any step nobody was credited for.
    assert!(refunded >= 2 * 1_000_000, "{status}");
    let _ = chain.child.kill();
}

#[test]
fn bad_requests_are_one_line_errors_and_leave_nothing_on_chain() {
    let _cores = cores_shared();
    let h = home("bad");
    let (_chain, url) = localnet(&h);
    // Unfunded wallet: refused before signing.
    fails(
        &cohort(&h, &["job", "create", "--url", &url]),
        "insufficient funds",
    );
    ok(&cohort(&h, &["airdrop", "1", "--url", &url]));
    fails(
        &cohort(
            &h,
            &[
                "job",
                "create",
                "--url",
                &url,
                "--min-nodes",
                "5",
                "--max-nodes",
                "3",
            ],
        ),
        "min-nodes (5) must not exceed max-nodes (3)",
    );
    fails(
        &cohort(&h, &["job", "create", "--url", &url, "--price", "1000"]),
        "insufficient funds",
    );
    fails(
        &cohort(
            &h,
            &[
                "job",
                "create",
                "--url",
                &url,
                "--program-id",
                "11111111111111111111111111111111",
            ],
        ),
        "wrong program id",
    );
    fails(
        &cohort(&h, &["job", "create", "--url", "http://127.0.0.1:9"]),
        "cannot reach the chain",
    );
    fails(
        &cohort(&h, &["job", "status", "nonsense", "--url", &url]),
        "not a job address",
    );
    let spec = h.join("spec.toml");
    std::fs::write(&spec, "epochs = 0\n").unwrap();
    fails(
        &cohort(
            &h,
            &[
                "job",
                "create",
                "--url",
                &url,
                "--spec",
                spec.to_str().unwrap(),
            ],
        ),
        "epochs must be at least 1",
    );
    let listed = ok(&cohort(&h, &["job", "list", "--url", &url]));
    assert!(listed.contains("no jobs"), "{listed}");
}

#[test]
fn a_node_killed_mid_epoch_restarts_catches_up_and_is_paid_in_full() {
    let _cores = cores_shared();
    let h = home("restart");
    let (_chain, url) = localnet(&h);
    let job = post_job(&h, &url, "60", "3");
    let base = p2p_base().to_string();
    let spawn = |i: usize| spawn_node(&h, i, &url, &job, &base);
    let n0 = spawn(0);
    let n1 = spawn(1);
    let mut n2 = spawn(2);
    n2.wait_for("epoch 0 step 15/60", Duration::from_secs(180));
    n2.child.kill().unwrap(); // SIGKILL, mid-epoch
    n2.child.wait().unwrap();
    let n2b = spawn(2);
    let mut done = Vec::new();
    for n in [&n0, &n1, &n2b] {
        done.push(n.wait_for("done:", Duration::from_secs(300)));
    }
    // However long it was away, its points table matched the attested one
    // (the credits of steps it missed come with the state it downloads),
    // so its claim went through with everyone else's.
    let (_, claimed) = same_models_all_paid(&done);
    let status = ok(&cohort(&h, &["job", "status", &job, "--url", &url]));
    assert!(field(&status, "state").contains("Completed"), "{status}");
    let (owed, paid, _) = spend(&status);
    // Everything owed was claimed: no node's claim was refused. Each claim
    // rounds its own share down, so up to a lamport per node stays behind
    // when a node missed steps.
    assert!(paid <= owed && owed - paid < 3, "{status}");
    assert_eq!(paid, claimed, "{status}");
}
