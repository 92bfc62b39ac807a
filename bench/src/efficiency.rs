//! `efficiency`: N member processes over libp2p with shaped links, the same
//! processes on plain loopback, and the in-process runner with no network,
//! in one run. Throughput is measured between the warm-up step and the last
//! step (process start-up and connection set-up are excluded from every
//! variant alike).

use crate::args::Args;
use crate::report::{self, Figures};
use anyhow::{Context, Result, bail};
use cohort_engine::backend;
use cohort_engine::data::Corpus;
use cohort_engine::model::ModelConfig;
use cohort_engine::net::peer::{local_job, local_member};
use cohort_engine::net::swarm::peer_id;
use cohort_engine::runner::{Cluster, epoch_seed};
use cohort_engine::trainer::TrainConfig;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

const FLAGS: &[&str] = &[
    "members", "steps", "arch", "batch", "mbit", "rtt-ms", "warmup",
];

struct Settings {
    members: usize,
    steps: u32,
    arch: String,
    batch: usize,
    mbit: f64,
    rtt_ms: u64,
    warmup: u32,
    threads: usize,
}

#[derive(Default, Clone, Copy)]
struct Split {
    compute: f64,
    comm: f64,
    wait: f64,
}

struct Measured {
    tokens_per_sec: f64,
    split: Split,
    bytes_out: f64,
}

