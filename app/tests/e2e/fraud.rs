//! Proof of contribution end to end: `cohort localnet`, three honest
//! `cohort node`s and one that cheats. It has the cores to itself
//! ([`cores_alone`]): the audits need steps where most members' payloads
//! arrive in time.

use crate::common::*;
use std::time::{Duration, Instant};

/// A cheating node joins a job with three honest ones: first a free-rider
/// (sends garbage, computes nothing), whose witnesses' audits fail it; then,
/// in a fresh job, a lying leader (a forged entry, a second signed manifest
/// for the same attempt, a bogus state hash), whom each witness accuses on
/// the proof it holds. Each witness votes `report_fraud` on chain, and a
/// quorum of votes slashes the cheat: its stake is burned, it stops, and
/// the honest nodes finish and are paid. One after the other: two jobs at
/// once would crowd the two cores. (The sign-flipper is convicted over the
/// network by `engine/tests/p2p.rs` and in the arena.)
#[test]
fn cheats_are_audited_or_caught_leading_reported_on_chain_and_slashed() {
    let _cores = cores_alone();
    for mode in ["free-rider", "lying-leader"] {
        cheat_run(mode);
    }
}

fn cheat_run(mode: &str) {
    let h = home(&format!("fraud-{mode}"));
    let (mut chain, url) = localnet(&h);
    ok(&cohort(&h, &["airdrop", "2", "--url", &url]));
    let created = ok(&cohort(
        &h,
        &[
            "job",
            "create",
            "--url",
            &url,
            "--epochs",
            "2",
            "--steps-per-epoch",
            "8",
            "--min-nodes",
            "4",
            "--max-nodes",
            "4",
            "--id",
            "1",
        ],
    ));
    let job = created.split_whitespace().nth(1).unwrap().to_string();
    let base = p2p_base().to_string();
    let honest: Vec<Proc> = (0..3)
        .map(|i| spawn_node(&h, i, &url, &job, &base))
        .collect();
    for n in &honest {
        n.wait_for("joined job", Duration::from_secs(120));
    }
    // Joins last, so it holds the last slot; the job starts with it. Once
    // it is slashed the others go on with three (a running job needs only
    // a quorum of members to start its next epoch).
    let cheat = Proc::spawn(
        &h.join("cheat"),
        &[
            "node",
            "--url",
            &url,
            "--job",
            &job,
            "--p2p-port",
            &base,
            "--airdrop",
            "1",
            "--adversary",
            mode,
        ],
    );
    let t = Instant::now();
    while !cheat
        .log()
        .iter()
        .any(|l| l.contains("this node was slashed"))
    {
        let logs: Vec<Vec<String>> = honest.iter().chain([&cheat]).map(Proc::log).collect();
        assert!(t.elapsed() < Duration::from_secs(240), "{logs:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let slashed = cheat.wait_for("this node was slashed", Duration::ZERO);
    assert!(slashed.contains(&job), "{slashed}");
    let mut cheat = cheat;
    assert!(!cheat.child.wait().unwrap().success());
    // Each witness whose audit failed votes on chain by itself; the vote
    // that completes the quorum slashes (a later one finds it slashed).
    // The voter says so once its transaction is confirmed, which can be
    // after the cheat has seen its slash on chain (seen: the test read the
    // logs in between), so wait for the line.
    let t = Instant::now();
    let (slashing, logs) = loop {
        let logs: Vec<String> = honest.iter().flat_map(|n| n.log()).collect();
        let slashing = logs
            .iter()
            .filter(|l| l.contains("reported member 3 on chain") && l.contains("slashed"))
            .count();
        if slashing >= 1 || t.elapsed() > Duration::from_secs(60) {
            break (slashing, logs);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(slashing >= 1, "{mode}: no vote slashed member 3: {logs:#?}");
    assert!(
        !logs.iter().any(|l| l.contains("could not report")),
        "{mode}: {logs:#?}"
    );
    let t = Instant::now();
    while !honest
        .iter()
        .all(|n| n.log().iter().any(|l| l.contains("done:")))
    {
        let logs: Vec<Vec<String>> = honest.iter().map(Proc::log).collect();
        assert!(t.elapsed() < Duration::from_secs(300), "{logs:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let done: Vec<String> = honest
        .iter()
        .map(|n| n.wait_for("done:", Duration::ZERO))
        .collect();
    for mut n in honest {
        let st = n.child.wait().unwrap();
        assert!(st.success(), "{:?}", n.log());
    }
    let (_, claimed) = same_models_all_paid(&done);
    let status = ok(&cohort(&h, &["job", "status", &job, "--url", &url]));
    assert!(field(&status, "state").contains("Completed"), "{status}");
    // The cheat's 0.01 SOL stake was taken and burned.
    assert!(
        field(&status, "slashed").contains("10000000 lamports"),
        "{status}"
    );
    let (owed, paid, _) = spend(&status);
    assert_eq!(paid, claimed, "{status}");
    assert!(paid <= owed, "{status}");
    let _ = chain.child.kill();
}
