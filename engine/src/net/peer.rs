//! `cohort-peer` / `cohort node --peer-only`: one member of a local job as
//! its own process. Keys and job id derive from names, so every process of
//! a test agrees on them without a chain. Prints one JSON object per line.

use super::msg;
use super::node::{self, NodeConfig, NodeEvent, hex};
use super::shaper::Link;
use super::step::Timing;
use super::swarm::GossipSigning;
use crate::backend::{self, BackendChoice};
use crate::data::Corpus;
use crate::defence::Ground;
use crate::model::ModelConfig;
use crate::runner::{epoch_seed, member_key};
use crate::trainer::TrainConfig;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "usage: cohort-peer --index I --members N [options]

  --job NAME          job name (id = blake3 of it)           [local]
  --steps N           updates to apply, then exit             [20]
  --listen ADDR       multiaddr to listen on                   [/ip4/127.0.0.1/tcp/0]
  --peer ADDR         bootstrap peer (repeatable)
  --checkpoint PATH   save after every step; resume from it
  --join              start by downloading the state from peers
  --arch ARCH         model, e.g. \"gpt l2 d64 h4 s64\"         [tiny]
  --batch B           sequences per member per step           [8]
  --topk K            coefficients sent per 64x64 chunk [61 shared, 4 topk]
  --select RULE       shared (the step's drawn positions, signs only: the
                      job recipe) or topk (each member's largest, with
                      indices, decay 0.9, lr 2e-3: TrainConfig::top_k) [shared]
  --spill-above BYTES keep states and momenta this large on disk [16777216]
  --gossip-signing S  envelope (our signature only) or libp2p (gossipsub's
                      too, as before message version 8; benchmarks) [envelope]
  --rate-mbit X       shape sent bytes to X Mbit/s per peer
  --rtt-ms Y          add Y ms round trip (Y/2 per direction)
  --collect-ms MS     leader's wait for contributions         [3000]
  --fallback-ms MS    extra wait per fall-back leader         [2000]
  --silent-ms MS      a live leader silent this long is replaced [10000]
  --request-ms MS     request deadline before size is counted [5000]
  --min-peers K       peers to wait for before starting        [all]
  --backend B         auto|cpu|wgpu|cuda                      [cpu]
  --witnesses LIST    members that audit and whose accusations count, e.g. 0,1,2
  --quorum Q          accusations that slash a member          [2]
  --audit-rate R      share of unflagged contributions audited  [0.02]
  --chain-rate R      share of those that check the momentum chain too [0]
  --adversary MODE    attack (tests only): sign-flip, noise, scale, alie, ipm,
                      free-rider, copycat, stale, forged-momentum, silent-reveal,
                      lying-leader, stalling, lying-aggregator, withholding,
                      foreign-basis
  --shards S          run the sharded exchange with S shards (0: all-to-all)
                      [by member count: net::exchange::plan_for]
  --redundancy R      aggregators per shard (sharded exchange)  [2]
  --mdns              discover peers on the LAN
  --peer-id-of I      print member I's peer id and exit (I = relay: the relay's)

usage: cohort-peer --relay-server --members N --listen ADDR [--listen ADDR ...]
  runs a local job's relay (circuit relay v2) until killed, for its N
  members only: members behind NAT listen on ADDR/p2p/RELAY/p2p-circuit and
  reach each other through it until DCUtR punches a direct hole. Its key,
  like the members', derives from a public name: for tests, not for a
  relay strangers rely on
";

/// Deterministic identity of member `i` of a local job: (secret, public).
pub fn local_member(i: usize) -> ([u8; 32], [u8; 32]) {
    let secret = member_key(i);
    (secret, msg::keypair(&secret).public().to_bytes())
}

/// Deterministic identity of a local job's relay (secret).
pub fn relay_secret() -> [u8; 32] {
    *blake3::hash(b"cohort-relay").as_bytes()
}

/// The peer id of the local job's relay.
pub fn relay_peer_id() -> libp2p::PeerId {
    super::swarm::peer_id(&msg::keypair(&relay_secret()).public().to_bytes())
        .expect("an ed25519 key")
}

