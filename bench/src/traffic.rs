//! `traffic`: what one member sends and receives per step on the
//! all-to-all exchange (the baseline) and on the sharded one, measured on
//! real member processes over shaped loopback links: same job, model,
//! steps, links and threads, repeated with the variants interleaved, and
//! set against the payload's size, the unit of the issue's goal ("about
//! three payloads plus one aggregate, whatever the member count").

use crate::args::Args;
use crate::peers;
use crate::report::{self, Figures};
use anyhow::{Context, Result, bail};
use cohort_engine::compress::Layout;
use cohort_engine::model::ModelConfig;
use cohort_engine::trainer::TrainConfig;
use cohort_engine::{shard, wire};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

const FLAGS: &[&str] = &[
    "members",
    "steps",
    "arch",
    "batch",
    "shards",
    "redundancy",
    "mbit",
    "rtt-ms",
    "repeats",
];

struct Settings {
    members: usize,
    steps: u32,
    arch: String,
    batch: usize,
    shards: usize,
    redundancy: usize,
    mbit: f64,
    rtt_ms: u64,
}

/// One run: per member and step, the bytes its TCP connections carried
/// each way (every protocol and frame) and the bytes of the messages its
/// node sent and received (gossip it published or took, requests, answers);
/// seconds per step on member 0's clock from its first applied step to its
/// last.
struct Run {
    wire_up: Vec<f64>,
    wire_down: Vec<f64>,
    up: Vec<f64>,
    down: Vec<f64>,
    secs_per_step: f64,
}

fn num(line: &str, key: &str) -> Option<f64> {
    peers::field(line, key)?.parse().ok()
}