fn field(line: &str, key: &str) -> Option<f64> {
    let start = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = line[start..].trim_start_matches('"');
    let end = rest.find(['"', ',', '}']).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn tokens_per_step(s: &Settings) -> Result<f64> {
    let model = ModelConfig::parse(&s.arch)?;
    Ok((s.members * s.batch * model.seq_len) as f64)
}

fn no_network(s: &Settings) -> Result<Measured> {
    let mut train = TrainConfig::small(s.steps);
    train.model = ModelConfig::parse(&s.arch)?;
    train.batch = s.batch;
    train.micro_batch = s.batch;
    let job = local_job("efficiency");
    let corpus = Corpus::bundled()?;
    let engines = (0..s.members).map(|_| backend::cpu()).collect();
    let mut cluster = Cluster::new(train, job, &epoch_seed(&job, u32::MAX), &corpus, engines)?;
    let seed = epoch_seed(&job, 0);
    let mut t0 = Instant::now();
    let mut compute = 0.0;
    for step in 0..s.steps {
        if step == s.warmup {
            t0 = Instant::now();
            compute = 0.0;
        }
        compute += cluster.step(&seed, 0)?.compute_secs;
    }
    let secs = t0.elapsed().as_secs_f64();
    let steps = (s.steps - s.warmup) as f64;
    Ok(Measured {
        tokens_per_sec: tokens_per_step(s)? * steps / secs,
        split: Split {
            compute: compute / steps,
            comm: 0.0,
            wait: 0.0,
        },
        bytes_out: 0.0,
    })
}

fn processes(s: &Settings, shaped: bool) -> Result<Measured> {
    let exe = std::env::current_exe()?;
    let ports: Vec<u16> = (0..s.members)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
        })
        .collect::<std::io::Result<_>>()?;
    let mut children = Vec::new();
    let mut readers = Vec::new();
    for i in 0..s.members {
        let mut c = Command::new(&exe);
        c.env("RAYON_NUM_THREADS", s.threads.to_string())
            .args(["peer", "--job", "efficiency", "--index", &i.to_string()])
            .args(["--members", &s.members.to_string()])
            .args(["--steps", &s.steps.to_string()])
            .args(["--arch", &s.arch, "--batch", &s.batch.to_string()])
            .args(["--listen", &format!("/ip4/127.0.0.1/tcp/{}", ports[i])])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if shaped {
            c.args(["--rate-mbit", &s.mbit.to_string()])
                .args(["--rtt-ms", &s.rtt_ms.to_string()]);
        }
        for (j, p) in ports.iter().enumerate() {
            if j != i {
                let id = peer_id(&local_member(j).1).context("member key")?;
                c.args(["--peer", &format!("/ip4/127.0.0.1/tcp/{p}/p2p/{id}")]);
            }
        }
        let mut child = c.spawn().context("spawning a member process")?;
        let out = child.stdout.take().context("member stdout")?;
        readers.push(std::thread::spawn(move || {
            BufReader::new(out)
                .lines()
                .map_while(std::result::Result::ok)
                .map(|l| (Instant::now(), l))
                .collect::<Vec<_>>()
        }));
        children.push(child);
    }
    let mut logs = Vec::new();
    for (mut c, r) in children.into_iter().zip(readers) {
        let status = c.wait()?;
        let lines = r.join().map_err(|_| anyhow::anyhow!("reader panicked"))?;
        if !status.success() {
            bail!("a member process failed ({status})");
        }
        logs.push(lines);
    }
    // Throughput from member 0's clock between the warm-up and last step.
    let applied = |log: &[(Instant, String)]| -> Vec<(Instant, String)> {
        log.iter()
            .filter(|(_, l)| l.contains(r#""event":"applied""#))
            .cloned()
            .collect()
    };
    let a0 = applied(&logs[0]);
    let at = |step: u32| {
        a0.iter()
            .find(|(_, l)| field(l, "step") == Some(step as f64))
            .map(|(t, _)| *t)
    };
    let (Some(t0), Some(t1)) = (at(s.warmup - 1), at(s.steps - 1)) else {
        bail!("member 0 did not report every step");
    };
    let steps = (s.steps - s.warmup) as f64;
    let mut split = Split::default();
    let mut count = 0.0;
    let mut hashes = std::collections::BTreeSet::new();
    let mut bytes_out = 0.0;
    for log in &logs {
        for (_, l) in applied(log) {
            if field(&l, "step").unwrap_or(0.0) >= s.warmup as f64 {
                split.compute += field(&l, "compute").unwrap_or(0.0);
                split.comm += field(&l, "comm").unwrap_or(0.0);
                split.wait += field(&l, "wait").unwrap_or(0.0);
                count += 1.0;
            }
        }
        if let Some((_, done)) = log.iter().find(|(_, l)| l.contains(r#""event":"done""#)) {
            let h = done
                .find("\"hash\":\"")
                .map(|i| done[i + 8..i + 72].to_string());
            hashes.insert(h);
            bytes_out += field(done, "bytes_out").unwrap_or(0.0);
        }
    }
    if hashes.len() != 1 {
        bail!("members ended with different model hashes: {hashes:?}");
    }
    split.compute /= count;
    split.comm /= count;
    split.wait /= count;
    Ok(Measured {
        tokens_per_sec: tokens_per_step(s)? * steps / (t1 - t0).as_secs_f64(),
        split,
        bytes_out: bytes_out / (s.members as f64 * s.steps as f64),
    })
}

pub fn run(raw: &[String]) -> Result<()> {
    let a = Args::parse(raw, FLAGS)?;
    let members: usize = a.get("members", 4)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let s = Settings {
        members,
        steps: a.get("steps", 30)?,
        arch: a.get("arch", "gpt l2 d128 h4 s64".to_string())?,
        batch: a.get("batch", 8)?,
        mbit: a.get("mbit", 100.0)?,
        rtt_ms: a.get("rtt-ms", 50)?,
        warmup: a.get("warmup", 3)?,
        threads: (cores / members.max(1)).max(1),
    };
    if s.members < 2 || s.warmup == 0 || s.warmup + 2 > s.steps {
        bail!("need --members ≥ 2 and 1 ≤ --warmup ≤ --steps − 2");
    }
    println!(
        "efficiency: {} members × {} steps of `{}` batch {}, shaped links {} Mbit/s and {} ms RTT, {} thread(s) per process on {cores} cores",
        s.members, s.steps, s.arch, s.batch, s.mbit, s.rtt_ms, s.threads
    );
    println!("in-process runner, no network …");
    let base = no_network(&s)?;
    println!("processes on plain loopback …");
    let plain = processes(&s, false)?;
    println!("processes with shaped links …");
    let shaped = processes(&s, true)?;
    let mut md = format!(
        "## Throughput efficiency over libp2p\n\n`cargo run --release -p cohort-bench -- efficiency`: {} member processes, `{}`, batch {} per member, {} steps ({} warm-up excluded), shaped links {} Mbit/s per peer and {} ms RTT inside the transport; {} CPU thread(s) per process on a {cores}-core machine.\n\n| variant | tokens/s | efficiency (÷ no network) | compute s/step | exposed comm s/step | waiting s/step | bytes sent / member / step |\n|---|---|---|---|---|---|---|\n",
        s.members, s.arch, s.batch, s.steps, s.warmup, s.mbit, s.rtt_ms, s.threads
    );
    println!(
        "\n| variant | tokens/s | efficiency | compute s | comm s | wait s | B sent/member/step |"
    );
    for (label, m) in [
        ("in-process, no network", &base),
        ("processes, loopback", &plain),
        ("processes, shaped", &shaped),
    ] {
        let line = format!(
            "| {label} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} |",
            m.tokens_per_sec,
            m.tokens_per_sec / base.tokens_per_sec,
            m.split.compute,
            m.split.comm,
            m.split.wait,
            m.bytes_out
        );
        println!("{line}");
        md.push_str(&line);
        md.push('\n');
    }
    let eff = shaped.tokens_per_sec / base.tokens_per_sec;
    md.push_str(&format!(
        "\nGoal ≥ 0.95 shaped ÷ no network: {} ({eff:.3}). The seed's deployment reached 0.85 of a same-rack cluster.\n",
        if eff >= 0.95 { "met" } else { "not met" }
    ));
    let mut f = Figures::default();
    f.num("members", s.members as f64)
        .num("steps", s.steps as f64)
        .text("arch", &s.arch)
        .num("batch", s.batch as f64)
        .num("mbit", s.mbit)
        .num("rtt_ms", s.rtt_ms as f64)
        .num("threads_per_process", s.threads as f64)
        .num("tokens_per_sec_no_network", base.tokens_per_sec)
        .num("tokens_per_sec_loopback", plain.tokens_per_sec)
        .num("tokens_per_sec_shaped", shaped.tokens_per_sec)
        .num(
            "efficiency_loopback",
            plain.tokens_per_sec / base.tokens_per_sec,
        )
        .num("efficiency_shaped", eff)
        .num("shaped_compute_secs", shaped.split.compute)
        .num("shaped_comm_secs", shaped.split.comm)
        .num("shaped_wait_secs", shaped.split.wait)
        .num("bytes_sent_per_member_step", shaped.bytes_out);
    report::publish("efficiency", &f, &md)
}
