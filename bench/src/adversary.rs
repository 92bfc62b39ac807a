//! `adversary`: the honest run against 33% and 45% attackers for every
//! payload attack, in one process (`engine::arena`), with the defences on
//! and, side by side, off. Prints the final validation loss as a ratio to
//! the honest run, the share of the undefended harm the defences remove,
//! the share of attackers slashed, the epoch by which they all were, and
//! what audits cost as extra compute. Witnesses recompute with another
//! micro-batch (another summation order, as on other hardware).

use crate::args::Args;
use crate::report::{self, Figures};
use anyhow::{Result, anyhow, ensure};
use cohort_engine::adversary::Mode;
use cohort_engine::arena::{self, ArenaConfig, ArenaReport};
use cohort_engine::audit::AuditConfig;
use cohort_engine::backend;
use cohort_engine::data::Corpus;
use cohort_engine::runner::RunConfig;
use cohort_engine::trainer::TrainConfig;
use std::fmt::Write as _;
use std::time::Instant;

const FLAGS: &[&str] = &[
    "members",
    "steps",
    "epoch",
    "fractions",
    "modes",
    "undefended",
    "witness-micro-batch",
];

/// An undefended loss ratio below this does no harm worth removing: the
/// harm-removed goal counts only attacks above it.
const HARMFUL: f64 = 1.02;

struct Row {
    mode: Mode,
    fraction: f64,
    count: usize,
    defended: ArenaReport,
    undefended: Option<ArenaReport>,
    /// Share of attackers slashed.
    detection: f64,
    /// Epoch (1-based) by which every attacker was slashed; None if some
    /// never were.
    epochs_to_slash: Option<u32>,
}