/// Runs the relay until killed, printing one JSON line per listening
/// address (the relay announces them as its own: they are public).
fn relay_server(args: &[String]) -> Result<(), String> {
    use super::swarm::RelayBehaviourEvent;
    use libp2p::futures::StreamExt;
    use libp2p::swarm::SwarmEvent;
    let mut listen = Vec::new();
    let mut members = None;
    let mut it = args.iter().filter(|a| *a != "--relay-server");
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--members" => {
                let v = it.next().ok_or("--members needs a value")?;
                members = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("--members: `{v}` is not a valid number"))?,
                );
            }
            "--listen" => {
                let a = it.next().ok_or("--listen needs a value")?;
                listen.push(
                    a.parse::<libp2p::Multiaddr>()
                        .map_err(|e| format!("`{a}` is not a multiaddr: {e}"))?,
                );
            }
            other => {
                return Err(format!(
                    "unknown flag `{other}` for --relay-server\n{USAGE}"
                ));
            }
        }
    }
    if listen.is_empty() {
        return Err("--relay-server needs --listen ADDR".into());
    }
    let members: Vec<libp2p::PeerId> = (0..members.ok_or("--relay-server needs --members N")?)
        .map(|i| super::swarm::peer_id(&local_member(i).1).ok_or("a member key is not ed25519"))
        .collect::<Result<_, _>>()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut swarm = super::swarm::build_relay(&msg::keypair(&relay_secret()), &members)
            .map_err(|e| e.to_string())?;
        for a in listen {
            swarm
                .listen_on(a.clone())
                .map_err(|e| format!("cannot listen on {a}: {}", super::swarm::describe(&e)))?;
        }
        loop {
            match swarm.select_next_some().await {
                SwarmEvent::NewListenAddr { address, .. } => {
                    swarm.add_external_address(address.clone());
                    line(format!(
                        r#"{{"event":"listening","addr":"{address}","peer":"{}"}}"#,
                        swarm.local_peer_id()
                    ));
                }
                SwarmEvent::Behaviour(RelayBehaviourEvent::Relay(e)) => {
                    tracing::info!(event = ?e, "relay")
                }
                _ => {}
            }
        }
    })
}

pub fn local_job(name: &str) -> [u8; 32] {
    *blake3::hash(format!("cohort-job:{name}").as_bytes()).as_bytes()
}

