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

/// Three free consecutive TCP ports on loopback for the P2P layer.
fn p2p_base() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = l.local_addr().unwrap().port();
        drop(l);
        if base < 65000
            && (1..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return base;
        }
    }
}

#[test]
fn three_nodes_train_attest_and_get_paid_through_an_rpc_outage() {
    let h = home("e2e");
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
            "12",
            "--min-nodes",
            "3",
            "--max-nodes",
            "4",
            "--id",
            "1",
        ],
    ));
    let job = created.split_whitespace().nth(1).unwrap().to_string();
    let base = p2p_base().to_string();
    let nodes: Vec<Proc> = (0..3)
        .map(|i| {
            let nh = h.join(format!("node{i}"));
            Proc::spawn(
                &nh,
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
                ],
            )
        })
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
    let models: Vec<&str> = done
        .iter()
        .map(|d| d.rsplit("models ").next().unwrap())
        .collect();
    assert!(models.iter().all(|m| *m == models[0]), "{done:?}");
    assert_eq!(models[0].split(',').count(), 2, "{done:?}");
    let mut claimed = 0u64;
    for d in &done {
        assert!(d.contains("trained 2 epochs"), "{d}");
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
    let spend = field(&status, "spend");
    let nums: Vec<u64> = spend
        .split("lamports: ")
        .nth(1)
        .unwrap()
        .trim_end_matches(')')
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect();
    let (owed, paid, refunded) = (nums[0], nums[1], nums[2]);
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
            "60",
            "--min-nodes",
            "3",
            "--max-nodes",
            "3",
            "--id",
            "1",
        ],
    ));
    let job = created.split_whitespace().nth(1).unwrap().to_string();
    let base = p2p_base().to_string();
    let args = |i: usize| -> (PathBuf, Vec<String>) {
        let nh = h.join(format!("node{i}"));
        let a = [
            "node",
            "--url",
            &url,
            "--job",
            &job,
            "--p2p-port",
            &base,
            "--airdrop",
            "1",
        ];
        (nh, a.iter().map(|s| s.to_string()).collect())
    };
    let spawn = |i: usize| {
        let (nh, a) = args(i);
        Proc::spawn(&nh, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
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
    let models: Vec<&str> = done
        .iter()
        .map(|d| d.rsplit("models ").next().unwrap())
        .collect();
    assert!(models.iter().all(|m| *m == models[0]), "{done:?}");
    let mut claimed = 0u64;
    for d in &done {
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
    let status = ok(&cohort(&h, &["job", "status", &job, "--url", &url]));
    assert!(field(&status, "state").contains("Completed"), "{status}");
    let spend = field(&status, "spend");
    let nums: Vec<u64> = spend
        .split("lamports: ")
        .nth(1)
        .unwrap()
        .trim_end_matches(')')
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect();
    // Everything owed was claimed: no node's claim was refused.
    assert_eq!(nums[0], nums[1], "{status}");
    assert_eq!(nums[1], claimed, "{status}");
}