pub fn run(raw: &[String]) -> Result<()> {
    let a = Args::parse(raw, FLAGS)?;
    let members: usize = a.get("members", 9)?;
    let steps: u32 = a.get("steps", 100)?;
    let spe: u32 = a.get("epoch", 10)?;
    let witness_micro_batch: usize = a.get("witness-micro-batch", 4)?;
    let fractions: Vec<f64> = list(&a.get("fractions", "0.33,0.45".to_string())?, |s| {
        s.parse::<f64>().ok().filter(|f| (0.0..0.5).contains(f))
    })
    .map_err(|s| anyhow!("--fractions: `{s}` is not a share below 0.5"))?;
    let modes: Vec<Mode> = match a.get("modes", "all".to_string())?.as_str() {
        // Every payload attack, then the forger the momentum chain is for.
        // Left out: `scale`, a no-op (top-k selection and the sign vote
        // ignore a payload's scale), and the equivocating leader, whose
        // attack is on manifests: the arena has no leaders, and the P2P
        // tests measure it over the network.
        "all" => Mode::ALL
            .into_iter()
            .filter(|m| !matches!(m, Mode::Scale | Mode::EquivocatingLeader))
            .chain([Mode::ForgedMomentum])
            .collect(),
        m => list(m, Mode::parse).map_err(|s| {
            anyhow!(
                "--modes: unknown mode `{s}`; one of {}, forged-momentum",
                Mode::ALL.map(Mode::name).join(", ")
            )
        })?,
    };
    let undefended = match a.get("undefended", "yes".to_string())?.as_str() {
        "yes" => true,
        "no" => false,
        v => return Err(anyhow!("--undefended: `{v}` is not yes or no")),
    };
    ensure!(
        !modes.contains(&Mode::EquivocatingLeader),
        "--modes: the equivocating leader attacks manifests and the arena has no leaders; \
         it is measured over the network (engine/tests/p2p.rs, the lying-leader run)"
    );
    ensure!(members >= 3, "--members: at least 3");
    ensure!(steps >= 1 && spe >= 1, "--steps and --epoch: at least 1");
    let corpus = Corpus::bundled()?;
    let audit = AuditConfig::default();
    let base = |adversaries: Vec<(usize, Mode)>, defend: bool| ArenaConfig {
        run: RunConfig {
            train: TrainConfig::small(steps),
            members,
            steps,
            steps_per_epoch: spe,
            job: [5; 32],
            eval_windows: 32,
            eval_every: 0,
        },
        adversaries: adversaries.into_iter().collect(),
        audit,
        defend,
        witness_jitter: 0.0,
        witness_micro_batch,
    };
    let go = |cfg: &ArenaConfig| -> Result<ArenaReport> {
        let engines = (0..cfg.run.members).map(|_| backend::cpu()).collect();
        Ok(arena::run(cfg, &corpus, engines, backend::cpu())?)
    };
    println!(
        "adversary: {members} members, {steps} steps ({spe} per epoch), tiny model, CPU, witnesses at micro-batch {witness_micro_batch}; audits: rate {}, quorum {}, pass at overlap ≥ {} and sign agreement ≥ {}",
        audit.rate, audit.quorum, audit.min_overlap, audit.min_agreement
    );
    let started = Instant::now();
    let honest = go(&base(Vec::new(), true))?;
    println!(
        "honest: validation loss {:.4}, {} audits, overhead {:.2}%, {} false accusations ({:.0} s)",
        honest.final_val_loss,
        honest.audits,
        100.0 * honest.audit_overhead(),
        honest.false_accusations,
        started.elapsed().as_secs_f64()
    );
    let mut rows = Vec::new();
    for &mode in &modes {
        for &fraction in &fractions {
            let count = ((fraction * members as f64).round() as usize).clamp(1, members / 2);
            // Spread over the member indices.
            let adversaries: Vec<(usize, Mode)> = (0..count)
                .map(|k| (k * members / count + 1) % members)
                .map(|i| (i, mode))
                .collect();
            let defended = go(&base(adversaries.clone(), true))?;
            let undefended = if undefended {
                Some(go(&base(adversaries.clone(), false))?)
            } else {
                None
            };
            let caught = adversaries
                .iter()
                .filter(|(i, _)| defended.slashed.contains_key(i))
                .count();
            let epochs_to_slash = (caught == count).then(|| {
                adversaries
                    .iter()
                    .filter_map(|(i, _)| defended.slashed.get(i))
                    .map(|s| s / spe + 1)
                    .max()
                    .unwrap_or(0)
            });
            let detection = caught as f64 / count as f64;
            let row = Row {
                mode,
                fraction,
                count,
                defended,
                undefended,
                detection,
                epochs_to_slash,
            };
            println!("{}", line(&row, &honest));
            rows.push(row);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let settings = Settings {
        members,
        steps,
        spe,
        witness_micro_batch,
        audit,
        secs,
    };
    publish(&rows, &honest, &settings)
}

fn list<T>(s: &str, parse: impl Fn(&str) -> Option<T>) -> std::result::Result<Vec<T>, String> {
    s.split(',')
        .map(|x| parse(x.trim()).ok_or_else(|| x.trim().to_string()))
        .collect()
}

fn ratio(r: &ArenaReport, honest: &ArenaReport) -> f64 {
    f64::from(r.final_val_loss) / f64::from(honest.final_val_loss)
}

fn line(r: &Row, honest: &ArenaReport) -> String {
    format!(
        "{:<20} {:>2} attackers ({:>3.0}%): loss {:.3}× honest{}, detected {:.0}%, slashed by epoch {}, audit overhead {:.2}%, false accusations {}",
        r.mode.name(),
        r.count,
        100.0 * r.fraction,
        ratio(&r.defended, honest),
        r.undefended
            .as_ref()
            .map(|u| format!(" (undefended {:.3}×)", ratio(u, honest)))
            .unwrap_or_default(),
        100.0 * r.detection,
        r.epochs_to_slash.map_or("never".into(), |e| e.to_string()),
        100.0 * r.defended.audit_overhead(),
        r.defended.false_accusations
    )
}

/// Share of the undefended harm (loss above the honest run) that the
/// defences remove; None where the undefended attack does no harm worth
/// removing.
fn removed(r: &Row, honest: &ArenaReport) -> Option<f64> {
    let u = ratio(r.undefended.as_ref()?, honest);
    (u >= HARMFUL).then(|| (u - ratio(&r.defended, honest)) / (u - 1.0))
}

struct Settings {
    members: usize,
    steps: u32,
    spe: u32,
    witness_micro_batch: usize,
    audit: AuditConfig,
    secs: f64,
}

fn publish(rows: &[Row], honest: &ArenaReport, s: &Settings) -> Result<()> {
    let Settings {
        members,
        steps,
        spe,
        witness_micro_batch,
        ref audit,
        secs,
    } = *s;
    let mut f = Figures::default();
    f.num("members", members as f64)
        .num("steps", steps as f64)
        .num("steps_per_epoch", spe as f64)
        .text("model", "tiny (ModelConfig::tiny), CPU")
        .num("witness_micro_batch", witness_micro_batch as f64)
        .num("harmful_undefended_ratio", HARMFUL)
        .num("audit_rate", audit.rate)
        .num("audit_quorum", audit.quorum as f64)
        .num("audit_min_overlap", audit.min_overlap as f64)
        .num("audit_min_agreement", audit.min_agreement as f64)
        .num("honest_val_loss", honest.final_val_loss as f64)
        .num("honest_audit_overhead_pct", 100.0 * honest.audit_overhead())
        .num("honest_false_accusations", honest.false_accusations as f64)
        .num("seconds", secs);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Adversaries (`cargo run --release -p cohort-bench -- adversary`)\n\n\
         {members} members train the tiny model for {steps} steps ({spe} per epoch) in one process \
         (`engine::arena`); attackers see every honest payload of the step before sending theirs. \
         Witnesses recompute at micro-batch {witness_micro_batch} (the job's is 8): another summation \
         order, so other rounding, as on other hardware. \
         Loss is the final validation loss as a ratio to the honest run measured in the same run \
         (honest: {:.4}). *Undefended* is the same attack on the plain sign vote, with no screen, \
         audits or slashing. *Harm removed* is (undefended − defended) ÷ (undefended − honest), shown \
         where the undefended ratio is at least {HARMFUL}. Audits: {:.0}% of contributions at random \
         plus every one the screen flags; a slash needs {} witnesses whose audits failed. Goals: at \
         33%, at least 80% of the harm removed for every attack that does harm undefended, and loss \
         ≤ 1.10× honest for every mode; every attacker slashed within one epoch; audit overhead ≤ 5%.\n",
        honest.final_val_loss,
        100.0 * audit.rate,
        audit.quorum
    );
    md.push_str("| mode | attackers | loss ÷ honest | undefended | harm removed | detected | all slashed by epoch | audit overhead | false accusations |\n|---|---|---|---|---|---|---|---|---|\n");
    let _ = writeln!(
        md,
        "| honest | 0 | 1.000 | 1.000 | – | – | – | {:.2}% | {} |",
        100.0 * honest.audit_overhead(),
        honest.false_accusations
    );
    let mut worst_33 = 0.0f64;
    let mut least_removed_33 = f64::INFINITY;
    for r in rows {
        let pct = (100.0 * r.fraction).round() as u32;
        let key = format!("{}_{pct}", r.mode.name().replace('-', "_"));
        let lr = ratio(&r.defended, honest);
        let removed = removed(r, honest);
        if pct == 33 {
            worst_33 = worst_33.max(lr);
            if let Some(x) = removed {
                least_removed_33 = least_removed_33.min(x);
            }
        }
        f.num(&format!("{key}_attackers"), r.count as f64)
            .num(&format!("{key}_loss_ratio"), lr)
            .num(
                &format!("{key}_undefended_loss_ratio"),
                r.undefended.as_ref().map_or(f64::NAN, |u| ratio(u, honest)),
            )
            .num(&format!("{key}_harm_removed"), removed.unwrap_or(f64::NAN))
            .num(&format!("{key}_detection"), r.detection)
            .num(
                &format!("{key}_epochs_to_slash"),
                r.epochs_to_slash.map_or(f64::NAN, f64::from),
            )
            .num(
                &format!("{key}_audit_overhead_pct"),
                100.0 * r.defended.audit_overhead(),
            )
            .num(
                &format!("{key}_false_accusations"),
                r.defended.false_accusations as f64,
            );
        let _ = writeln!(
            md,
            "| {} | {} of {members} ({pct}%) | {:.3} | {} | {} | {:.0}% | {} | {:.2}% | {} |",
            r.mode.name(),
            r.count,
            lr,
            r.undefended
                .as_ref()
                .map_or("–".into(), |u| format!("{:.3}", ratio(u, honest))),
            match (removed, &r.undefended) {
                (Some(x), _) => format!("{:.0}%", 100.0 * x),
                (None, Some(_)) => "– (no harm undefended)".into(),
                (None, None) => "–".into(),
            },
            100.0 * r.detection,
            r.epochs_to_slash.map_or("never".into(), |e| e.to_string()),
            100.0 * r.defended.audit_overhead(),
            r.defended.false_accusations
        );
    }
    f.num("worst_loss_ratio_at_33", worst_33)
        .num("least_harm_removed_at_33", least_removed_33);
    let goal = |ok: bool| if ok { "met" } else { "not met" };
    let removed_line = if least_removed_33.is_finite() {
        format!(
            "least harm removed at 33%: **{:.0}%** (goal ≥ 80%: {})",
            100.0 * least_removed_33,
            goal(least_removed_33 >= 0.8)
        )
    } else {
        "no attack at 33% did harm undefended, so the harm-removed goal was not tested".into()
    };
    let _ = writeln!(
        md,
        "\nWorst loss ratio at 33%: **{worst_33:.3}** (goal ≤ 1.10: {}); {removed_line}. \
         Not in this table: `scale` is a no-op (top-k selection and the sign vote ignore a payload's \
         scale, so it can neither harm nor be detected); the equivocating leader attacks manifests, and \
         the arena has no leaders: it is measured over the network by `engine/tests/p2p.rs` (the \
         lying-leader run: evidence recorded, reported on chain, no honest node fails its epoch). \
         Where attackers are slashed at \
         the first step, the run continues with the honest members only, so those rows share one loss: the \
         ratio measures the data the attackers took away, not damage they did. Audit overhead counts \
         the witnesses' gradient recomputations (the momentum chain check included); the screen (one pass \
         over the votes) is not counted. *forged-momentum* is not one of the nine: a sign-flipper that \
         reveals momenta forged so its flipped payloads recompute exactly; one-step audits pass it, and \
         only the momentum chain (`audit::chain_error`) convicts it. Run took {secs:.0} s.",
        goal(worst_33 <= 1.10)
    );
    println!("\nworst loss ratio at 33%: {worst_33:.3} (goal ≤ 1.10); {removed_line}");
    report::publish("adversary", &f, &md)
}