fn run_once(s: &Settings, sharded: bool, libp2p_signed: bool) -> Result<Run> {
    let exe = std::env::current_exe()?;
    let ports = peers::free_ports(s.members)?;
    let mut children = Vec::new();
    let mut readers = Vec::new();
    for i in 0..s.members {
        let mut c = Command::new(&exe);
        c.env("RAYON_NUM_THREADS", "1")
            .args(["peer", "--job", "traffic", "--index", &i.to_string()])
            .args(["--members", &s.members.to_string()])
            .args(["--steps", &s.steps.to_string()])
            .args(["--arch", &s.arch, "--batch", &s.batch.to_string()])
            .args(["--rate-mbit", &s.mbit.to_string()])
            .args(["--rtt-ms", &s.rtt_ms.to_string()])
            .args(["--listen", &format!("/ip4/127.0.0.1/tcp/{}", ports[i])])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if sharded {
            c.args(["--shards", &s.shards.to_string()])
                .args(["--redundancy", &s.redundancy.to_string()]);
        } else {
            // Whatever the member count would choose.
            c.args(["--shards", "0"]);
        }
        if libp2p_signed {
            c.args(["--gossip-signing", "libp2p"]);
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
    let steps = f64::from(s.steps);
    let (mut up, mut down) = (Vec::new(), Vec::new());
    let (mut wire_up, mut wire_down) = (Vec::new(), Vec::new());
    let mut hashes = std::collections::BTreeSet::new();
    for log in &logs {
        let (_, done) = log
            .iter()
            .find(|(_, l)| l.contains(r#""event":"done""#))
            .context("a member printed no done line")?;
        if num(done, "applied") != Some(steps) {
            bail!("a member did not apply every step: {done}");
        }
        hashes.insert(peers::field(done, "hash").unwrap_or_default().to_string());
        up.push(num(done, "bytes_out").context("bytes_out")? / steps);
        down.push(num(done, "bytes_in").context("bytes_in")? / steps);
        wire_up.push(num(done, "wire_out").context("wire_out")? / steps);
        wire_down.push(num(done, "wire_in").context("wire_in")? / steps);
    }
    if hashes.len() != 1 {
        bail!("members ended with different model hashes: {hashes:?}");
    }
    let applied: Vec<Instant> = logs[0]
        .iter()
        .filter(|(_, l)| l.contains(r#""event":"applied""#))
        .map(|(t, _)| *t)
        .collect();
    let secs_per_step = match (applied.first(), applied.last()) {
        (Some(a), Some(b)) if applied.len() > 1 => {
            (*b - *a).as_secs_f64() / (applied.len() - 1) as f64
        }
        _ => f64::NAN,
    };
    Ok(Run {
        wire_up,
        wire_down,
        up,
        down,
        secs_per_step,
    })
}

/// Mean over every member of every repeat, and the smallest and largest
/// single member.
fn over_members(runs: &[Run], of: fn(&Run) -> &Vec<f64>) -> (f64, f64, f64) {
    let all: Vec<f64> = runs.iter().flat_map(|r| of(r).iter().copied()).collect();
    report::spread(&all)
}

pub fn run(raw: &[String]) -> Result<()> {
    let a = Args::parse(raw, FLAGS)?;
    let members: usize = a.get("members", 8)?;
    let mut s = Settings {
        members,
        steps: a.get("steps", 6)?,
        // A model whose payload (28 kB) outweighs the gossip a step carries;
        // one sequence a member, so 8 processes share 2 cores tolerably.
        arch: a.get("arch", "gpt l4 d512 h8 s64".to_string())?,
        batch: a.get("batch", 1)?,
        // 0: the node's rule for this many members (`exchange::shard_count`).
        shards: a.get("shards", 0)?,
        redundancy: a.get("redundancy", 2)?,
        mbit: a.get("mbit", 100.0)?,
        rtt_ms: a.get("rtt-ms", 20)?,
    };
    let repeats: usize = a.get("repeats", 3)?;
    if s.members < 2 || s.steps < 2 || repeats == 0 {
        bail!("need --members ≥ 2, --steps ≥ 2 and --repeats ≥ 1");
    }
    if s.redundancy == 0 || s.redundancy > s.members {
        bail!("--redundancy must be 1 to --members");
    }
    let model = ModelConfig::parse(&s.arch)?;
    let shapes: Vec<Vec<usize>> = model.shapes().into_iter().map(|(_, v)| v).collect();
    // The members' rule: the job recipe's (what `cohort-bench peer` trains).
    let layout = Layout::new(&shapes, &TrainConfig::small(s.steps).compress);
    if s.shards == 0 {
        s.shards = cohort_engine::net::exchange::shard_count(s.members, &layout)
            .context("no shard count cuts this model into slices that fit")?;
    }
    // A signed contribution: header, payload, signature.
    let payload = (wire::HEADER_LEN + wire::payload_len(&layout) + 64) as f64;
    let positions: usize = shard::split(&layout, s.shards)?
        .iter()
        .map(|x| x.positions)
        .sum();
    // The aggregate: every shard's sums at the width the members' votes
    // need (one vote each: ±members).
    let members_i32 = i32::try_from(s.members)?;
    let aggregate = shard::pack_sums(&vec![members_i32; positions]).len() as f64;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "traffic: {} members × {} steps of `{}` batch {}, {} shards × {} seats, {} Mbit/s and {} ms per link, {repeats} interleaved repeats on {cores} cores; payload {payload:.0} B, aggregate {aggregate:.0} B",
        s.members, s.steps, s.arch, s.batch, s.shards, s.redundancy, s.mbit, s.rtt_ms
    );
    // The third variant is the sharded exchange with gossip signed by
    // gossipsub as well, as before message version 8: what dropping that
    // signature saves, measured in the same run.
    let variants = [
        ("all-to-all (baseline)", "all_to_all", false, false),
        ("sharded", "sharded", true, false),
        (
            "sharded, gossip signed by gossipsub too (before message version 8)",
            "sharded_libp2p_signed",
            true,
            true,
        ),
    ];
    let mut runs: Vec<Vec<Run>> = variants.iter().map(|_| Vec::new()).collect();
    for r in 0..repeats {
        for (i, (label, _, sharded, signed)) in variants.iter().enumerate() {
            println!("repeat {}/{repeats}: {label} …", r + 1);
            runs[i]
                .push(run_once(&s, *sharded, *signed).with_context(|| format!("variant {label}"))?);
        }
    }
    let mut f = Figures::default();
    f.num("members", s.members as f64)
        .num("steps", f64::from(s.steps))
        .text("arch", &s.arch)
        .num("batch", s.batch as f64)
        .num("shards", s.shards as f64)
        .num("redundancy", s.redundancy as f64)
        .num("mbit", s.mbit)
        .num("rtt_ms", s.rtt_ms as f64)
        .num("repeats", repeats as f64)
        .num("cores", cores as f64)
        .num("payload_bytes", payload)
        .num("aggregate_bytes", aggregate);
    let mut md = format!(
        "## Traffic per member per step: all-to-all vs sharded\n\n`cargo run --release -p cohort-bench -- traffic`: {} member processes of `{}` (batch {}) on loopback, every link shaped to {} Mbit/s and {} ms round trip, {} steps; the sharded exchange with {} shards and {} seats a shard; {repeats} repeats, the variants interleaved (the third is the sharded exchange with every gossip message also signed by gossipsub, with its author and sequence number, as the node did before message version 8: our own signed envelope already covers every message). *On the wire* is every byte a member's TCP connections carried (gossip relayed for others, libp2p's framing, encryption, identify, ping and the DHT included); *messages* is what its node counted of its own: gossip it published or took in, requests, answers. The unit is one signed contribution ({payload:.0} B); one aggregate (every shard's sums, at the width {} one-vote members need) is {aggregate:.0} B. Figures are per member per step: the mean over every member of every repeat, in payloads (smallest–largest member). {cores} cores run all {} processes, so seconds per step show compute contention more than the links; gossip that comes with time (heartbeats every 0.5 s from every member, gossipsub's own control messages, each relayed by several mesh peers) grows with them.\n\n| exchange | on the wire, sent | on the wire, received | messages sent | messages received | s / step |\n|---|---|---|---|---|---|\n",
        s.members,
        s.arch,
        s.batch,
        s.mbit,
        s.rtt_ms,
        s.steps,
        s.shards,
        s.redundancy,
        s.members,
        s.members
    );
    println!(
        "\n| exchange | wire sent | wire received | messages sent | messages received | s/step |"
    );
    for ((label, key, _, _), rs) in variants.iter().zip(&runs) {
        let cols: [(&str, (f64, f64, f64)); 4] = [
            ("wire_sent", over_members(rs, |r| &r.wire_up)),
            ("wire_received", over_members(rs, |r| &r.wire_down)),
            ("sent", over_members(rs, |r| &r.up)),
            ("received", over_members(rs, |r| &r.down)),
        ];
        let secs = report::spread(&rs.iter().map(|r| r.secs_per_step).collect::<Vec<_>>());
        let cell = |(mean, min, max): (f64, f64, f64)| {
            format!(
                "{} = {:.2} ({:.2}–{:.2})",
                report::fmt_bytes(mean),
                mean / payload,
                min / payload,
                max / payload
            )
        };
        let line = format!(
            "| {label} | {} | {} | {} | {} | {:.2} ({:.2}–{:.2}) |",
            cell(cols[0].1),
            cell(cols[1].1),
            cell(cols[2].1),
            cell(cols[3].1),
            secs.0,
            secs.1,
            secs.2
        );
        println!("{line}");
        md.push_str(&line);
        md.push('\n');
        for (what, (mean, min, max)) in cols {
            f.num(&format!("{key}_{what}_bytes_per_member_step_mean"), mean)
                .num(&format!("{key}_{what}_bytes_per_member_step_min"), min)
                .num(&format!("{key}_{what}_bytes_per_member_step_max"), max)
                .num(
                    &format!("{key}_{what}_payloads_per_member_step_mean"),
                    mean / payload,
                );
        }
        f.num(&format!("{key}_secs_per_step_mean"), secs.0)
            .num(&format!("{key}_secs_per_step_min"), secs.1)
            .num(&format!("{key}_secs_per_step_max"), secs.2);
    }
    md.push_str(&format!(
        "\nThe issue's goal, per member per step whatever the member count: about three payloads plus one aggregate ({:.2} payloads here) each way. The all-to-all exchange moves members − 1 = {} payloads each way on average; the sharded one's figure should not grow with the member count (run it with another `--members` to see).\n",
        3.0 + aggregate / payload,
        s.members - 1
    ));
    report::publish("traffic", &f, &md)
}
