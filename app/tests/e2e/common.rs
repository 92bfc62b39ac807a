//! What the end-to-end tests share: a scratch home per test, the
//! `cohort` binary as child processes, readers for its output, and the
//! two cores.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// The machine's cores, shared by the tests of this binary (they run on
/// as many threads as there are cores).
static CORES: RwLock<()> = RwLock::new(());

/// For a test that needs the cores to itself: the fraud test's audits need
/// steps where most members' payloads arrive in time, and the GUI's sandbox
/// trains three nodes inside the test process.
pub fn cores_alone() -> RwLockWriteGuard<'static, ()> {
    CORES.write().unwrap_or_else(|e| e.into_inner())
}

/// For a test that may share the cores with others like it.
pub fn cores_shared() -> RwLockReadGuard<'static, ()> {
    CORES.read().unwrap_or_else(|e| e.into_inner())
}

pub const BIN: &str = env!("CARGO_BIN_EXE_cohort");

pub fn home(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cohort-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A child whose stdout lines are collected as they come.
pub struct Proc {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(home: &Path, args: &[&str]) -> Self {
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

    pub fn wait_for(&self, what: &str, limit: Duration) -> String {
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

    pub fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn localnet(home: &Path) -> (Proc, String) {
    let p = Proc::spawn(home, &["localnet", "--port", "0"]);
    let line = p.wait_for("JSON-RPC at", Duration::from_secs(60));
    let url = line.rsplit(' ').next().unwrap().to_string();
    (p, url)
}

pub fn cohort(home: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("COHORT_HOME", home)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Fails, with exactly one line on stderr containing `want`.
pub fn fails(o: &Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(want), "`{want}` not in: {err}");
}

pub fn field(status: &str, key: &str) -> String {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .to_string()
}

/// Four free consecutive TCP ports on loopback for the P2P layer.
pub fn p2p_base() -> u16 {
    cohort_engine::net::ports::free_base(4).expect("four free loopback ports")
}

/// Funds the requester and posts a two-epoch job; returns its address.
pub fn post_job(h: &Path, url: &str, steps_per_epoch: &str, max_nodes: &str) -> String {
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
pub fn spawn_node(h: &Path, i: usize, url: &str, job: &str, base: &str) -> Proc {
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
pub fn same_models_all_paid(done: &[String]) -> (String, u64) {
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
pub fn spend(status: &str) -> (u64, u64, u64) {
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
