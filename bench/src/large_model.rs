//! `large-model`: a job on a model of about 100 M parameters as three
//! member processes on loopback. Two start; the third joins late and
//! downloads the state; payloads larger than one response travel in parts.
//! Each process's peak memory is set against the model's size, twice in one
//! run: with states and momenta kept on disk (what ships) and kept in
//! memory (the baseline), same job, same settings, one after the other.

use crate::args::Args;
use crate::peers::{self, field};
use crate::report::{self, Figures};
use anyhow::{Context, Result, bail};
use cohort_engine::compress::{CompressConfig, Layout};
use cohort_engine::model::ModelConfig;
use cohort_engine::wire;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const FLAGS: &[&str] = &["arch", "topk", "steps", "batch", "join-at"];
const MEMBERS: usize = 3;
const JOINER: usize = MEMBERS - 1;

struct Settings {
    arch: String,
    topk: usize,
    steps: u32,
    batch: usize,
    join_at: u32,
}

/// One member's `done` line, and whether (and where) it synced.
struct Member {
    peak_rss_kib: f64,
    bytes_in: f64,
    hash: String,
    applied: f64,
    synced: Option<u32>,
}

struct Job {
    members: Vec<Member>,
    secs: f64,
}

fn num(line: &str, key: &str) -> f64 {
    field(line, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A member process and the lines it printed so far.
struct Running {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

fn spawn(s: &Settings, i: usize, ports: &[u16], spill_above: u64) -> Result<Running> {
    let mut c = Command::new(std::env::current_exe()?);
    c.env("RAYON_NUM_THREADS", "1")
        .args(["peer", "--job", "large-model", "--index", &i.to_string()])
        .args(["--members", &MEMBERS.to_string()])
        .args(["--steps", &s.steps.to_string()])
        .args(["--arch", &s.arch, "--batch", &s.batch.to_string()])
        // The rule the published figures were measured under (the peers'
        // default is now the shared rule).
        .args(["--select", "topk", "--topk", &s.topk.to_string()])
        .args(["--spill-above", &spill_above.to_string()])
        // One step of a 100 M model takes seconds on a CPU: the leader
        // waits for the others' payloads as long as a step takes.
        .args(["--collect-ms", "20000", "--fallback-ms", "10000"])
        .args(["--silent-ms", "60000", "--request-ms", "20000"])
        .args(["--listen", &format!("/ip4/127.0.0.1/tcp/{}", ports[i])])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if i == JOINER {
        c.arg("--join");
    } else {
        c.args(["--min-peers", "1"]);
    }
    peers::dial_others(&mut c, ports, i)?;
    let mut child = c.spawn().context("spawning a member process")?;
    let out = child.stdout.take().context("member stdout")?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(out)
            .lines()
            .map_while(std::result::Result::ok)
        {
            sink.lock().unwrap_or_else(|e| e.into_inner()).push(l);
        }
    });
    Ok(Running {
        child,
        lines,
        reader,
    })
}

fn applied(lines: &Mutex<Vec<String>>) -> Option<u32> {
    lines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|l| l.contains(r#""event":"applied""#))
        .filter_map(|l| field(l, "step")?.parse().ok())
        .max()
}

/// Runs the job once; members 0 and 1 from the start, the joiner once
/// member 0 has applied step `join_at`.
fn job(s: &Settings, spill_above: u64) -> Result<Job> {
    let ports = peers::free_ports(MEMBERS)?;
    let started = Instant::now();
    let mut running = vec![
        spawn(s, 0, &ports, spill_above)?,
        spawn(s, 1, &ports, spill_above)?,
    ];
    let patience = Duration::from_secs(1800);
    while applied(&running[0].lines).is_none_or(|a| a < s.join_at) {
        if started.elapsed() > patience || running[0].child.try_wait()?.is_some() {
            for r in running.iter_mut() {
                let _ = r.child.kill();
            }
            bail!("member 0 did not reach step {} (or exited)", s.join_at);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "  member 0 applied step {} after {:.0} s: the joiner starts",
        s.join_at,
        started.elapsed().as_secs_f64()
    );
    running.push(spawn(s, JOINER, &ports, spill_above)?);
    let mut members = Vec::new();
    for r in running {
        let Running {
            mut child,
            lines,
            reader,
        } = r;
        let status = child.wait()?;
        let _ = reader.join();
        let lines = lines.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !status.success() {
            bail!("a member process failed ({status})");
        }
        let done = lines
            .iter()
            .find(|l| l.contains(r#""event":"done""#))
            .context("a member printed no done line")?;
        let synced = lines
            .iter()
            .find(|l| l.contains(r#""event":"synced""#))
            .and_then(|l| field(l, "step")?.parse().ok());
        members.push(Member {
            peak_rss_kib: num(done, "peak_rss_kib"),
            bytes_in: num(done, "bytes_in"),
            hash: field(done, "hash").unwrap_or("?").to_string(),
            applied: num(done, "applied"),
            synced,
        });
    }
    if members.iter().any(|m| m.hash != members[0].hash) {
        bail!(
            "members ended with different model hashes: {:?}",
            members.iter().map(|m| &m.hash).collect::<Vec<_>>()
        );
    }
    if members[JOINER].synced.is_none() {
        bail!("the late joiner never synced the state");
    }
    Ok(Job {
        members,
        secs: started.elapsed().as_secs_f64(),
    })
}

pub fn run(raw: &[String]) -> Result<()> {
    let a = Args::parse(raw, FLAGS)?;
    let s = Settings {
        arch: a.get("arch", "gpt l8 d1024 h16 s64".to_string())?,
        topk: a.get("topk", 32)?,
        steps: a.get("steps", 6)?,
        batch: a.get("batch", 1)?,
        join_at: a.get("join-at", 2)?,
    };
    if s.join_at + 2 > s.steps {
        bail!(
            "--join-at {} leaves the joiner no step to contribute to in --steps {}",
            s.join_at,
            s.steps
        );
    }
    let model = ModelConfig::parse(&s.arch)?;
    let params = model.num_params() as f64;
    let shapes: Vec<Vec<usize>> = model.shapes().into_iter().map(|(_, s)| s).collect();
    let layout = Layout::new(
        &shapes,
        &CompressConfig {
            topk: s.topk,
            ..CompressConfig::default()
        },
    );
    let payload = wire::payload_len(&layout) as f64;
    let model_mb = 4.0 * params / 1e6;
    println!(
        "large-model: {} ({:.1} M params, {model_mb:.0} MB of f32 weights), top-{} payloads of {}, \
         {MEMBERS} processes, {} steps, the joiner after step {}",
        s.arch,
        params / 1e6,
        s.topk,
        report::fmt_bytes(payload),
        s.steps,
        s.join_at
    );
    let variants = [("disk", 16u64 << 20), ("memory", u64::MAX)];
    let mut f = Figures::default();
    f.text("arch", &s.arch)
        .num("params", params)
        .num("model_mb", model_mb)
        .num("topk", s.topk as f64)
        .num("payload_bytes", payload)
        .num("members", MEMBERS as f64)
        .num("steps", s.steps as f64)
        .num("batch", s.batch as f64)
        .num("join_at", s.join_at as f64);
    let mut rows = String::new();
    let mut walls = Vec::new();
    for (name, spill) in variants {
        println!("states and momenta kept in {name}");
        let j = job(&s, spill)?;
        for (i, m) in j.members.iter().enumerate() {
            let mb = m.peak_rss_kib * 1024.0 / 1e6;
            println!(
                "  member {i}: peak {mb:.0} MB ({:.2}x the weights), {} in, applied {}{}",
                mb / model_mb,
                report::fmt_bytes(m.bytes_in),
                m.applied,
                m.synced
                    .map_or(String::new(), |s| format!(", synced at step {s}"))
            );
            f.num(&format!("{name}_peak_mb_member{i}"), mb)
                .num(&format!("{name}_peak_ratio_member{i}"), mb / model_mb)
                .num(&format!("{name}_bytes_in_member{i}"), m.bytes_in);
            rows.push_str(&format!(
                "| {name} | {i}{} | {mb:.0} | {:.2}× | {} |\n",
                if i == JOINER { " (joined late)" } else { "" },
                mb / model_mb,
                report::fmt_bytes(m.bytes_in)
            ));
        }
        walls.push(format!("{name} {:.0} s", j.secs));
        f.num(&format!("{name}_secs"), j.secs).num(
            &format!("{name}_joiner_synced_at"),
            f64::from(j.members[JOINER].synced.unwrap_or(0)),
        );
    }
    let md = format!(
        "## Large model: {:.1} M parameters across {MEMBERS} processes\n\n\
         `{}`, {} steps of batch {} per member on the CPU, top-{} coefficients per chunk: each \
         payload is {}, more than one {} response, so it travels in parts. Members 0 and 1 \
         start; member 2 starts once member 0 has applied step {} and downloads the state \
         ({}) before contributing. All three end with the same model hash (the command fails \
         otherwise). Peak memory is each process's `VmHWM`; the model's weights are {model_mb:.0} MB. \
         Baseline in the same run: the same job with states and momenta kept in memory.\n\n\
         | kept in | member | peak MB | × weights | received |\n|---|---|---|---|---|\n{rows}\n\
         Each job's wall time, start-up included: {}. Writing a state and a momentum to disk \
         every step is what the disk variant pays for its memory.\n",
        params / 1e6,
        s.arch,
        s.steps,
        s.batch,
        s.topk,
        report::fmt_bytes(payload),
        report::fmt_bytes(cohort_engine::net::msg::PART as f64),
        s.join_at,
        report::fmt_bytes(8.0 * params),
        walls.join(", "),
    );
    report::publish("large-model", &f, &md)
}
