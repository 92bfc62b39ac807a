//! The whole system as separate processes: `cohort localnet`, three
//! `cohort node`s training over libp2p on 127.0.0.1, and a requester using
//! `cohort job`. Also the requester's bad inputs, each a one-line error.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cohort");

fn home(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cohort-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A child whose stdout lines are collected as they come.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(home: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .env("COHORT_HOME", home)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let l = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    l.lock().unwrap().push(line);
                }
            });
        }
        Self { child, lines }
    }

    fn wait_for(&self, what: &str, limit: Duration) -> String {
        let t = Instant::now();
        loop {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| l.contains(what)) {
                return l.clone();
            }
            assert!(
                t.elapsed() < limit,
                "no `{what}` within {limit:?}: {:?}",
                self.lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn localnet(home: &Path) -> (Proc, String) {
    let p = Proc::spawn(home, &["localnet", "--port", "0"]);
    let line = p.wait_for("JSON-RPC at", Duration::from_secs(60));
    let url = line.rsplit(' ').next().unwrap().to_string();
    (p, url)
}

fn cohort(home: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("COHORT_HOME", home)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Fails, with exactly one line on stderr containing `want`.
fn fails(o: &Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(want), "`{want}` not in: {err}");
}

fn field(status: &str, key: &str) -> String {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .to_string()
}

/// Four free consecutive TCP ports on loopback for the P2P layer.
fn p2p_base() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = l.local_addr().unwrap().port();
        drop(l);
        if base < 65000
            && (1..4).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return base;
        }
    }
}

/// Funds the requester and posts a two-epoch job; returns its address.
fn post_job(h: &Path, url: &str, steps_per_epoch: &str, max_nodes: &str) -> String {
    ok(&cohort(h, &["airdrop", "2", "--url", url]));
    let created = ok(&cohort(
        h,
        &[
            "job",
            "create",
            "--url",
            url,
            "--epochs",
            "2",
            "--steps-per-epoch",
            steps_per_epoch,
            "--min-nodes",
            "3",
            "--max-nodes",
            max_nodes,
            "--id",
            "1",
        ],
    ));
    created.split_whitespace().nth(1).unwrap().to_string()
}

/// `cohort node` number `i`, with its own wallet and data folder.
fn spawn_node(h: &Path, i: usize, url: &str, job: &str, base: &str) -> Proc {
    Proc::spawn(
        &h.join(format!("node{i}")),
        &[
            "node",
            "--url",
            url,
            "--job",
            job,
            "--p2p-port",
            base,
            "--airdrop",
            "1",
        ],
    )
}

/// Every node's `done:` line shows the same models and a claim above
/// zero; returns the models and the total claimed, in lamports.
fn same_models_all_paid(done: &[String]) -> (String, u64) {
    let models: Vec<&str> = done
        .iter()
        .map(|d| d.rsplit("models ").next().unwrap())
        .collect();
    assert!(models.iter().all(|m| *m == models[0]), "{done:?}");
    let mut claimed = 0u64;
    for d in done {
        let c: u64 = d
            .split("claimed ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(c > 0, "{d}");
        claimed += c;
    }
    (models[0].to_string(), claimed)
}

/// (owed, paid, refunded) in lamports, from `cohort job status`.
fn spend(status: &str) -> (u64, u64, u64) {
    let nums: Vec<u64> = field(status, "spend")
        .split("lamports: ")
        .nth(1)
        .unwrap()
        .trim_end_matches(')')
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect();
    (nums[0], nums[1], nums[2])
}

#[test]
fn three_nodes_train_attest_and_get_paid_through_an_rpc_outage() {
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
    // Refund correct to the lamport: deposit = paid + refunded, and the
    // chain paid exactly what the nodes say they received (nothing twice).
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
    assert_eq!(owed, paid, "{status}");
    assert_eq!(deposit, paid + refunded, "{status}");
    // Three of four slots filled for two epochs at 0.001 SOL: the empty
    // slot's budget comes back.
    assert_eq!(refunded, 2 * 1_000_000, "{status}");
    let _ = chain.child.kill();
}

#[test]
fn bad_requests_are_one_line_errors_and_leave_nothing_on_chain() {
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
    // (steps it missed are backfilled from peers' manifests), so its claim
    // went through with everyone else's.
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

/// A node that flips the sign of every vote it sends joins a job with
/// three honest ones. The witnesses' audits fail it, the first accuser gathers a
/// quorum's co-signatures over libp2p and sends `report_fraud`: its stake
/// goes to the job, it stops, and the honest nodes finish and are paid.
#[test]
#[ignore = "flaky under CI load (5 processes on 2 cores): run with --ignored; see docs/robustness.md"]
fn a_sign_flipper_is_audited_reported_on_chain_and_slashed() {
    let h = home("fraud");
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
            "sign-flip",
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
    let reported: Vec<String> = honest
        .iter()
        .flat_map(|n| n.log())
        .filter(|l| l.contains("reported member 3 on chain"))
        .collect();
    assert_eq!(reported.len(), 1, "one report, by the first accuser");
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
    // The cheat's 0.01 SOL stake was taken and went back to the requester.
    assert!(
        field(&status, "slashed").contains("10000000 lamports"),
        "{status}"
    );
    let (owed, paid, _) = spend(&status);
    assert_eq!(paid, claimed, "{status}");
    assert!(paid <= owed, "{status}");
    let _ = chain.child.kill();
}