pub(crate) fn parse(args: &[String]) -> Result<(NodeConfig, BackendChoice), String> {
    let mut index = None;
    let mut members = None;
    let (mut job, mut steps, mut arch, mut batch) = ("local".to_string(), 20u32, None, 8usize);
    let mut listen = Vec::new();
    let mut peers = Vec::new();
    let (mut checkpoint, mut join, mut mdns) = (None, false, false);
    let (mut mbit, mut rtt) = (0.0f64, 0u64);
    let mut timing = Timing::default();
    let mut min_peers = 0usize;
    let mut topk = None;
    let mut select = None;
    let mut spill_above = node::SPILL_ABOVE;
    let mut gossip_signing = GossipSigning::default();
    let (mut shards, mut redundancy) = (None::<usize>, None::<usize>);
    let mut backend = BackendChoice::Cpu;
    let mut defence = node::Defence::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: `{v}` is not a valid number"))
        }
        match flag.as_str() {
            "--index" => index = Some(num::<u32>(flag, value()?)?),
            "--members" => members = Some(num::<usize>(flag, value()?)?),
            "--job" => job = value()?,
            "--steps" => steps = num(flag, value()?)?,
            "--listen" => listen.push(value()?),
            "--peer" => peers.push(value()?),
            "--checkpoint" => checkpoint = Some(PathBuf::from(value()?)),
            "--join" => join = true,
            "--mdns" => mdns = true,
            "--arch" => arch = Some(value()?),
            "--batch" => batch = num(flag, value()?)?,
            "--topk" => topk = Some(num::<usize>(flag, value()?)?),
            "--select" => {
                select = Some(match value()?.as_str() {
                    "topk" => crate::compress::Select::TopK,
                    "shared" => crate::compress::Select::Shared,
                    other => return Err(format!("--select {other}: expected topk or shared")),
                })
            }
            "--spill-above" => spill_above = num(flag, value()?)?,
            "--gossip-signing" => {
                gossip_signing = match value()?.as_str() {
                    "envelope" => GossipSigning::Envelope,
                    "libp2p" => GossipSigning::Libp2p,
                    other => {
                        return Err(format!(
                            "--gossip-signing {other}: expected envelope or libp2p"
                        ));
                    }
                }
            }
            "--shards" => shards = Some(num(flag, value()?)?),
            "--redundancy" => redundancy = Some(num(flag, value()?)?),
            "--rate-mbit" => mbit = num(flag, value()?)?,
            "--rtt-ms" => rtt = num(flag, value()?)?,
            "--collect-ms" => timing.collect = Duration::from_millis(num(flag, value()?)?),
            "--fallback-ms" => timing.fallback = Duration::from_millis(num(flag, value()?)?),
            "--silent-ms" => timing.silent = Duration::from_millis(num(flag, value()?)?),
            "--request-ms" => timing.request = Duration::from_millis(num(flag, value()?)?),
            "--min-peers" => min_peers = num(flag, value()?)?,
            "--backend" => backend = value()?.parse().map_err(|e| format!("--backend: {e}"))?,
            "--witnesses" => {
                defence.witnesses = value()?
                    .split(',')
                    .map(|w| num::<u32>(flag, w.trim().to_string()))
                    .collect::<Result<_, _>>()?
            }
            "--quorum" => defence.audit.quorum = num(flag, value()?)?,
            "--audit-rate" => defence.audit.rate = num(flag, value()?)?,
            "--chain-rate" => defence.audit.chain_rate = num(flag, value()?)?,
            "--adversary" => {
                let v = value()?;
                defence.adversary = Some(
                    crate::adversary::Mode::parse(&v)
                        .ok_or_else(|| format!("--adversary: unknown mode `{v}`"))?,
                );
            }
            other => return Err(format!("unknown flag `{other}`\n{USAGE}")),
        }
    }
    let members = members.ok_or("--members is required")?;
    let me = index.ok_or("--index is required")?;
    if members == 0 || me as usize >= members {
        return Err(format!("--index {me} must be below --members {members}"));
    }
    let parse_addr = |a: &String| {
        a.parse()
            .map_err(|e| format!("`{a}` is not a multiaddr: {e}"))
    };
    let listen = if listen.is_empty() {
        vec!["/ip4/127.0.0.1/tcp/0".parse().map_err(|e| format!("{e}"))?]
    } else {
        listen.iter().map(parse_addr).collect::<Result<_, _>>()?
    };
    let bootstrap = peers.iter().map(parse_addr).collect::<Result<_, _>>()?;
    let mut train = TrainConfig::small(steps.max(1));
    if let Some(a) = arch {
        train.model = ModelConfig::parse(&a).map_err(|e| e.to_string())?;
    }
    train.batch = batch;
    train.micro_batch = batch;
    if select == Some(crate::compress::Select::TopK) {
        let top_k = TrainConfig::top_k(steps.max(1));
        train.compress = top_k.compress;
        train.lr = top_k.lr;
        train.weight_decay = top_k.weight_decay;
    }
    if let Some(k) = topk {
        if !(1..=4096).contains(&k) {
            return Err(format!(
                "--topk {k}: expected 1 to 4096 coefficients per chunk"
            ));
        }
        train.compress.topk = k;
    }
    let shapes: Vec<Vec<usize>> = train.model.shapes().into_iter().map(|(_, s)| s).collect();
    let layout = crate::compress::Layout::new(&shapes, &train.compress);
    let payload = crate::wire::payload_len(&layout) as u64;
    // The signed contribution adds a header and a signature to the payload.
    if payload + 1024 > msg::MAX_PAYLOAD {
        return Err(format!(
            "a payload of this model at {} coefficients per chunk is {payload} bytes, over the {} a member downloads",
            train.compress.topk,
            msg::MAX_PAYLOAD
        ));
    }
    let exchange = match shards {
        None => {
            crate::net::exchange::plan_for(members, &train).map(|p| crate::net::exchange::Plan {
                redundancy: redundancy.unwrap_or(p.redundancy),
                ..p
            })
        }
        Some(0) => None,
        Some(shards) => Some(crate::net::exchange::Plan {
            shards,
            redundancy: redundancy.unwrap_or(crate::net::exchange::Plan::REDUNDANCY),
            spots: 1,
            backups: 4,
            timing: crate::net::exchange::Timing::default(),
        }),
    };
    let redundancy = exchange.map_or(1, |p| p.redundancy);
    if exchange.is_some() && (redundancy == 0 || redundancy > members) {
        return Err(format!(
            "--redundancy {redundancy}: expected 1 to {members} (the members)"
        ));
    }
    let job = local_job(&job);
    let keys: Vec<_> = (0..members).map(local_member).collect();
    Ok((
        NodeConfig {
            train,
            job,
            epoch: 0,
            seed: epoch_seed(&job, 0),
            init_seed: epoch_seed(&job, u32::MAX),
            members: keys.iter().map(|k| k.1).collect(),
            me,
            secret: keys[me as usize].0,
            listen,
            bootstrap,
            steps,
            checkpoint,
            join,
            link: Link::new(mbit, Duration::from_millis(rtt)),
            timing,
            mdns,
            min_peers,
            // One run is one epoch.
            epoch_start: Some(0),
            pause: Default::default(),
            release_memory_when_paused: false,
            defence,
            spill_above,
            gossip_signing,
            exchange,
        },
        backend,
    ))
}

