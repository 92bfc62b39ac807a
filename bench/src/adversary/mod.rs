//! `adversary`: the honest run against 33% and 45% attackers for every
//! payload attack, in one process (`engine::arena`), with the defences on
//! and, side by side, off, over several seeds. Beside them, the honest
//! run with as many members fewer as there are attackers: what losing
//! that share of the data costs. Prints the final validation loss as a
//! ratio to the honest run of the same seed, the share of the undefended
//! harm the defences remove, the share of attackers slashed, the epoch by
//! which they all were, and what audits cost as extra compute. Witnesses
//! recompute with another micro-batch (another summation order, as on other
//! hardware). Every arena run is logged to `docs/bench/adversary-runs.jsonl`
//! as it ends, so the same command resumes a sweep cut short.

mod table;

use crate::args::Args;
use crate::report;
use crate::runlog;
use anyhow::{Result, anyhow, ensure};
use cohort_engine::adversary::Mode;
use cohort_engine::arena::{self, ArenaConfig, ArenaReport};
use cohort_engine::audit::AuditConfig;
use cohort_engine::backend;
use cohort_engine::compress::Select;
use cohort_engine::data::Corpus;
use cohort_engine::runner::RunConfig;
use cohort_engine::trainer::TrainConfig;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;

const FLAGS: &[&str] = &[
    "members",
    "steps",
    "epoch",
    "fractions",
    "modes",
    "undefended",
    "witness-micro-batch",
    "seeds",
    "standby",
    "rule",
    "plan",
    "name",
];

/// Bump when the arena's training or defence math changes: runs logged
/// under another recipe are not reused. One exception, recorded: runs
/// logged before 2026-12-05 computed gradients with burn-ndarray's SIMD
/// reciprocal (about 12 bits, by buffer alignment), later ones exactly; a
/// difference in the last bits of a few rows, like the run-to-run one the
/// SIMD path already had, so those runs are kept.
const RECIPE: u32 = 1;

/// Bump when the screen changes: runs with the defences on that were
/// logged under another screen are not reused (undefended runs are).
/// 2: a tie with the others' votes counts half, not as agreement.
const SCREEN: u32 = 2;

/// What one arena run is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Every member honest, defences on.
    Honest,
    /// `count` fewer members (the first n − count), all honest, defences on.
    Alone { count: usize },
    /// `count` members attack with `mode`; the defences on or off; with
    /// `standby`, a slashed seat is taken by an honest newcomer
    /// ([`Setting::standby`] epochs after the slash's).
    Attack {
        mode: Mode,
        count: usize,
        defend: bool,
        standby: bool,
    },
}

/// Everything but the seed and the run's kind that a result depends on.
#[derive(Debug, Clone, Copy)]
struct Setting {
    members: usize,
    steps: u32,
    spe: u32,
    witness_micro_batch: usize,
    audit: AuditConfig,
    /// Epochs after a slash's at which a standby node takes the seat, for
    /// the runs that have one.
    standby: Option<u32>,
    /// The compression rule the arena trains with.
    rule: Select,
}

/// The training recipe of an arena run. The published tables were measured
/// under the top-k rule ([`TrainConfig::top_k`], the job recipe before the
/// shared rule); `--rule shared` runs the job's recipe today
/// ([`TrainConfig::small`]).
fn recipe(rule: Select, steps: u32) -> TrainConfig {
    match rule {
        Select::TopK => TrainConfig::top_k(steps),
        Select::Shared => TrainConfig::small(steps),
    }
}

/// The log line's key: one string for everything the result depends on.
fn key(s: &Setting, seed: u32, kind: Kind) -> String {
    let defended = !matches!(kind, Kind::Attack { defend: false, .. });
    let run = match kind {
        Kind::Honest => "honest".to_string(),
        Kind::Alone { count } => format!("alone-without-{count}"),
        Kind::Attack {
            mode,
            count,
            defend,
            standby,
        } => format!(
            "{}-{count}-{}{}",
            mode.name(),
            if defend { "defended" } else { "undefended" },
            match s.standby {
                Some(after) if standby => format!("-standby{after}"),
                _ => String::new(),
            }
        ),
    };
    let screen = if defended && SCREEN > 1 {
        format!(" screen={SCREEN}")
    } else {
        String::new()
    };
    // Top-k runs keep the keys they were logged under.
    let rule = match s.rule {
        Select::TopK => "",
        Select::Shared => " rule=shared",
    };
    format!(
        "recipe={RECIPE}{rule} members={} steps={} epoch={} witness-micro-batch={} audit={:?}{screen} seed={seed} run={run}",
        s.members, s.steps, s.spe, s.witness_micro_batch, s.audit
    )
}

