//! `efficiency`: member processes over libp2p with shaped links against the
//! same processes on plain loopback (the baseline: same pipelined schedule,
//! same threads, members ≤ cores), repeated and interleaved. Throughput is
//! measured between the warm-up step and the last step (process start-up
//! and connection set-up are excluded from every variant alike).

use crate::args::Args;
use crate::peers;
use crate::report::{self, Figures};
use anyhow::{Context, Result, bail};
use cohort_engine::model::ModelConfig;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

const FLAGS: &[&str] = &[
    "members",
    "steps",
    "arch",
    "batch",
    "mbit",
    "rtt-ms",
    "slow-rtt-ms",
    "warmup",
    "repeats",
];

struct Settings {
    members: usize,
    steps: u32,
    arch: String,
    batch: usize,
    warmup: u32,
    threads: usize,
}

/// A link every member process gets: `None` is plain loopback.
#[derive(Clone, Copy)]
struct Link {
    mbit: f64,
    rtt_ms: u64,
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
    peers::field(line, key)?.parse().ok()
}

fn tokens_per_step(s: &Settings) -> Result<f64> {
    let model = ModelConfig::parse(&s.arch)?;
    Ok((s.members * s.batch * model.seq_len) as f64)
}

fn processes(s: &Settings, link: Option<Link>) -> Result<Measured> {
    let exe = std::env::current_exe()?;
    let ports = peers::free_ports(s.members)?;
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
        if let Some(l) = link {
            c.args(["--rate-mbit", &l.mbit.to_string()])
                .args(["--rtt-ms", &l.rtt_ms.to_string()]);
        }
        peers::dial_others(&mut c, &ports, i)?;
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

/// Mean, smallest and largest of repeated figures.
#[derive(Clone, Copy)]
struct Spread {
    mean: f64,
    min: f64,
    max: f64,
}

fn spread(xs: &[f64]) -> Spread {
    Spread {
        mean: xs.iter().sum::<f64>() / xs.len() as f64,
        min: xs.iter().copied().fold(f64::INFINITY, f64::min),
        max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = f.precision().unwrap_or(3);
        write!(f, "{:.p$} ({:.p$}–{:.p$})", self.mean, self.min, self.max)
    }
}

/// One variant's repeats: throughput, and each repeat's ratio to the
/// baseline run just before it.
struct Row {
    label: String,
    key: &'static str,
    link: Option<Link>,
    runs: Vec<Measured>,
    ratios: Vec<f64>,
}

pub fn run(raw: &[String]) -> Result<()> {
    let a = Args::parse(raw, FLAGS)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // As many members as cores: one process per core, the baseline's too,
    // so waiting for the network is never hidden behind another member.
    let members: usize = a.get("members", cores.max(2))?;
    let s = Settings {
        members,
        steps: a.get("steps", 40)?,
        arch: a.get("arch", "gpt l2 d128 h4 s64".to_string())?,
        // A step's compute well above the round trip, as in real jobs
        // (seconds per step); the slow-round-trip row shows the other case.
        batch: a.get("batch", 32)?,
        warmup: a.get("warmup", 3)?,
        threads: (cores / members.max(1)).max(1),
    };
    let repeats: usize = a.get("repeats", 3)?;
    let home = Link {
        mbit: a.get("mbit", 100.0)?,
        rtt_ms: a.get("rtt-ms", 50)?,
    };
    // 0: a round trip as long as the baseline's compute per step.
    let slow_rtt: u64 = a.get("slow-rtt-ms", 0)?;
    if s.members < 2 || s.warmup == 0 || s.warmup + 2 > s.steps || repeats == 0 {
        bail!("need --members ≥ 2, 1 ≤ --warmup ≤ --steps − 2 and --repeats ≥ 1");
    }
    println!(
        "efficiency: {} members × {} steps of `{}` batch {}, {} thread(s) per process on {cores} cores, {repeats} interleaved repeats",
        s.members, s.steps, s.arch, s.batch, s.threads
    );
    let mut rows = vec![
        Row {
            label: "loopback (baseline)".into(),
            key: "baseline",
            link: None,
            runs: vec![],
            ratios: vec![],
        },
        Row {
            label: format!("{} Mbit/s, {} ms RTT", home.mbit, home.rtt_ms),
            key: "home",
            link: Some(home),
            runs: vec![],
            ratios: vec![],
        },
    ];
    for r in 0..repeats {
        let mut i = 0;
        while i < rows.len() {
            let label = rows[i].label.clone();
            println!("repeat {}/{repeats}: {label} …", r + 1);
            let m = processes(&s, rows[i].link).with_context(|| format!("variant {label}"))?;
            // The baseline is 1 by definition; its spread shows in tokens/s.
            let base = match i {
                0 => m.tokens_per_sec,
                _ => rows[0]
                    .runs
                    .last()
                    .map_or(m.tokens_per_sec, |b| b.tokens_per_sec),
            };
            rows[i].ratios.push(m.tokens_per_sec / base);
            rows[i].runs.push(m);
            if r == 0 && i == 0 {
                // The round trip comparable to compute, from the first baseline.
                let rtt_ms = if slow_rtt > 0 {
                    slow_rtt
                } else {
                    ((rows[0].runs[0].split.compute * 1000.0).round() as u64).max(1)
                };
                rows.push(Row {
                    label: format!(
                        "{} Mbit/s, {rtt_ms} ms RTT{}",
                        home.mbit,
                        if slow_rtt == 0 {
                            " (≈ compute per step)"
                        } else {
                            ""
                        }
                    ),
                    key: "slow",
                    link: Some(Link {
                        mbit: home.mbit,
                        rtt_ms,
                    }),
                    runs: vec![],
                    ratios: vec![],
                });
            }
            i += 1;
        }
    }
    let mut md = format!(
        "## Throughput efficiency over libp2p\n\n`cargo run --release -p cohort-bench -- efficiency`: {} member processes, `{}`, batch {} per member, {} steps ({} warm-up excluded), {} CPU thread(s) per process on a {cores}-core machine; {repeats} repeats, variants interleaved within each repeat. The baseline is the same processes on plain loopback: the same pipelined schedule (step t+1 computes while step t is exchanged), the same threads, one process per core. Links are shaped inside the transport (rate per peer, half the round trip each way). Each repeat's efficiency is its throughput over the baseline run just before it; figures are mean (min–max).\n\n| variant | tokens/s | efficiency (÷ baseline) | compute s/step | exposed comm s/step | waiting s/step | bytes sent / member / step |\n|---|---|---|---|---|---|---|\n",
        s.members, s.arch, s.batch, s.steps, s.warmup, s.threads
    );
    println!(
        "\n| variant | tokens/s | efficiency | compute s | comm s | wait s | B sent/member/step |"
    );
    let mut f = Figures::default();
    f.num("members", s.members as f64)
        .num("steps", s.steps as f64)
        .num("warmup_steps", s.warmup as f64)
        .text("arch", &s.arch)
        .num("batch", s.batch as f64)
        .num("threads_per_process", s.threads as f64)
        .num("cores", cores as f64)
        .num("repeats", repeats as f64)
        .num("home_mbit", home.mbit)
        .num("home_rtt_ms", home.rtt_ms as f64);
    for row in &rows {
        let tps = spread(
            &row.runs
                .iter()
                .map(|m| m.tokens_per_sec)
                .collect::<Vec<_>>(),
        );
        let eff = spread(&row.ratios);
        let mean =
            |g: fn(&Measured) -> f64| row.runs.iter().map(g).sum::<f64>() / row.runs.len() as f64;
        let (compute, comm, wait, bytes) = (
            mean(|m| m.split.compute),
            mean(|m| m.split.comm),
            mean(|m| m.split.wait),
            mean(|m| m.bytes_out),
        );
        let line = format!(
            "| {} | {tps:.0} | {eff:.3} | {compute:.3} | {comm:.3} | {wait:.3} | {bytes:.0} |",
            row.label
        );
        println!("{line}");
        md.push_str(&line);
        md.push('\n');
        let k = row.key;
        if let Some(l) = row.link.filter(|_| k == "slow") {
            f.num("slow_rtt_ms", l.rtt_ms as f64);
        }
        f.num(&format!("{k}_tokens_per_sec_mean"), tps.mean)
            .num(&format!("{k}_tokens_per_sec_min"), tps.min)
            .num(&format!("{k}_tokens_per_sec_max"), tps.max)
            .num(&format!("{k}_efficiency_mean"), eff.mean)
            .num(&format!("{k}_efficiency_min"), eff.min)
            .num(&format!("{k}_efficiency_max"), eff.max)
            .num(&format!("{k}_compute_secs"), compute)
            .num(&format!("{k}_comm_secs"), comm)
            .num(&format!("{k}_wait_secs"), wait)
            .num(&format!("{k}_bytes_sent_per_member_step"), bytes);
    }
    let eff = spread(&rows[1].ratios);
    md.push_str(&format!(
        "\nGoal ≥ 0.95 of the baseline at {} Mbit/s and {} ms: {} (mean {:.3}, worst repeat {:.3}). The seed's deployment reached 0.85 of a same-rack cluster. The slow-round-trip row shows where the one-step-stale pipeline stops hiding the exchange.\n",
        home.mbit,
        home.rtt_ms,
        if eff.mean >= 0.95 { "met" } else { "not met" },
        eff.mean,
        eff.min
    ));
    report::publish("efficiency", &f, &md)
}
