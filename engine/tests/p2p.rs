//! Separate OS processes training one job over libp2p on 127.0.0.1 (and,
//! where permitted, across network namespaces): identical model hashes after
//! every step, churn, late joiners, and hostile input.

use cohort_engine::backend;
use cohort_engine::net::msg::{self, Body, Drop, Heartbeat};
use cohort_engine::net::peer::{local_job, local_member};
use cohort_engine::net::shaper::Link;
use cohort_engine::net::step::{StepMachine, Timing};
use cohort_engine::net::swarm;
use cohort_engine::runner::epoch_seed;
use libp2p::futures::StreamExt;
use libp2p::gossipsub;
use libp2p::swarm::SwarmEvent;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// These tests each run several training processes: one at a time, or two
/// cores would make every timeout fire.
static SERIAL: Mutex<()> = Mutex::new(());

const PEER: &str = env!("CARGO_BIN_EXE_cohort-peer");

fn free_port() -> u16 {
    cohort_engine::net::ports::free_base(1).expect("a free loopback port")
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[start..];
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let end = rest.find(['"', ',', '}']).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The members an `applied` line lists.
fn listed(line: &str) -> Vec<u32> {
    let list = line.split("\"contributors\":[").nth(1).unwrap();
    list[..list.find(']').unwrap()]
        .split(',')
        .filter(|m| !m.trim().is_empty())
        .map(|m| m.trim().parse().unwrap())
        .collect()
}

/// A peer process and everything it printed.
struct Peer {
    child: Child,
    /// Each line with when the test read it.
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Peer {
    fn spawn(cmd: &mut Command) -> Peer {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cohort-peer");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock().unwrap().push((Instant::now(), line));
            }
        });
        Peer { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.1.clone())
            .collect()
    }

    /// When the first line containing `what` arrived.
    fn first(&self, what: &str) -> Option<Instant> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|(_, l)| l.contains(what))
            .map(|(at, _)| *at)
    }

    /// When each step's `applied` line arrived.
    fn applied_at(&self) -> Vec<(u32, Instant)> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, l)| l.contains(r#""event":"applied""#))
            .map(|(at, l)| (field(l, "step").unwrap().parse().unwrap(), *at))
            .collect()
    }

    /// step → model hash, from `applied` lines.
    fn hashes(&self) -> BTreeMap<u32, String> {
        self.lines()
            .iter()
            .filter(|l| l.contains(r#""event":"applied""#))
            .map(|l| {
                (
                    field(l, "step").unwrap().parse().unwrap(),
                    field(l, "hash").unwrap().to_string(),
                )
            })
            .collect()
    }

    /// step → the members its manifest listed, from `applied` lines (the
    /// last one of a step wins, as after a rewind).
    fn contributors(&self) -> BTreeMap<u32, Vec<u32>> {
        self.lines()
            .iter()
            .filter(|l| l.contains(r#""event":"applied""#))
            .map(|l| (field(l, "step").unwrap().parse().unwrap(), listed(l)))
            .collect()
    }

    fn applied(&self) -> Option<u32> {
        self.hashes().keys().next_back().copied()
    }

    fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&Peer) -> bool) {
        let t0 = Instant::now();
        while !pred(self) {
            assert!(
                t0.elapsed() < timeout,
                "timed out waiting for {what}; output so far:\n{}",
                self.lines().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn finish(&mut self, timeout: Duration) -> String {
        self.wait_for("exit", timeout, |p| {
            p.lines().iter().any(|l| l.contains(r#""event":"done""#))
        });
        let status = self.child.wait().unwrap();
        assert!(status.success(), "peer exited with {status}");
        self.lines()
            .into_iter()
            .find(|l| l.contains(r#""event":"done""#))
            .unwrap()
    }
}

impl std::ops::Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn addr(port: u16, i: usize) -> String {
    let peer = swarm::peer_id(&local_member(i).1).unwrap();
    format!("/ip4/127.0.0.1/tcp/{port}/p2p/{peer}")
}

fn peer_cmd(job: &str, i: usize, n: usize, steps: u32, ports: &[u16]) -> Command {
    let mut c = Command::new(PEER);
    c.env("RAYON_NUM_THREADS", "1").args([
        "--job",
        job,
        "--index",
        &i.to_string(),
        "--members",
        &n.to_string(),
        "--steps",
        &steps.to_string(),
        "--listen",
        &format!("/ip4/127.0.0.1/tcp/{}", ports[i]),
        "--collect-ms",
        "1500",
        "--fallback-ms",
        "1000",
        "--batch",
        "4",
    ]);
    for (j, p) in ports.iter().enumerate() {
        if j != i {
            c.args(["--peer", &addr(*p, j)]);
        }
    }
    c
}

/// Every step that two peers both applied has the same hash.
fn assert_agree(peers: &[&Peer]) -> usize {
    let maps: Vec<_> = peers.iter().map(|p| p.hashes()).collect();
    let mut compared = 0;
    for (i, a) in maps.iter().enumerate() {
        for (j, b) in maps.iter().enumerate().skip(i + 1) {
            for (step, h) in a {
                if let Some(h2) = b.get(step) {
                    if h != h2 {
                        // What each did around the fork: its manifests'
                        // contributors, rewinds and syncs.
                        for (k, p) in [(i, peers[i]), (j, peers[j])] {
                            let notes: Vec<String> = p
                                .lines()
                                .into_iter()
                                .filter(|l| !l.contains(r#""event":"omitted""#))
                                .filter(|l| {
                                    field(l, "step")
                                        .and_then(|s| s.parse::<u32>().ok())
                                        .is_none_or(|s| s + 2 >= *step && s <= step + 2)
                                })
                                .collect();
                            eprintln!("peer {k} around step {step}: {notes:#?}");
                        }
                        panic!("peers {i} and {j}: hashes differ at step {step}: {h} {h2}");
                    }
                    compared += 1;
                }
            }
        }
    }
    compared
}

#[test]
fn processes_train_one_model_through_a_kill_a_restart_and_a_late_joiner() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("cohort-p2p-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (n, steps) = (4, 40);
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let ckpt = |i: usize| dir.join(format!("member-{i}.ckpt"));
    let start = |i: usize, extra: &[&str]| {
        let mut c = peer_cmd("churn", i, n, steps, &ports);
        // States and momenta kept on disk however small: the path a large
        // model takes.
        c.args([
            "--checkpoint",
            ckpt(i).to_str().unwrap(),
            "--min-peers",
            "2",
            "--spill-above",
            "0",
        ]);
        c.args(extra);
        Peer::spawn(&mut c)
    };
    // Members 0-2 start together; member 3 is late.
    let p0 = start(0, &[]);
    let p1 = start(1, &[]);
    let mut p2 = start(2, &[]);
    let long = Duration::from_secs(120);
    p2.wait_for("member 2 at step 5", long, |p| p.applied() >= Some(5));
    p2.child.kill().unwrap(); // SIGKILL
    p2.child.wait().unwrap();
    let killed_at = p2.applied().unwrap();
    // The others go on without it.
    p0.wait_for("progress after the kill", long, |p| {
        p.applied() >= Some(killed_at + 6)
    });
    let dropped_by = p0
        .lines()
        .iter()
        .filter(|l| l.contains(r#""event":"applied""#))
        .filter(|l| field(l, "step").unwrap().parse::<u32>().unwrap() > killed_at + 2)
        .all(|l| !l.contains("contributors\":[0, 1, 2") && !l.contains(", 2]"));
    assert!(dropped_by, "member 2 still listed after it died");
    // Restarted, it resumes from its checkpoint, rejoins, and learns who
    // contributed to the steps it missed.
    let p2b = start(2, &[]);
    p2b.wait_for("member 2 to resync", long, |p| {
        p.lines()
            .iter()
            .any(|l| l.contains(r#""event":"synced""#) && l.contains(r#""resumed":true"#))
    });
    // A late joiner downloads the state and contributes from the next step.
    let p3 = start(3, &["--join"]);
    p3.wait_for("member 3 to sync", long, |p| {
        p.lines().iter().any(|l| l.contains(r#""event":"synced""#))
    });
    let mut peers = [p0, p1, p2b, p3];
    let mut done = Vec::new();
    for p in peers.iter_mut() {
        done.push(p.finish(long));
    }
    let finals: Vec<&str> = done.iter().map(|d| field(d, "hash").unwrap()).collect();
    if !finals.iter().all(|h| *h == finals[0]) {
        let h0 = peers[0].hashes();
        for (i, p) in peers.iter().enumerate() {
            let first = p.hashes().into_iter().find(|(s, h)| h0.get(s) != Some(h));
            let notes: Vec<String> = p
                .lines()
                .into_iter()
                .filter(|l| !l.contains(r#""event":"applied""#))
                .collect();
            eprintln!("member {i}: first differing step {first:?}; {notes:?}");
            let _ = std::fs::write(dir.join(format!("member-{i}.out")), p.lines().join("\n"));
        }
        panic!(
            "final hashes differ: {finals:?}; every line in {}",
            dir.display()
        );
    }
    assert!(
        done.iter()
            .all(|d| field(d, "applied") == Some(&steps.to_string()))
    );
    // Rewinds are legitimate (a late leader's manifest beat a fall-back's)
    // but worth seeing when they happen.
    let rewinds: Vec<&str> = done.iter().map(|d| field(d, "rewinds").unwrap()).collect();
    eprintln!("rewinds per member: {rewinds:?}");
    let compared = assert_agree(&peers.iter().collect::<Vec<_>>());
    assert!(compared > 60, "only {compared} step hashes compared");
    // Both the restarted member and the joiner contributed again.
    assert!(
        peers[0].lines().iter().any(|l| l.contains("[0, 1, 2, 3]")),
        "no step applied contributions from all four members"
    );
    assert!(done.iter().all(|d| d.contains(r#""bad_signature":0"#)));
    // Churn is no reason for an honest node to conclude it diverged.
    for (i, p) in [&p2].into_iter().chain(&peers).enumerate() {
        let diverged: Vec<String> = p
            .lines()
            .into_iter()
            .filter(|l| l.contains(r#""event":"diverged""#))
            .collect();
        assert!(diverged.is_empty(), "life {i} diverged: {diverged:?}");
    }
    // Every process ends with member 0's credits, and (unless member 0
    // rewound past its kept states, keeping lines of a history it left)
    // they are what member 0's applied steps add up to: the restarted
    // member took the credits of the steps it missed from the state it
    // downloaded (its `synced` line), not from a list of its own.
    let credits = |line: &str| -> Vec<u32> {
        let list = line.split("\"credits\":[").nth(1).unwrap();
        list[..list.find(']').unwrap()]
            .split(',')
            .map(|m| m.trim().parse().unwrap())
            .collect()
    };
    let last_applied = |p: &Peer| -> String {
        p.lines()
            .into_iter()
            .rfind(|l| l.contains(r#""event":"applied""#))
            .unwrap()
    };
    let truth = credits(&last_applied(&peers[0]));
    for (i, p) in peers.iter().enumerate() {
        assert_eq!(credits(&last_applied(p)), truth, "member {i}'s credits");
    }
    if !peers[0]
        .lines()
        .iter()
        .any(|l| l.contains(r#""event":"rewound""#))
    {
        let mut sum = vec![0u32; 4];
        for m in peers[0].contributors().values().flatten() {
            sum[*m as usize] += 1;
        }
        assert_eq!(truth, sum, "member 0's credits against its applied steps");
    }
    let resynced = peers[2]
        .lines()
        .into_iter()
        .find(|l| l.contains(r#""event":"synced""#))
        .unwrap();
    assert!(
        credits(&resynced)[2] > 0,
        "the restarted member's state credits its first life: {resynced}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Proof of contribution over the network, once per attack (a free-rider,
/// a copycat, a stale member, a sign-flipper) with one of four processes
/// attacking: every node screens its payloads out of the vote, the
/// witnesses fetch its momentum and recompute, a quorum of accusations
/// slashes it, and from then on no manifest lists it. The forger flips
/// signs and reveals momenta forged to make that recompute exactly: only
/// the momentum chain check fails it. The silent revealer flips signs and
/// never answers a request for its momentum: after the witnesses' patience
/// that is withholding, since it is still heard, and fails the audit even
/// of a payload the screen could not judge (on CI it was listed only in
/// steps of one or two payloads, and went free). Over the network the copycat
/// can copy only the previous step's payloads. In the sign-flip run every
/// contribution is audited, and two honest members run other thread
/// counts (or backends): none of their audits fails. (Five processes
/// overload two cores.)
#[test]
fn attackers_are_convicted_and_dropped_while_honest_members_on_other_thread_counts_pass_every_audit()
 {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for mode in [
        "free-rider",
        "copycat",
        "stale",
        "sign-flip",
        "forged-momentum",
        "silent-reveal",
    ] {
        let t = Instant::now();
        audited_run(mode);
        eprintln!("{mode}: {:.0?}", t.elapsed());
    }
}

/// One attacker among three honest members. In the sign-flip run every
/// contribution is audited, chain included, and the honest members differ
/// in thread count (and backend, where a GPU adapter exists): honest work
/// computed on other hardware must pass every audit.
fn audited_run(mode: &str) {
    let (n, steps, attacker) = (4, 16, 3);
    let mixed = mode == "sign-flip";
    // A hardware adapter only: a software rasterizer is the CPU again,
    // far slower (with Mesa's Vulkan drivers installed, the member on it
    // fell so far behind that its chain was never checked).
    let wgpu = mixed && backend::hardware_wgpu().is_some();
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let mut peers: Vec<Peer> = (0..n)
        .map(|i| {
            let mut c = peer_cmd(&format!("audited-{mode}"), i, n, steps, &ports);
            c.args(["--witnesses", "0,1,2,3", "--quorum", "2"]);
            if i == attacker {
                c.args(["--adversary", mode]);
            }
            if mode == "forged-momentum" {
                // Only a chain check convicts a forged momentum, and it
                // follows a member from one listed step to the next. On a
                // loaded machine the 1.5 s window listed the lagging
                // attacker only on steps it led itself, never two in a row
                // (an open limit, docs/robustness.md): a longer window lists
                // every member, so the chain is there to follow.
                c.args(["--collect-ms", "4000"]);
            }
            if mixed {
                c.args(["--audit-rate", "1", "--chain-rate", "1"]);
                match i {
                    1 => {
                        c.env("RAYON_NUM_THREADS", "2");
                    }
                    2 if wgpu => {
                        c.args(["--backend", "wgpu"]);
                    }
                    2 => {
                        c.env("RAYON_NUM_THREADS", "2");
                    }
                    _ => {}
                }
            }
            Peer::spawn(&mut c)
        })
        .collect();
    let done: Vec<String> = peers
        .iter_mut()
        .map(|p| p.finish(Duration::from_secs(300)))
        .collect();
    // Every honest member convicted it. (Not asked of the attacker: it may
    // leave before its conviction reaches it.)
    if !done[..attacker]
        .iter()
        .all(|d| d.contains(r#""slashed":[3]"#))
    {
        for (i, p) in peers.iter().enumerate() {
            eprintln!("{mode}: member {i}: listed per step {:?}", p.contributors());
        }
    }
    for (i, d) in done[..attacker].iter().enumerate() {
        assert!(d.contains(r#""slashed":[3]"#), "{mode}: member {i}: {d}");
    }
    // Every honest member applied the same manifests with the same weights.
    // Not the attacker: once slashed it has nobody to stay for and leaves
    // when done, so its last manifest can be one the honest nodes replaced
    // with a better one after it left (seen under load: steps 0–14 equal on
    // all four, step 15 the attacker's own).
    let finals: Vec<&str> = done[..attacker]
        .iter()
        .map(|d| field(d, "hash").unwrap())
        .collect();
    if !finals.iter().all(|h| *h == finals[0]) {
        for (i, p) in peers.iter().enumerate() {
            let notes: Vec<String> = p
                .lines()
                .into_iter()
                .filter(|l| {
                    ["rewound", "synced", "done", "diverged", "wrong_state"]
                        .iter()
                        .any(|e| l.contains(e))
                })
                .collect();
            eprintln!("{mode}: member {i}: {notes:?}; per step {:?}", p.hashes());
        }
    }
    assert!(finals.iter().all(|h| *h == finals[0]), "{mode}: {finals:?}");
    assert!(assert_agree(&peers[..attacker].iter().collect::<Vec<_>>()) > 0);
    // The honest witnesses audited, and only the attacker failed.
    let (mut failed, mut chain_failed) = (0, 0);
    // (step, honest member) → the chain error of each audit of it (-1: the
    // chain was not checked).
    let mut honest: BTreeMap<(u32, u32), Vec<f32>> = BTreeMap::new();
    for p in &peers[..attacker] {
        for l in p
            .lines()
            .iter()
            .filter(|l| l.contains(r#""event":"audited""#))
        {
            let member: u32 = field(l, "member").unwrap().parse().unwrap();
            let passed = field(l, "passed") == Some("true");
            let chain: f32 = field(l, "chain_error").unwrap().parse().unwrap();
            // The stale member's first step is honest, and a forged
            // momentum passes the one-step audit by design (only audits that
            // checked the chain can fail it).
            let step: u32 = field(l, "step").unwrap().parse().unwrap();
            let may_pass =
                (mode == "stale" && step == 0) || (mode == "forged-momentum" && chain < 0.0);
            if member == attacker as u32 && may_pass {
                continue;
            }
            assert_eq!(passed, member != attacker as u32, "{mode}: {l}");
            if member != attacker as u32 {
                honest.entry((step, member)).or_default().push(chain);
            }
            failed += usize::from(!passed);
            chain_failed += usize::from(!passed && chain > 0.5);
        }
    }
    assert!(failed >= 2, "{mode}: {failed} failed audits");
    if mixed {
        // However few contributions a loaded machine gets into each
        // manifest, every honest one listed was audited (a slow witness
        // audits late, it never drops an audit), and every audit of a
        // member listed the step before also checked its chain: honest
        // work on other thread counts passes both.
        let listed = peers[0].contributors();
        let (mut audits, mut chained) = (0, [0usize; 3]);
        for (step, members) in &listed {
            for m in members.iter().filter(|m| **m != attacker as u32) {
                let chains = honest
                    .get(&(*step, *m))
                    .unwrap_or_else(|| panic!("member {m}'s step {step} was never audited"));
                let follows = *step > 0 && listed.get(&(step - 1)).is_some_and(|l| l.contains(m));
                if follows {
                    assert!(
                        chains.iter().all(|c| *c >= 0.0),
                        "member {m}'s step {step} follows its step before: {chains:?}"
                    );
                    chained[*m as usize] += chains.len();
                }
                audits += chains.len();
            }
        }
        let worst = honest.values().flatten().fold(0f32, |a, c| a.max(*c));
        eprintln!(
            "wgpu member: {wgpu}; {audits} audits of honest work, {chained:?} with the chain per member (worst chain error {worst:.5})"
        );
        // The members on other thread counts (or backends) had their chain
        // checked at least once each.
        assert!(chained[1] > 0 && chained[2] > 0, "{chained:?}");
    }
    if mode == "forged-momentum" {
        assert!(
            chain_failed >= 2,
            "{mode}: {chain_failed} chain checks failed"
        );
    }
    // Caught on one of the first four steps that listed it (on a loaded
    // machine its contribution may miss a manifest): the first accusation
    // by an honest witness. The quorum that convicts waits for the slower
    // auditor of the same contribution, who may have to ask the attacker
    // for its momentum again (seen: one auditor's requests unanswered
    // twice, the conviction six listings later; docs/robustness.md).
    let evidence: u32 = peers[..attacker]
        .iter()
        .flat_map(|p| p.lines())
        .filter(|l| {
            l.contains(r#""event":"accused""#) && field(l, "member") == Some(&*attacker.to_string())
        })
        .map(|l| field(&l, "step").unwrap().parse().unwrap())
        .min()
        .unwrap_or_else(|| panic!("{mode}: never accused"));
    let listed_before = peers[0]
        .contributors()
        .iter()
        .filter(|(s, l)| **s < evidence && l.contains(&(attacker as u32)))
        .count();
    if listed_before >= 4 {
        // What each honest witness did about the attacker, to tell a
        // missed audit from an undecided one or a split vote.
        for (i, p) in peers[..attacker].iter().enumerate() {
            let seen: Vec<String> = p
                .lines()
                .into_iter()
                .filter(|l| {
                    ["audited", "accused", "slashed", "flagged"]
                        .iter()
                        .any(|e| l.contains(&format!(r#""event":"{e}""#)))
                })
                .collect();
            eprintln!("{mode}: member {i}: {seen:#?}");
        }
    }
    assert!(
        listed_before < 4,
        "{mode}: first accused on step {evidence}, after {listed_before} steps that listed it"
    );
    // Each node convicts when a quorum's accusations reach it, and a leader
    // lists whom it has not convicted: a node that lags (a loaded machine)
    // applies manifests that leaders made before its own conviction. So the
    // bound runs from when the last honest member convicted: from three
    // steps past the furthest step any honest member had applied by then
    // (manifests already in flight), no manifest lists the attacker.
    let convicted: Vec<Instant> = peers[..attacker]
        .iter()
        .map(|p| {
            p.first(r#""event":"slashed""#)
                .unwrap_or_else(|| panic!("{mode}: never slashed"))
        })
        .collect();
    let all_convicted = *convicted.iter().max().unwrap();
    let frontier = peers[..attacker]
        .iter()
        .flat_map(|p| p.applied_at())
        .filter(|(_, at)| *at <= all_convicted)
        .map(|(s, _)| s)
        .max()
        .unwrap_or(0);
    for (i, p) in peers[..attacker].iter().enumerate() {
        for (step, list) in p.contributors() {
            if step > frontier + 3 {
                assert!(
                    !list.contains(&3),
                    "{mode}: member {i}: step {step} lists {list:?} (every honest member had convicted by step {frontier})"
                );
            }
        }
    }
}

/// A member that, whenever it leads a step, states a state hash that is not
/// the state's, lists a payload it altered under another member's name,
/// leaves out a third member's contribution, and signs a second manifest
/// for the same attempt: every honest node skips
/// the forged entry (nobody audits, let alone accuses, the member it
/// names), records the leader as the culprit, and none concludes that it
/// diverged (that takes more leaders than could be faulty). The honest
/// witnesses accuse the leader on the forged entry and the equivocation,
/// proof each holds by itself, and convict it; the omission is noticed.
#[test]
fn a_lying_leader_gets_no_honest_member_accused_no_honest_node_failed_and_is_convicted() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (n, steps, liar) = (3, 12, 2);
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let mut peers: Vec<Peer> = (0..n)
        .map(|i| {
            let mut c = peer_cmd("lying-leader", i, n, steps, &ports);
            c.args(["--witnesses", "0,1,2", "--quorum", "2"]);
            if i == liar {
                c.args(["--adversary", "lying-leader"]);
            }
            Peer::spawn(&mut c)
        })
        .collect();
    let done: Vec<String> = peers
        .iter_mut()
        .map(|p| p.finish(Duration::from_secs(120)))
        .collect();
    // The honest members end bit-identical, every step applied (the liar's
    // own history may part from theirs: it applied what it did not sign).
    let finals: Vec<&str> = done[..liar]
        .iter()
        .map(|d| field(d, "hash").unwrap())
        .collect();
    assert!(finals.iter().all(|h| *h == finals[0]), "{finals:?}");
    for (i, d) in done[..liar].iter().enumerate() {
        assert_eq!(
            field(d, "applied"),
            Some(&*steps.to_string()),
            "member {i}: {d}"
        );
        // The liar is convicted by the honest witnesses on proof each holds.
        assert!(d.contains(r#""slashed":[2]"#), "member {i}: {d}");
    }
    for p in &peers[..liar] {
        let lines = p.lines();
        assert!(
            !lines.iter().any(|l| l.contains(r#""event":"diverged""#)),
            "an honest node concluded it diverged: {lines:#?}"
        );
        let of = |event: &str| -> Vec<&String> {
            lines
                .iter()
                .filter(|l| l.contains(&format!(r#""event":"{event}""#)))
                .collect()
        };
        let wrong = of("wrong_state_hash");
        let forged = of("forged_entry");
        assert!(
            !wrong.is_empty() && !forged.is_empty(),
            "the liar led no step the node checked: {lines:#?}"
        );
        for l in wrong.iter().chain(&forged) {
            assert_eq!(
                field(l, "leader"),
                Some("2"),
                "an honest leader was blamed: {l}"
            );
        }
        // Its forged entry and its second manifest are accusations against
        // it, and nobody else is accused.
        let accused = of("accused");
        for ground in ["forged_entry", "equivocation"] {
            assert!(
                accused.iter().any(|l| field(l, "ground") == Some(ground)),
                "no {ground} accusation: {lines:#?}"
            );
        }
        for l in &accused {
            assert_eq!(
                field(l, "member"),
                Some("2"),
                "an honest member was accused: {l}"
            );
        }
        // The member it kept leaving out is noticed, with the leader named.
        let omitted = of("omitted");
        assert!(
            omitted.iter().any(|l| field(l, "leader") == Some("2")),
            "the censorship went unnoticed: {lines:#?}"
        );
        // No audit failed any honest member, forged entry or not.
        for l in of("audited") {
            if field(l, "member") != Some("2") {
                assert_eq!(field(l, "passed"), Some("true"), "{l}");
            }
        }
    }
    assert!(assert_agree(&peers[..liar].iter().collect::<Vec<_>>()) > 0);
}

/// Eight processes on shaped links train through the sharded exchange
/// (4 shards, 2 aggregators each, so every member holds one seat a step:
/// the plan's one shard per two members, `exchange::shard_count`): nobody downloads another member's
/// payload, every honest node ends on the same weights, and an aggregator
/// that signs and serves a sum one vote off is caught by the nodes that
/// fetch its shard (its co-seat signed another hash), which recompute the
/// shard from the members' signed slices, apply the true sum, and convict
/// it with its own signed claim as the proof. In the same run a member
/// announces step 2 but pushes and serves none of its slices: seats claim
/// them withheld, every node fails to get them too, and a fall-back
/// manifest without it takes the step (before, the step stalled for good).
/// And a member sends its payload sign-flipped and, audited, reveals a
/// momentum forged so that the flipped payload recomputes: no node holds
/// its payload whole, so each of its auditors screens it by one slice (its
/// signs go against the shard's sums), fetches the rest from the seats,
/// recomputes it from the revealed momentum and follows the momentum chain
/// from the step before (whose payload it fetches as slices too), which
/// the forgery breaks: it is convicted. No audit is drawn by coin here: the
/// screen alone finds it, and flags no honest member. A fourth attacker
/// announces its work as computed on a made-up state (so no witness audits
/// it, and no honest leader lists it) and, leading a step, lists itself
/// anyway: the witnesses accuse it (`Ground::ForeignBasis`) and it is
/// convicted.
#[test]
fn eight_processes_train_through_the_sharded_exchange_a_lying_aggregator_and_a_momentum_forger_are_convicted_and_a_withholder_left_out()
 {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (n, steps, liar, withholder, forger) = (8, 6, 5, 3, 6);
    // The foreign-basis attacker must lead a step: the first member free
    // of another part that the job's rotation makes a step's leader.
    let job = local_job("sharded");
    let rotation = StepMachine::new(
        job,
        0,
        epoch_seed(&job, 0),
        n as u32,
        0,
        Timing::default(),
        Some(0),
    );
    let foreign = [0usize, 1, 2, 4, 7]
        .into_iter()
        .find(|&c| (0..steps).any(|s| rotation.leader(s, 0) == c as u32))
        .expect("some free member leads a step");
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let witnesses = (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let mut peers: Vec<Peer> = (0..n)
        .map(|i| {
            let mut c = peer_cmd("sharded", i, n, steps, &ports);
            c.args(["--shards", "4", "--redundancy", "2"]);
            c.args(["--rate-mbit", "50", "--rtt-ms", "20"]);
            c.args(["--witnesses", &witnesses, "--quorum", "2"]);
            c.args(["--audit-rate", "0"]);
            if i == liar {
                c.args(["--adversary", "lying-aggregator"]);
            }
            if i == withholder {
                c.args(["--adversary", "withholding"]);
            }
            if i == forger {
                c.args(["--adversary", "forged-momentum"]);
            }
            if i == foreign {
                c.args(["--adversary", "foreign-basis"]);
            }
            Peer::spawn(&mut c)
        })
        .collect();
    let honest: Vec<usize> = (0..n)
        .filter(|&i| i != liar && i != withholder && i != forger && i != foreign)
        .collect();
    // The withholder is behind from the step it stalled on, and finished
    // nodes stay while a live peer still trains: it leaves once every
    // honest node applied the last step.
    let last = format!(r#""event":"applied","step":{}"#, steps - 1);
    for &i in &honest {
        peers[i].wait_for("the last step", Duration::from_secs(240), |p| {
            p.lines().iter().any(|l| l.contains(&last))
        });
    }
    let _ = peers[withholder].child.kill();
    let mut done = vec![String::new(); n];
    for &i in honest.iter().chain([&liar, &forger, &foreign]) {
        done[i] = peers[i].finish(Duration::from_secs(240));
    }
    let mut convicted = vec![liar, forger, foreign];
    convicted.sort();
    let slashed = format!(r#""slashed":{convicted:?}"#);
    let finals: Vec<&str> = honest
        .iter()
        .map(|&i| field(&done[i], "hash").unwrap())
        .collect();
    assert!(finals.iter().all(|h| *h == finals[0]), "{finals:?}");
    for &i in &honest {
        let d = &done[i];
        assert_eq!(
            field(d, "applied"),
            Some(&*steps.to_string()),
            "member {i}: {d}"
        );
        assert!(d.contains(&slashed), "member {i}: {d}");
    }
    let caught: u64 = honest
        .iter()
        .map(|&i| {
            field(&done[i], "false_sums")
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert!(caught > 0, "no node caught the lie: {done:#?}");
    // The forger's slices got no vote in the shards its honest seats summed
    // before it was slashed (`shard::votes`).
    let unvoted: u64 = honest
        .iter()
        .map(|&i| field(&done[i], "unvoted").unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(
        unvoted > 0,
        "no seat took the forger's votes away: {done:#?}"
    );
    let (mut audits, mut broken_chain) = (0, false);
    for &i in &honest {
        for l in peers[i].lines() {
            if l.contains(r#""event":"accused""#) {
                let member: usize = field(&l, "member").unwrap().parse().unwrap();
                let ground = match member {
                    m if m == liar => "false_sum",
                    m if m == forger => "sampled",
                    m if m == foreign => "foreign_basis",
                    _ => panic!("an honest member was accused: {l}"),
                };
                assert_eq!(field(&l, "ground"), Some(ground), "{l}");
            }
            if l.contains(r#""event":"audited""#) {
                audits += 1;
                if field(&l, "member") != Some(&*forger.to_string()) {
                    assert_eq!(field(&l, "passed"), Some("true"), "{l}");
                } else if field(&l, "passed") == Some("false") {
                    let chain: f32 = field(&l, "chain_error").unwrap().parse().unwrap();
                    broken_chain |= chain > 0.5;
                }
            }
        }
    }
    assert!(audits > 0, "no audit ran on the sharded exchange");
    assert!(broken_chain, "the forger's momentum chain was not followed");
    assert!(assert_agree(&honest.iter().map(|&i| &peers[i]).collect::<Vec<_>>()) > 0);
    // Step 2 applied without the withholder's contribution, wherever it
    // was applied (a node that fell behind may have downloaded the state
    // after it instead).
    let w = withholder as u32;
    let mut applied_2 = 0;
    for &i in &honest {
        for l in peers[i].lines() {
            if l.contains(r#""event":"applied""#) && field(&l, "step") == Some("2") {
                assert!(!listed(&l).contains(&w), "member {i}: {l}");
                applied_2 += 1;
            }
        }
    }
    assert!(applied_2 * 2 >= honest.len(), "{applied_2} applied step 2");
}

/// A member that, leading a step, heartbeats but never publishes (a silent
/// leader) or publishes a manifest listing a hash nobody holds (an
/// unservable manifest), and answers requests for its payloads only from
/// the leader, so everyone else waits on it (a trickling author). Every
/// step still closes within its documented bound: a silent leader's or an
/// unservable manifest's step by the fall-back at `collect + fallback +
/// silent`, and a trickled fetch at the request deadline
/// (`Timing::deadline`), after which the leader serves it. With the old
/// 30 s `silent` and 20 s transport time-out, steps took 32 s.
#[test]
fn a_silent_leader_an_unservable_manifest_and_a_trickling_author_cost_each_step_at_most_the_documented_bound()
 {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (n, steps, staller) = (3, 8, 2);
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let mut peers: Vec<Peer> = (0..n)
        .map(|i| {
            let mut c = peer_cmd("stalling", i, n, steps, &ports);
            if i == staller {
                c.args(["--adversary", "stalling"]);
            }
            Peer::spawn(&mut c)
        })
        .collect();
    let done: Vec<String> = peers[..staller]
        .iter_mut()
        .map(|p| p.finish(Duration::from_secs(240)))
        .collect();
    let timing = Timing {
        collect: Duration::from_millis(1500),
        fallback: Duration::from_millis(1000),
        ..Timing::default()
    };
    // The bound, plus room for a busy machine's compute and fetches.
    let silent_step = timing.collect + timing.fallback + timing.silent;
    let bound =
        silent_step.max(timing.collect + timing.deadline(64 * 1024)) + Duration::from_secs(8);
    let mut timed_out = 0;
    for (i, d) in done.iter().enumerate() {
        assert_eq!(
            field(d, "applied"),
            Some(&*steps.to_string()),
            "member {i}: {d}"
        );
        timed_out += field(d, "timed_out").unwrap().parse::<u64>().unwrap();
        let at = peers[i].applied_at();
        for w in at.windows(2) {
            let gap = w[1].1 - w[0].1;
            assert!(
                gap <= bound,
                "member {i}: step {} closed {gap:?} after step {} (bound {bound:?})",
                w[1].0,
                w[0].0
            );
        }
    }
    // The deadline, not the transport's time-out, ended the trickled fetches.
    assert!(timed_out > 0, "{done:?}");
    assert!(assert_agree(&peers[..staller].iter().collect::<Vec<_>>()) > 0);
}

/// Network namespaces joined by a veth pair: a real link between two
/// network stacks. Needs `ip netns` (root), and fails without it.
#[test]
fn two_nodes_train_across_network_namespaces() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tag = format!("c{}", std::process::id() % 100000);
    let (a, b) = (format!("{tag}a"), format!("{tag}b"));
    // Not a silent skip: a machine that cannot build namespaces fails here
    // and says how to leave the test out on purpose.
    let mut net = Netns::new("two_nodes_train_across_network_namespaces");
    net.add(&a);
    net.add(&b);
    net.link(
        (&a, &format!("{tag}va"), "10.231.0.1/24"),
        (&b, &format!("{tag}vb"), "10.231.0.2/24"),
    );
    let steps = 8;
    let cmd = |ns: &str, i: usize, me: &str, other: &str| {
        let mut c = Command::new("ip");
        c.env("RAYON_NUM_THREADS", "1")
            .args(["netns", "exec", ns, PEER]);
        let peer = swarm::peer_id(&local_member(1 - i).1).unwrap();
        c.args([
            "--job",
            "netns",
            "--index",
            &i.to_string(),
            "--members",
            "2",
            "--steps",
            &steps.to_string(),
            "--batch",
            "4",
            "--listen",
            &format!("/ip4/{me}/tcp/4100"),
            "--peer",
            &format!("/ip4/{other}/tcp/4100/p2p/{peer}"),
        ]);
        c
    };
    let mut pa = Peer::spawn(&mut cmd(&a, 0, "10.231.0.1", "10.231.0.2"));
    let mut pb = Peer::spawn(&mut cmd(&b, 1, "10.231.0.2", "10.231.0.1"));
    let t = Duration::from_secs(120);
    let (da, db) = (pa.finish(t), pb.finish(t));
    assert_eq!(field(&da, "hash"), field(&db, "hash"));
    assert_eq!(assert_agree(&[&pa, &pb]), steps as usize);
}

/// Commands run to build a test network, and the namespaces to delete
/// when the test ends (passed or not).
struct Netns {
    /// The test, named in the failure message (how to leave it out).
    test: &'static str,
    spaces: Vec<String>,
}

impl Netns {
    fn new(test: &'static str) -> Self {
        Netns {
            test,
            spaces: Vec::new(),
        }
    }

    /// Runs `args`, inside namespace `ns` when given; panics with the
    /// command, its error output and how to leave the test out when it
    /// fails (it needs root, iproute2 and, for NAT, nftables).
    fn run(&self, ns: Option<&str>, args: &[&str]) {
        let mut c = Command::new(if ns.is_some() { "ip" } else { args[0] });
        match ns {
            Some(ns) => c.args(["netns", "exec", ns]).args(args),
            None => c.args(&args[1..]),
        };
        let out = c
            .output()
            .unwrap_or_else(|e| panic!("{args:?}: {e}; {} needs iproute2", self.test));
        assert!(
            out.status.success(),
            "{args:?} in {ns:?} failed: {}this test needs root and iproute2 (and nft for \
             NAT); leave it out with `--skip {}`",
            String::from_utf8_lossy(&out.stderr),
            self.test
        );
    }

    fn add(&mut self, ns: &str) {
        self.run(None, &["ip", "netns", "add", ns]);
        self.spaces.push(ns.to_string());
        self.run(Some(ns), &["ip", "link", "set", "lo", "up"]);
    }

    /// A veth pair from `(ns_a, if_a, addr_a)` to `(ns_b, if_b, addr_b)`.
    fn link(&self, a: (&str, &str, &str), b: (&str, &str, &str)) {
        self.run(
            None,
            &[
                "ip", "link", "add", a.1, "type", "veth", "peer", "name", b.1,
            ],
        );
        for (ns, dev, addr) in [a, b] {
            self.run(None, &["ip", "link", "set", dev, "netns", ns]);
            self.run(Some(ns), &["ip", "addr", "add", addr, "dev", dev]);
            self.run(Some(ns), &["ip", "link", "set", dev, "up"]);
        }
    }
}

impl std::ops::Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.spaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Three homes behind NAT routers (nftables masquerade, a home router's
/// firewall: nothing new comes in from outside) and a relay on the
/// "internet" between them. Homes A and B have
/// port-preserving NATs, home C a symmetric one (a new random port per
/// destination), so no hole can be punched to it. The members reach each
/// other only through the relay at first (circuit relay v2); DCUtR then
/// punches A↔B, and C keeps training through the relay. Needs root,
/// `ip netns` and `nft` (Debian: `apt install nftables`).
#[test]
#[ignore = "needs root, ip netns and nft (apt install nftables); run with --ignored"]
fn members_behind_nat_train_through_a_relay_and_punch_holes_where_the_nat_allows() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tag = format!("n{}", std::process::id() % 100000);
    let mut net =
        Netns::new("members_behind_nat_train_through_a_relay_and_punch_holes_where_the_nat_allows");
    let wan = format!("{tag}w");
    net.add(&wan);
    net.run(Some(&wan), &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let homes = ["a", "b", "c"];
    for (i, h) in homes.iter().enumerate() {
        let (router, home) = (format!("{tag}r{h}"), format!("{tag}h{h}"));
        net.add(&router);
        net.add(&home);
        let n = i + 1;
        // WAN side: 10.79.n.0/24 between the internet and the router.
        net.link(
            (&wan, &format!("{tag}w{h}"), &format!("10.79.{n}.1/24")),
            (&router, &format!("{tag}u{h}"), &format!("10.79.{n}.2/24")),
        );
        // LAN side: 192.168.n.0/24 between the router and the home.
        net.link(
            (&router, &format!("{tag}l{h}"), &format!("192.168.{n}.1/24")),
            (&home, &format!("{tag}i{h}"), &format!("192.168.{n}.2/24")),
        );
        let gw = format!("10.79.{n}.1");
        net.run(
            Some(&router),
            &["ip", "route", "add", "default", "via", &gw],
        );
        let lan_gw = format!("192.168.{n}.1");
        net.run(
            Some(&home),
            &["ip", "route", "add", "default", "via", &lan_gw],
        );
        net.run(Some(&router), &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let masq = if *h == "c" {
            "masquerade random,fully-random"
        } else {
            "masquerade"
        };
        let rules = format!(
            "table ip nat {{\n\
               chain post {{\n\
                 type nat hook postrouting priority 100\n\
                 oifname \"{tag}u{h}\" {masq}\n\
               }}\n\
             }}\n\
             table inet fw {{\n\
               chain inbound {{\n\
                 type filter hook input priority 0\n\
                 iifname \"{tag}u{h}\" ct state new drop\n\
               }}\n\
               chain through {{\n\
                 type filter hook forward priority 0\n\
                 iifname \"{tag}u{h}\" ct state new drop\n\
               }}\n\
             }}\n"
        );
        let path = std::env::temp_dir().join(format!("{tag}{h}.nft"));
        std::fs::write(&path, rules).unwrap();
        net.run(Some(&router), &["nft", "-f", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&path);
    }
    let relay_id = cohort_engine::net::peer::relay_peer_id();
    let relay = format!("/ip4/10.79.1.1/tcp/4000/p2p/{relay_id}");
    let mut r = Command::new("ip");
    r.args([
        "netns",
        "exec",
        &wan,
        PEER,
        "--relay-server",
        "--members",
        "3",
        "--listen",
        "/ip4/10.79.1.1/tcp/4000",
    ]);
    let relay_proc = Peer::spawn(&mut r);
    relay_proc.wait_for("the relay to listen", Duration::from_secs(20), |p| {
        p.first("listening").is_some()
    });
    let steps = 40;
    let n = homes.len();
    let mut peers: Vec<Peer> = homes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut c = Command::new("ip");
            c.env("RAYON_NUM_THREADS", "1")
                .args(["netns", "exec", &format!("{tag}h{h}"), PEER]);
            c.args([
                "--job",
                "nat",
                "--index",
                &i.to_string(),
                "--members",
                &n.to_string(),
                "--steps",
                &steps.to_string(),
                "--batch",
                "4",
                "--listen",
                &format!("/ip4/192.168.{}.2/tcp/4100", i + 1),
                "--listen",
                &format!("{relay}/p2p-circuit"),
            ]);
            for j in (0..n).filter(|j| *j != i) {
                let other = swarm::peer_id(&local_member(j).1).unwrap();
                c.args(["--peer", &format!("{relay}/p2p-circuit/p2p/{other}")]);
            }
            Peer::spawn(&mut c)
        })
        .collect();
    let done: Vec<String> = peers
        .iter_mut()
        .map(|p| p.finish(Duration::from_secs(240)))
        .collect();
    drop(relay_proc);
    for (i, d) in done.iter().enumerate() {
        let routes = d
            .split(",\"dropped\"")
            .next()
            .and_then(|l| l.split("\"routes\":").nth(1));
        eprintln!(
            "member {i} (home {}): routes {}",
            homes[i],
            routes.unwrap_or("?")
        );
        assert_eq!(field(d, "applied"), Some(&*steps.to_string()), "{d}");
        assert_eq!(field(d, "hash"), field(&done[0], "hash"));
    }
    // Every pair of members compared at every step.
    assert_eq!(
        assert_agree(&peers.iter().collect::<Vec<_>>()),
        3 * steps as usize
    );
    // `"routes":{"1":"holepunched","2":"relayed"}` in each `done` line.
    let route = |i: usize, j: usize| {
        let routes = done[i].split("\"routes\":{").nth(1)?.split('}').next()?;
        field(&format!("{{{routes}}}"), &j.to_string()).map(str::to_string)
    };
    // No member was reached at a private address: every route went
    // through the relay, and A and B then punched a hole to each other.
    // DCUtR reports success on the side whose dial made the direct
    // connection; the other may see it only as a direct connection, which
    // between two NATs can only be the punched hole.
    let punched = |r: Option<String>| matches!(r.as_deref(), Some("holepunched" | "direct"));
    assert!(punched(route(0, 1)), "{}", done[0]);
    assert!(punched(route(1, 0)), "{}", done[1]);
    assert!(
        [route(0, 1), route(1, 0)].contains(&Some("holepunched".into())),
        "{}\n{}",
        done[0],
        done[1]
    );
    for (i, j) in [(0, 2), (2, 0), (1, 2), (2, 1)] {
        assert_eq!(
            route(i, j).as_deref(),
            Some("relayed"),
            "member {i} to {j}: {}",
            done[i]
        );
    }
}

/// Writes its requests' bytes as they are and reads whatever comes back:
/// the attacker's side of the blob protocol, so it can send frames the
/// members' codec would never produce.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

#[async_trait::async_trait]
impl libp2p::request_response::Codec for RawCodec {
    type Protocol = libp2p::StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &Self::Protocol, io: &mut T) -> std::io::Result<Vec<u8>>
    where
        T: libp2p::futures::AsyncRead + Unpin + Send,
    {
        read_all(io).await
    }

    async fn read_response<T>(&mut self, _: &Self::Protocol, io: &mut T) -> std::io::Result<Vec<u8>>
    where
        T: libp2p::futures::AsyncRead + Unpin + Send,
    {
        read_all(io).await
    }

    async fn write_request<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
        r: Vec<u8>,
    ) -> std::io::Result<()>
    where
        T: libp2p::futures::AsyncWrite + Unpin + Send,
    {
        write_all(io, &r).await
    }

    async fn write_response<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
        r: Vec<u8>,
    ) -> std::io::Result<()>
    where
        T: libp2p::futures::AsyncWrite + Unpin + Send,
    {
        write_all(io, &r).await
    }
}

async fn write_all<T: libp2p::futures::AsyncWrite + Unpin + Send>(
    io: &mut T,
    bytes: &[u8],
) -> std::io::Result<()> {
    use libp2p::futures::AsyncWriteExt;
    io.write_all(bytes).await?;
    io.close().await
}

async fn read_all<T: libp2p::futures::AsyncRead + Unpin + Send>(
    io: &mut T,
) -> std::io::Result<Vec<u8>> {
    use libp2p::futures::AsyncReadExt;
    let mut v = Vec::new();
    io.take(1 << 20).read_to_end(&mut v).await?;
    Ok(v)
}

/// Requests no member's codec accepts: a frame announcing 1 GiB (followed
/// by 256 KiB of it), and one a byte over the request limit.
fn oversized_requests() -> [Vec<u8>; 2] {
    let mut huge = (1u32 << 30).to_le_bytes().to_vec();
    huge.resize(4 + (256 << 10), 0xEE);
    let over = msg::MAX_REQUEST + 1;
    let mut just_over = (over as u32).to_le_bytes().to_vec();
    just_over.resize(4 + over, 0xEE);
    [huge, just_over]
}

/// Two honest peers and an attacker on the gossip topic. The attacker
/// publishes `make(captured honest message)` repeatedly; both honest
/// peers must finish with equal hashes and count the drops as `expect`.
/// Two honest peers train while an outsider publishes `make(captured)`
/// every 100 ms; when `probe` it also asks them for snapshots and momenta,
/// which they must refuse, and a second outsider floods them with
/// oversized requests, which their codec must cut off unanswered. Every
/// drop in `expect` must be counted.
fn hostile(expect: &[Drop], make: fn(&[u8]) -> Vec<u8>, probe: bool) {
    use cohort_engine::net::msg::{Request, Response};
    use libp2p::request_response;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let job = format!("hostile-{}", expect[0].name());
    let replay = expect == [Drop::Replayed];
    // The replayer's copies get through only once older than `swarm::SEEN`
    // (5 s), so its run lasts long enough for several of them.
    let steps = if replay { 300 } else { 20 };
    let ports = [free_port(), free_port()];
    let mut honest: Vec<Peer> = (0..2)
        .map(|i| Peer::spawn(&mut peer_cmd(&job, i, 2, steps, &ports)))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let attacker_key = msg::keypair(&[0xAA; 32]);
    let topic = swarm::topic(&local_job(&job), 0);
    let sent = rt.block_on(async {
        let mut sw = swarm::build(&attacker_key, Link::default(), false, Default::default()).unwrap();
        sw.behaviour_mut().gossip.subscribe(&topic).unwrap();
        let mut redial = true;
        let mut captured: Option<Vec<u8>> = None;
        let mut sent = 0u32;
        let mut connected = std::collections::BTreeSet::new();
        let mut answers: Vec<Response> = Vec::new();
        // The flooder of oversized requests: its own peer id, its own codec.
        let mut raw = libp2p::SwarmBuilder::with_new_identity()
            .with_tokio()
            .with_tcp(
                libp2p::tcp::Config::default(),
                libp2p::noise::Config::new,
                libp2p::yamux::Config::default,
            )
            .unwrap()
            .with_behaviour(|_| {
                request_response::Behaviour::with_codec(
                    RawCodec,
                    [(swarm::BLOB_PROTOCOL, request_response::ProtocolSupport::Outbound)],
                    request_response::Config::default()
                        .with_request_timeout(Duration::from_secs(10)),
                )
            })
            .unwrap()
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(120)))
            .build();
        let mut raw_connected = std::collections::BTreeSet::new();
        let (mut raw_sent, mut raw_failed, mut raw_answered) = (0u32, 0u32, 0u32);
        let mut raw_redial = probe;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                ev = sw.select_next_some() => {
                    if let SwarmEvent::OutgoingConnectionError { .. } = ev {
                        redial = true;
                    }
                    if let SwarmEvent::ConnectionEstablished { peer_id, .. } = ev {
                        connected.insert(peer_id);
                    }
                    if let SwarmEvent::Behaviour(swarm::BehaviourEvent::Blobs(
                        request_response::Event::Message {
                            message: request_response::Message::Response { response, .. }, ..
                        })) = &ev
                    {
                        answers.push(response.clone());
                    }
                    if let SwarmEvent::Behaviour(swarm::BehaviourEvent::Gossip(
                        gossipsub::Event::Message { message, .. })) = ev
                    {
                        // The replayer keeps the first heartbeat it hears and
                        // sends those very bytes again: gossipsub drops them
                        // for `swarm::SEEN` (a message is known by its
                        // bytes), then the members' step machines must.
                        // The others take the latest message, so that what
                        // they make of it changes as they flood.
                        let heartbeat = msg::open(&message.data)
                            .is_ok_and(|s| matches!(s.body, Body::Heartbeat(_)));
                        if !replay || (captured.is_none() && heartbeat) {
                            captured = Some(message.data);
                        }
                    }
                }
                ev = raw.select_next_some() => match ev {
                    SwarmEvent::ConnectionEstablished { peer_id, .. } => {
                        raw_connected.insert(peer_id);
                    }
                    SwarmEvent::ConnectionClosed { peer_id, num_established: 0, .. } => {
                        raw_connected.remove(&peer_id);
                        raw_redial = true;
                    }
                    SwarmEvent::OutgoingConnectionError { .. } => raw_redial = true,
                    SwarmEvent::Behaviour(request_response::Event::OutboundFailure { .. }) => {
                        raw_failed += 1;
                    }
                    // A stream the member closed unanswered reads as empty.
                    SwarmEvent::Behaviour(request_response::Event::Message {
                        message: request_response::Message::Response { response, .. }, ..
                    }) if response.is_empty() => raw_failed += 1,
                    SwarmEvent::Behaviour(request_response::Event::Message {
                        message: request_response::Message::Response { .. }, ..
                    }) => raw_answered += 1,
                    _ => {}
                },
                _ = tick.tick() => {
                    if std::mem::take(&mut raw_redial) {
                        for (i, p) in ports.iter().enumerate() {
                            let _ = raw.dial(addr(*p, i).parse::<libp2p::Multiaddr>().unwrap());
                        }
                    }
                    // Three rounds a tick: a flood, and enough of one that a
                    // slow machine's few connected seconds still send 100.
                    for p in &raw_connected {
                        for req in (0..3).flat_map(|_| oversized_requests()) {
                            raw.behaviour_mut().send_request(p, req);
                            raw_sent += 1;
                        }
                    }
                    if std::mem::take(&mut redial) {
                        for (i, p) in ports.iter().enumerate() {
                            let _ = sw.dial(addr(*p, i).parse::<libp2p::Multiaddr>().unwrap());
                        }
                    }
                    if let Some(c) = &captured
                        && sw.behaviour_mut().gossip.publish(topic.clone(), make(c)).is_ok()
                    {
                        sent += 1;
                    }
                    if probe {
                        for p in &connected {
                            for req in [
                                Request::Snapshot { step: 0, offset: 0 },
                                Request::Momentum { step: 1, offset: 0 },
                                Request::Cosign(vec![1, 2, 3]),
                            ] {
                                sw.behaviour_mut().blobs.send_request(p, req);
                            }
                        }
                    }
                    let finished = honest.iter().all(|p| p.lines().iter().any(|l| l.contains(r#""event":"done""#)));
                    if finished || tokio::time::Instant::now() > deadline {
                        break;
                    }
                }
            }
        }
        (sent, answers, raw_sent, raw_failed, raw_answered)
    });
    let (sent, answers, raw_sent, raw_failed, raw_answered) = sent;
    assert!(sent > 0, "the attacker never got a message out");
    if probe {
        eprintln!(
            "oversized requests: {raw_sent} sent, {raw_failed} failed, {raw_answered} answered"
        );
        assert!(
            raw_sent >= 100,
            "only {raw_sent} oversized requests went out"
        );
        assert!(
            raw_failed >= raw_sent / 2,
            "only {raw_failed} of {raw_sent} oversized requests were cut off"
        );
        assert_eq!(raw_answered, 0, "a member answered an oversized request");
        assert!(
            !answers.is_empty(),
            "no member answered the outsider at all"
        );
        assert!(
            answers.iter().all(|a| *a == Response::NotFound),
            "a member served an outsider: {:?}",
            answers.iter().find(|a| **a != Response::NotFound)
        );
    }
    let done: Vec<String> = honest
        .iter_mut()
        .map(|p| p.finish(Duration::from_secs(60)))
        .collect();
    assert_eq!(field(&done[0], "hash"), field(&done[1], "hash"));
    assert!(
        done.iter()
            .all(|d| field(d, "applied") == Some(&steps.to_string()))
    );
    for d in expect {
        let counted: u64 = done
            .iter()
            .map(|l| field(l, d.name()).unwrap().parse::<u64>().unwrap())
            .sum();
        assert!(counted > 0, "no `{}` drops counted: {done:?}", d.name());
    }
    // Drops every honest node would make count against the sender's gossip
    // score; replays and out-of-window messages do not (an honest forwarder
    // may send those).
    let lowest: f64 = done
        .iter()
        .map(|l| {
            field(l, "lowest_peer_score")
                .unwrap()
                .parse::<f64>()
                .unwrap()
        })
        .fold(0.0, f64::min);
    if expect.iter().any(|d| d.blames_forwarder()) {
        assert!(lowest < 0.0, "the sender kept a clean score: {done:?}");
    } else {
        assert_eq!(lowest, 0.0, "an honest forwarder was penalized: {done:?}");
    }
    // Memory stays bounded under the flood: each member's peak resident set.
    for d in &done {
        let kib: i64 = field(d, "peak_rss_kib").unwrap().parse().unwrap();
        eprintln!("member peak RSS under {expect:?}: {} MiB", kib / 1024);
        // About 70 MiB measured (docs/robustness.md); a quarter GiB is room
        // for allocator noise, not for buffering what the flood sent.
        assert!(kib < 256 << 10, "a member grew past 256 MiB: {d}");
    }
    assert_eq!(assert_agree(&[&honest[0], &honest[1]]), steps as usize);
}

#[test]
fn oversized_messages_are_dropped_and_counted() {
    hostile(
        &[Drop::Oversized],
        |c| {
            // Over our limit, under gossipsub's own 64 KiB cap, so it arrives.
            let mut m = c.to_vec();
            m.resize(msg::MAX_GOSSIP + 1024, 0x55);
            m
        },
        false,
    );
}

#[test]
fn truncated_messages_are_dropped_and_counted() {
    hostile(&[Drop::Malformed], |c| c[..c.len() / 2].to_vec(), false);
}

#[test]
fn unsigned_messages_are_dropped_and_counted() {
    hostile(
        &[Drop::BadSignature],
        |c| {
            let mut m = c.to_vec();
            let n = m.len();
            m[n - 64..].fill(0);
            m
        },
        false,
    );
}

#[test]
fn replayed_messages_are_dropped_and_counted() {
    hostile(&[Drop::Replayed], |c| c.to_vec(), false);
}

#[test]
fn messages_for_another_job_an_earlier_epoch_or_a_far_future_step_are_dropped_and_counted() {
    // Signed by a real member of the job, in turn: a heartbeat for another
    // job; a heartbeat replayed from an earlier epoch that claims the
    // member is done (receivers hold no sequence numbers from that epoch);
    // an announcement for a step far past the window (a flood of them must
    // create no state and no fetches).
    hostile(
        &[Drop::WrongJob, Drop::OutOfWindow],
        |c| {
            static SENT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let turn = SENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3;
            // The replay and the flood speak for member 1, so member 0 is
            // the one they target.
            let member = u32::from(turn > 0);
            let (secret, _) = local_member(member as usize);
            let key = msg::keypair(&secret);
            let captured_job = msg::open(c).map(|s| *s.body.job());
            if turn == 2 {
                let step = 10_000 + SENT.load(std::sync::atomic::Ordering::Relaxed);
                let a = msg::Announce {
                    job: captured_job.unwrap_or([0; 32]),
                    epoch: 0,
                    step,
                    member,
                    payload_hash: *blake3::hash(&step.to_le_bytes()).as_bytes(),
                    momentum_hash: [0; 32],
                    basis: [0; 32],
                    len: 1 << 20,
                    produced_us: 0,
                    chain_step: 0,
                    chain: [0; 32],
                };
                return msg::sign(&Body::Announce(a), &key);
            }
            let job = match captured_job {
                Ok(j) if turn == 1 => j,
                _ => local_job("some-other-job"),
            };
            let hb = Heartbeat {
                job,
                epoch: if turn == 1 { 7 } else { 0 },
                member,
                seq: u64::MAX,
                ready_from: 0,
                applied: u32::MAX,
                auditing: 0,
                chain_step: 0,
                chain: [0; 32],
            };
            msg::sign(&Body::Heartbeat(hb), &key)
        },
        false,
    );
}

#[test]
fn messages_requests_and_oversized_requests_from_non_members_are_refused_and_counted() {
    // The outsider also asks both members for a snapshot, a momentum and a
    // co-signature: every answer must be a refusal. A second one floods
    // them with oversized requests: each is cut off unanswered, and memory
    // stays bounded.
    hostile(
        &[Drop::NotMember],
        |c| {
            let mut hb = Heartbeat {
                job: [0; 32],
                epoch: 0,
                member: 0,
                seq: u64::MAX,
                ready_from: 0,
                applied: 0,
                auditing: 0,
                chain_step: 0,
                chain: [0; 32],
            };
            if let Ok(s) = msg::open(c) {
                hb.job = *s.body.job();
            }
            msg::sign(&Body::Heartbeat(hb), &msg::keypair(&[0xAA; 32]))
        },
        true,
    );
}