/// Seed 0 is the job the single-seed tables used; the others are hashed.
fn seed_job(seed: u32) -> [u8; 32] {
    if seed == 0 {
        [5; 32]
    } else {
        *blake3::hash(format!("cohort-adversary-seed-{seed}").as_bytes()).as_bytes()
    }
}

/// Attackers at `fraction` of `members`, at least one, fewer than half.
fn attackers(fraction: f64, members: usize) -> usize {
    ((fraction * members as f64).round() as usize).clamp(1, members.div_ceil(2) - 1)
}

/// The attackers' member indices, spread over the membership.
fn placed(count: usize, members: usize) -> Vec<usize> {
    (0..count)
        .map(|k| (k * members / count + 1) % members)
        .collect()
}

/// Every run of the sweep, seed by seed (so a sweep cut short still has
/// whole seeds): the honest run, the honest members alone for each
/// attacker count, then each mode at each fraction, defended, defended with
/// a standby node (if asked) and undefended (if asked).
fn plan(
    seeds: u32,
    fractions: &[f64],
    modes: &[Mode],
    undefended: bool,
    standby: bool,
    members: usize,
) -> Vec<(u32, Kind)> {
    let mut counts: Vec<usize> = fractions.iter().map(|f| attackers(*f, members)).collect();
    counts.dedup();
    let mut out = Vec::new();
    for seed in 0..seeds {
        out.push((seed, Kind::Honest));
        out.extend(counts.iter().map(|&count| (seed, Kind::Alone { count })));
        for &mode in modes {
            for &count in &counts {
                for (defend, with_standby) in [(true, false), (true, true), (false, false)] {
                    if (defend && !with_standby)
                        || (with_standby && standby)
                        || (!defend && undefended)
                    {
                        let kind = Kind::Attack {
                            mode,
                            count,
                            defend,
                            standby: with_standby,
                        };
                        out.push((seed, kind));
                    }
                }
            }
        }
    }
    out
}

/// What the tables need from one arena run.
#[derive(Debug, Clone, PartialEq)]
struct Summary {
    final_val_loss: f64,
    /// Member → step at which it was slashed.
    slashed: BTreeMap<usize, u32>,
    false_accusations: usize,
    audits: usize,
    honest_flagged: usize,
    train_secs: f64,
    audit_secs: f64,
    secs: f64,
}

impl Summary {
    fn of(r: &ArenaReport, secs: f64) -> Self {
        Self {
            final_val_loss: f64::from(r.final_val_loss),
            slashed: r.slashed.clone(),
            false_accusations: r.false_accusations,
            audits: r.audits,
            honest_flagged: r.honest_flagged,
            train_secs: r.train_secs,
            audit_secs: r.audit_secs,
            secs,
        }
    }

    /// Extra compute audits cost, as a share of training compute.
    fn overhead(&self) -> f64 {
        self.audit_secs / self.train_secs.max(1e-9)
    }

    fn to_json(&self, key: &str, commit: &str) -> Value {
        json!({
            "key": key,
            "final_val_loss": self.final_val_loss,
            "slashed": self.slashed.iter().map(|(m, s)| [*m as u64, u64::from(*s)]).collect::<Vec<_>>(),
            "false_accusations": self.false_accusations,
            "audits": self.audits,
            "honest_flagged": self.honest_flagged,
            "train_secs": self.train_secs,
            "audit_secs": self.audit_secs,
            "secs": self.secs,
            "commit": commit,
        })
    }

    fn from_json(v: &Value) -> Option<(String, Self)> {
        let n = |k: &str| v.get(k)?.as_f64();
        let slashed = v
            .get("slashed")?
            .as_array()?
            .iter()
            .map(|p| Some((p.get(0)?.as_u64()? as usize, p.get(1)?.as_u64()? as u32)))
            .collect::<Option<BTreeMap<_, _>>>()?;
        let s = Self {
            final_val_loss: n("final_val_loss")?,
            slashed,
            false_accusations: n("false_accusations")? as usize,
            audits: n("audits")? as usize,
            honest_flagged: n("honest_flagged")? as usize,
            train_secs: n("train_secs")?,
            audit_secs: n("audit_secs")?,
            secs: n("secs")?,
        };
        Some((v.get("key")?.as_str()?.to_string(), s))
    }
}

fn log_path() -> PathBuf {
    report::repo_root().join("docs/bench/adversary-runs.jsonl")
}