fn line(s: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}");
    let _ = out.flush();
}

/// This process's peak resident memory in KiB (`VmHWM`), -1 where the
/// platform does not say (only Linux's /proc is read).
fn peak_rss_kib() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(-1)
}

/// One JSON line per event; link samples are not printed.
fn event_json(e: &NodeEvent) -> Option<String> {
    Some(match e {
        NodeEvent::Listening(a) => format!(r#"{{"event":"listening","addr":"{a}"}}"#),
        NodeEvent::Synced {
            step,
            resumed,
            credits,
        } => {
            format!(
                r#"{{"event":"synced","step":{step},"resumed":{resumed},"credits":{credits:?}}}"#
            )
        }
        NodeEvent::Applied {
            step,
            model_hash,
            contributors,
            credits,
            times,
            loss,
        } => format!(
            r#"{{"event":"applied","step":{step},"hash":"{}","contributors":{contributors:?},"credits":{credits:?},"compute":{:.6},"comm":{:.6},"wait":{:.6},"loss":{loss:.5}}}"#,
            hex(model_hash),
            times.compute,
            times.comm,
            times.wait
        ),
        NodeEvent::Diverged { step } => format!(r#"{{"event":"diverged","step":{step}}}"#),
        NodeEvent::Rewound { step, credits } => {
            format!(r#"{{"event":"rewound","step":{step},"credits":{credits:?}}}"#)
        }
        NodeEvent::ForgedEntry {
            step,
            leader,
            member,
        } => format!(
            r#"{{"event":"forged_entry","step":{step},"leader":{leader},"member":{member}}}"#
        ),
        NodeEvent::Omitted {
            step,
            leader,
            member,
        } => format!(r#"{{"event":"omitted","step":{step},"leader":{leader},"member":{member}}}"#),
        NodeEvent::WrongStateHash { step, leader } => {
            format!(r#"{{"event":"wrong_state_hash","step":{step},"leader":{leader}}}"#)
        }
        NodeEvent::Audited(r) => {
            let (overlap, agreement) = r
                .comparison
                .map_or((-1.0, -1.0), |c| (c.overlap, c.agreement));
            // -1: not checked; an unfollowable chain prints as f32::MAX, so
            // the line stays JSON.
            let chain = r.chain_error.map_or(-1.0, |e| e.min(f32::MAX));
            format!(
                r#"{{"event":"audited","step":{},"member":{},"passed":{},"targeted":{},"overlap":{overlap:.4},"agreement":{agreement:.4},"chain_error":{chain:.5}}}"#,
                r.step, r.member, r.passed, r.targeted
            )
        }
        NodeEvent::Slashed {
            member,
            step,
            witnesses,
            ..
        } => format!(
            r#"{{"event":"slashed","member":{member},"step":{step},"witnesses":{witnesses:?}}}"#
        ),
        NodeEvent::Accused {
            member,
            step,
            ground,
            ..
        } => {
            let ground = match ground {
                Ground::Screened => "screened",
                Ground::Sampled { .. } => "sampled",
                Ground::Drawn { .. } => "drawn",
                Ground::Equivocation => "equivocation",
                Ground::ForgedEntry => "forged_entry",
                Ground::ForeignBasis => "foreign_basis",
                Ground::FalseSum { .. } => "false_sum",
            };
            format!(r#"{{"event":"accused","member":{member},"step":{step},"ground":"{ground}"}}"#)
        }
        NodeEvent::Links(_) => return None,
    })
}

/// Runs a peer from command-line arguments; returns the exit code.
pub fn main(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return 0;
    }
    if args.iter().any(|a| a == "--relay-server") {
        return match relay_server(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                2
            }
        };
    }
    if let [flag, i] = args
        && flag == "--peer-id-of"
    {
        if i == "relay" {
            println!("{}", relay_peer_id());
            return 0;
        }
        return match i.parse::<usize>() {
            Ok(i) => {
                let id = super::swarm::peer_id(&local_member(i).1);
                println!("{}", id.map_or("?".into(), |p| p.to_string()));
                0
            }
            Err(_) => {
                eprintln!("error: --peer-id-of needs a member index");
                2
            }
        };
    }
    let (cfg, choice) = match parse(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let result = (|| -> Result<node::NodeStats, String> {
        let corpus = Corpus::bundled().map_err(|e| e.to_string())?;
        let engine = match choice {
            BackendChoice::Cpu => backend::cpu(),
            c => backend::select(c).map_err(|e| e.to_string())?.engine,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(node::run(cfg, corpus, engine, |e| {
            if let Some(l) = event_json(e) {
                line(l)
            }
        }))
        .map_err(|e| e.to_string())
    })();
    match result {
        Ok(stats) => {
            let dropped: Vec<String> = msg::Drop::ALL
                .iter()
                .map(|d| format!(r#""{}":{}"#, d.name(), stats.dropped(*d)))
                .collect();
            line(format!(
                r#"{{"event":"done","applied":{},"hash":"{}","accepted":{},"equivocations":{},"late":{},"timed_out":{},"lowest_peer_score":{:.1},"peak_rss_kib":{},"rewinds":{},"bytes_in":{},"bytes_out":{},"audits":{},"audits_failed":{},"audit_secs":{:.4},"compute_secs":{:.4},"wire_out":{},"wire_in":{},"false_sums":{},"unvoted":{},"beats_skipped":{},"slashed":{:?},"routes":{{{}}},"dropped":{{{}}}}}"#,
                stats.applied,
                hex(&stats.model_hash),
                stats.accepted,
                stats.equivocations,
                stats.late,
                stats.timed_out,
                stats.lowest_peer_score,
                peak_rss_kib(),
                stats.rewinds,
                stats.bytes_in,
                stats.bytes_out,
                stats.audits,
                stats.audits_failed,
                stats.audit_secs,
                stats.compute_secs,
                crate::net::shaper::WIRE_SENT.load(std::sync::atomic::Ordering::Relaxed),
                crate::net::shaper::WIRE_RECEIVED.load(std::sync::atomic::Ordering::Relaxed),
                stats.false_sums,
                stats.unvoted,
                stats.beats_skipped,
                stats.slashed.iter().collect::<Vec<_>>(),
                stats
                    .routes
                    .iter()
                    .map(|(m, r)| format!(r#""{m}":"{}""#, r.name()))
                    .collect::<Vec<_>>()
                    .join(","),
                dropped.join(",")
            ));
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