pub fn run(raw: &[String]) -> Result<()> {
    let a = Args::parse(raw, FLAGS)?;
    let members: usize = a.get("members", 9)?;
    let steps: u32 = a.get("steps", 100)?;
    let spe: u32 = a.get("epoch", 10)?;
    let seeds: u32 = a.get("seeds", 3)?;
    let witness_micro_batch: usize = a.get("witness-micro-batch", 4)?;
    let fractions: Vec<f64> = list(&a.get("fractions", "0.33,0.45".to_string())?, |s| {
        s.parse::<f64>().ok().filter(|f| (0.0..0.5).contains(f))
    })
    .map_err(|s| anyhow!("--fractions: `{s}` is not a share below 0.5"))?;
    let modes: Vec<Mode> = match a.get("modes", "all".to_string())?.as_str() {
        // Every payload attack, the colluders acting as one, then the
        // forger the momentum chain is for.
        // Left out: `scale`, a no-op (top-k selection and the sign vote
        // ignore a payload's scale), and the equivocating leader, whose
        // attack is on manifests: the arena has no leaders, and the P2P
        // tests measure it over the network.
        "all" => Mode::ALL
            .into_iter()
            .filter(|m| !matches!(m, Mode::Scale | Mode::EquivocatingLeader))
            .chain([Mode::Collude, Mode::ColludeHidden, Mode::ForgedMomentum])
            .collect(),
        m => list(m, Mode::parse).map_err(|s| {
            anyhow!(
                "--modes: unknown mode `{s}`; one of {}, collude, collude-hidden, forged-momentum",
                Mode::ALL.map(Mode::name).join(", ")
            )
        })?,
    };
    let yes_no = |flag: &str, default: &str| -> Result<bool> {
        match a.get(flag, default.to_string())?.as_str() {
            "yes" => Ok(true),
            "no" => Ok(false),
            v => Err(anyhow!("--{flag}: `{v}` is not yes or no")),
        }
    };
    let undefended = yes_no("undefended", "yes")?;
    let plan_only = yes_no("plan", "no")?;
    // Where the table goes: `docs/bench/<name>.json` and its own section of
    // docs/benchmarks.md, so a sweep in other settings (longer runs) sits
    // beside the default one instead of replacing it.
    let name: String = a.get("name", "adversary".to_string())?;
    ensure!(
        name.starts_with("adversary")
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "--name: `{name}` must start with `adversary` and hold only a-z, 0-9 and -"
    );
    ensure!(
        !modes.contains(&Mode::EquivocatingLeader),
        "--modes: the equivocating leader attacks manifests and the arena has no leaders; \
         it is measured over the network (engine/tests/p2p.rs, the lying-leader run)"
    );
    ensure!(members >= 3, "--members: at least 3");
    ensure!(steps >= 1 && spe >= 1, "--steps and --epoch: at least 1");
    ensure!(seeds >= 1, "--seeds: at least 1");
    let standby: Option<u32> =
        match a.get("standby", "none".to_string())?.as_str() {
            "none" => None,
            v => Some(v.parse::<u32>().ok().filter(|e| *e >= 1).ok_or_else(|| {
                anyhow!("--standby: `{v}` is not `none` or a count of epochs ≥ 1")
            })?),
        };
    let rule = match a.get("rule", "topk".to_string())?.as_str() {
        "topk" => Select::TopK,
        "shared" => Select::Shared,
        v => return Err(anyhow!("--rule: `{v}` is not topk or shared")),
    };
    let setting = Setting {
        members,
        steps,
        spe,
        witness_micro_batch,
        audit: AuditConfig::default(),
        standby,
        rule,
    };
    let corpus = Corpus::bundled()?;
    let config = |seed: u32, kind: Kind| -> ArenaConfig {
        let (n, adversaries, defend, with_standby) = match kind {
            Kind::Honest => (members, Vec::new(), true, false),
            Kind::Alone { count } => (members - count, Vec::new(), true, false),
            Kind::Attack {
                mode,
                count,
                defend,
                standby,
            } => (
                members,
                placed(count, members)
                    .into_iter()
                    .map(|i| (i, mode))
                    .collect(),
                defend,
                standby,
            ),
        };
        ArenaConfig {
            run: RunConfig {
                train: recipe(rule, steps),
                members: n,
                steps,
                steps_per_epoch: spe,
                job: seed_job(seed),
                eval_windows: 32,
                eval_every: 0,
            },
            adversaries: adversaries.into_iter().collect(),
            audit: setting.audit,
            defend,
            witness_jitter: 0.0,
            witness_micro_batch,
            standby: setting.standby.filter(|_| with_standby),
        }
    };
    let path = log_path();
    let mut done: HashMap<String, Summary> = runlog::load(&path)?
        .iter()
        .filter_map(Summary::from_json)
        .collect();
    let runs = plan(
        seeds,
        &fractions,
        &modes,
        undefended,
        standby.is_some(),
        members,
    );
    let todo: Vec<(u32, Kind)> = runs
        .iter()
        .copied()
        .filter(|(seed, kind)| !done.contains_key(&key(&setting, *seed, *kind)))
        .collect();
    let audit = setting.audit;
    println!(
        "adversary: {members} members, {steps} steps ({spe} per epoch), {seeds} seed(s), tiny model, CPU, witnesses at micro-batch {witness_micro_batch}; audits: rate {}, quorum {}, pass at overlap ≥ {} and sign agreement ≥ {}",
        audit.rate, audit.quorum, audit.min_overlap, audit.min_agreement
    );
    println!(
        "{} run(s) of {} logged in {}, {} to run",
        runs.len() - todo.len(),
        runs.len(),
        path.display(),
        todo.len()
    );
    if plan_only {
        for (seed, kind) in &todo {
            println!("  {}", key(&setting, *seed, *kind));
        }
        return Ok(());
    }
    let commit = report::commit();
    let started = Instant::now();
    for (i, &(seed, kind)) in todo.iter().enumerate() {
        let k = key(&setting, seed, kind);
        let cfg = config(seed, kind);
        let t = Instant::now();
        let engines = (0..cfg.run.members).map(|_| backend::cpu()).collect();
        let r = arena::run(&cfg, &corpus, engines, backend::cpu())?;
        let s = Summary::of(&r, t.elapsed().as_secs_f64());
        runlog::append(&path, &s.to_json(&k, &commit))?;
        let left = started.elapsed().as_secs_f64() / (i + 1) as f64 * (todo.len() - i - 1) as f64;
        println!(
            "[{}/{}] seed {seed} {kind:?}: validation loss {:.4}, slashed {:?}, audit overhead {:.2}% ({:.0} s; about {:.0} min left)",
            i + 1,
            todo.len(),
            s.final_val_loss,
            s.slashed,
            100.0 * s.overhead(),
            s.secs,
            left / 60.0
        );
        done.insert(k, s);
    }
    let got = |seed: u32, kind: Kind| &done[&key(&setting, seed, kind)];
    let beside = table::Beside {
        undefended,
        standby: standby.is_some(),
    };
    let rows = table::rows(seeds, &fractions, &modes, beside, members, spe, &got);
    let honest: Vec<&Summary> = (0..seeds).map(|s| got(s, Kind::Honest)).collect();
    let secs: f64 = runs.iter().map(|(s, k)| got(*s, *k).secs).sum();
    table::publish(&name, &rows, &honest, &setting, seeds, secs)
}

fn list<T>(s: &str, parse: impl Fn(&str) -> Option<T>) -> std::result::Result<Vec<T>, String> {
    s.split(',')
        .map(|x| parse(x.trim()).ok_or_else(|| x.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_runs_each_seed_whole_and_the_honest_members_alone_once_per_attacker_count() {
        let modes = [Mode::SignFlip, Mode::Noise];
        let p = plan(2, &[0.33, 0.45], &modes, true, false, 9);
        // Per seed: honest, alone without 3 and 4, then 2 modes × 2 counts
        // × defended and undefended.
        assert_eq!(p.len(), 2 * (1 + 2 + 8));
        assert!(p[..11].iter().all(|(s, _)| *s == 0));
        assert_eq!(p[1].1, Kind::Alone { count: 3 });
        assert_eq!(p[2].1, Kind::Alone { count: 4 });
        // Fractions that round to one count share its runs.
        let q = plan(1, &[0.33, 0.34], &modes, false, false, 9);
        assert_eq!(q.len(), 1 + 1 + 2);
        // A standby node adds one defended run per mode and count.
        let r = plan(1, &[0.33], &modes, true, true, 9);
        assert_eq!(r.len(), 1 + 1 + 2 * 3);
        // Every run has its own key.
        let s = Setting {
            members: 9,
            steps: 100,
            spe: 10,
            witness_micro_batch: 4,
            audit: AuditConfig::default(),
            standby: Some(1),
            rule: Select::TopK,
        };
        let keys: std::collections::HashSet<String> =
            p.iter().map(|(seed, k)| key(&s, *seed, *k)).collect();
        assert_eq!(keys.len(), p.len());
    }

    #[test]
    fn attackers_are_at_least_one_and_always_fewer_than_half() {
        assert_eq!(attackers(0.33, 9), 3);
        assert_eq!(attackers(0.45, 9), 4);
        assert_eq!(attackers(0.01, 9), 1);
        assert_eq!(attackers(0.49, 4), 1);
        assert_eq!(placed(3, 9), vec![1, 4, 7]);
    }

    #[test]
    fn a_logged_summary_reads_back() {
        let s = Summary {
            final_val_loss: 2.3708,
            slashed: [(1, 3), (4, 0)].into_iter().collect(),
            false_accusations: 0,
            audits: 42,
            honest_flagged: 7,
            train_secs: 100.0,
            audit_secs: 1.5,
            secs: 120.0,
        };
        let (k, back) = Summary::from_json(&s.to_json("k", "abc")).unwrap();
        assert_eq!(k, "k");
        assert_eq!(back, s);
    }
}
