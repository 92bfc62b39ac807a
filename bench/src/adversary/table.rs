//! The adversary sweep's rows, over seeds: each ratio is to the honest run
//! of the same seed, then reported as mean and min–max; and the section of
//! `docs/benchmarks.md` and `docs/bench/adversary.json` they make.

use super::{Kind, Setting, Summary, placed};
use crate::report::{self, Figures, spread};
use anyhow::Result;
use cohort_engine::adversary::Mode;
use cohort_engine::compress::Select;
use std::fmt::Write as _;

/// A mean undefended loss ratio below this does no harm worth removing:
/// the harm-removed goal counts only attacks above it (and only those that
/// harmed every seed).
const HARMFUL: f64 = 1.02;

/// Mean, min and max of one ratio over seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    fn of(v: &[f64]) -> Self {
        let (mean, min, max) = spread(v);
        Self { mean, min, max }
    }

    fn cell(&self) -> String {
        format!("{:.3} ({:.3}–{:.3})", self.mean, self.min, self.max)
    }
}

pub struct Row {
    pub mode: Mode,
    pub fraction: f64,
    pub count: usize,
    /// Final validation loss ÷ the honest run's, defended.
    pub defended: Spread,
    pub undefended: Option<Spread>,
    /// Defended, a standby node taking each slashed seat.
    pub standby: Option<Spread>,
    /// The honest run with `count` fewer members ÷ the honest run.
    pub alone: Spread,
    /// Share of attackers slashed, over all seeds.
    pub detection: f64,
    /// Epoch (1-based) by which every attacker of every seed was slashed;
    /// None if one never was.
    pub epochs_to_slash: Option<u32>,
    /// Mean audit overhead of the defended runs.
    pub overhead: f64,
    /// Honest members slashed, over all seeds.
    pub false_accusations: usize,
}

impl Row {
    /// Share of the undefended harm (mean loss above the honest run) that
    /// the defences remove; None where the undefended attack does no harm
    /// worth removing: a mean below [`HARMFUL`], or a seed it did not harm
    /// at all (then the "harm" is within the seeds' spread).
    pub fn removed(&self) -> Option<f64> {
        Self::share_removed(self.undefended?, self.defended)
    }

    /// The same share with a standby node taking each slashed seat.
    pub fn removed_with_standby(&self) -> Option<f64> {
        Self::share_removed(self.undefended?, self.standby?)
    }

    fn share_removed(u: Spread, defended: Spread) -> Option<f64> {
        (u.mean >= HARMFUL && u.min > 1.0).then(|| (u.mean - defended.mean) / (u.mean - 1.0))
    }

    /// Share of the *damage* removed: the harm above what the honest
    /// members reach alone (the attackers' payloads' doing, not the data
    /// they never brought), where [`Row::removed`] is shown and the
    /// undefended mean is above the honest-alone one by at least the
    /// [`HARMFUL`] margin.
    pub fn damage_removed(&self) -> Option<f64> {
        let u = self.undefended?;
        self.removed()?;
        let floor = self.alone.mean;
        (u.mean - floor >= HARMFUL - 1.0).then(|| (u.mean - self.defended.mean) / (u.mean - floor))
    }
}

/// Which runs beside the defended one each row has.
#[derive(Debug, Clone, Copy)]
pub struct Beside {
    pub undefended: bool,
    pub standby: bool,
}

/// One row per mode and attacker count, from the logged runs.
pub fn rows<'a>(
    seeds: u32,
    fractions: &[f64],
    modes: &[Mode],
    beside: Beside,
    members: usize,
    spe: u32,
    got: &impl Fn(u32, Kind) -> &'a Summary,
) -> Vec<Row> {
    let Beside {
        undefended,
        standby,
    } = beside;
    let mut out = Vec::new();
    let mut counts: Vec<(f64, usize)> = fractions
        .iter()
        .map(|f| (*f, super::attackers(*f, members)))
        .collect();
    counts.dedup_by_key(|(_, c)| *c);
    for &mode in modes {
        for &(fraction, count) in &counts {
            let ratios = |kind: Kind| -> Vec<f64> {
                (0..seeds)
                    .map(|s| got(s, kind).final_val_loss / got(s, Kind::Honest).final_val_loss)
                    .collect()
            };
            let attack = |defend, standby| Kind::Attack {
                mode,
                count,
                defend,
                standby,
            };
            let who = placed(count, members);
            let defended: Vec<&Summary> = (0..seeds).map(|s| got(s, attack(true, false))).collect();
            let caught: usize = defended
                .iter()
                .map(|d| who.iter().filter(|i| d.slashed.contains_key(i)).count())
                .sum();
            let epochs_to_slash = (caught == count * seeds as usize).then(|| {
                defended
                    .iter()
                    .flat_map(|d| who.iter().filter_map(|i| d.slashed.get(i)))
                    .map(|s| s / spe + 1)
                    .max()
                    .unwrap_or(0)
            });
            out.push(Row {
                mode,
                fraction,
                count,
                defended: Spread::of(&ratios(attack(true, false))),
                undefended: undefended.then(|| Spread::of(&ratios(attack(false, false)))),
                standby: standby.then(|| Spread::of(&ratios(attack(true, true)))),
                alone: Spread::of(&ratios(Kind::Alone { count })),
                detection: caught as f64 / (count * seeds as usize) as f64,
                epochs_to_slash,
                overhead: spread(&defended.iter().map(|d| d.overhead()).collect::<Vec<_>>()).0,
                false_accusations: defended.iter().map(|d| d.false_accusations).sum(),
            });
        }
    }
    out
}

fn line(r: &Row) -> String {
    format!(
        "{:<16} {} attackers ({:.0}%): loss ÷ honest {}{}, honest members alone {}, detected {:.0}%, slashed by epoch {}, audit overhead {:.2}%, false accusations {}",
        r.mode.name(),
        r.count,
        100.0 * r.fraction,
        r.defended.cell(),
        r.undefended
            .map(|u| format!(" (undefended {})", u.cell()))
            .unwrap_or_default(),
        r.alone.cell(),
        100.0 * r.detection,
        r.epochs_to_slash.map_or("never".into(), |e| e.to_string()),
        100.0 * r.overhead,
        r.false_accusations
    )
}

pub fn publish(
    name: &str,
    rows: &[Row],
    honest: &[&Summary],
    s: &Setting,
    seeds: u32,
    secs: f64,
) -> Result<()> {
    let Setting {
        members,
        steps,
        spe,
        witness_micro_batch,
        ref audit,
        standby,
        rule,
    } = *s;
    let losses: Vec<f64> = honest.iter().map(|h| h.final_val_loss).collect();
    let loss = Spread::of(&losses);
    let overhead = spread(&honest.iter().map(|h| h.overhead()).collect::<Vec<_>>()).0;
    let flagged = spread(
        &honest
            .iter()
            .map(|h| h.honest_flagged as f64)
            .collect::<Vec<_>>(),
    )
    .0;
    let false_acc: usize = honest.iter().map(|h| h.false_accusations).sum();
    let mut f = Figures::default();
    f.num("members", members as f64)
        .num("steps", steps as f64)
        .num("steps_per_epoch", spe as f64)
        .num("seeds", seeds as f64)
        .text("model", "tiny (ModelConfig::tiny), CPU")
        .text(
            "rule",
            match rule {
                Select::TopK => "top-k (top-4, decay 0.9, lr 2e-3)",
                Select::Shared => "shared (the job recipe)",
            },
        )
        .num("witness_micro_batch", witness_micro_batch as f64)
        .num("harmful_undefended_ratio", HARMFUL)
        .num("audit_rate", audit.rate)
        .num("audit_quorum", audit.quorum as f64)
        .num("audit_min_overlap", audit.min_overlap as f64)
        .num("audit_min_agreement", audit.min_agreement as f64)
        .num(
            "screen_support",
            cohort_engine::audit::SCREEN.support as f64,
        )
        .num(
            "screen_agreement",
            cohort_engine::audit::SCREEN.agreement as f64,
        )
        .num("honest_val_loss", loss.mean)
        .num("honest_val_loss_min", loss.min)
        .num("honest_val_loss_max", loss.max)
        .num("honest_audit_overhead_pct", 100.0 * overhead)
        .num("honest_payloads_flagged", flagged)
        .num("honest_false_accusations", false_acc as f64)
        .num("seconds", secs);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Adversaries{} (`cargo run --release -p cohort-bench -- adversary{}{}`)\n\n\
         {members} members train the tiny model under the {} for {steps} steps ({spe} per epoch) in one process \
         (`engine::arena`), {seeds} seed(s) (each seed: other initial weights and batches); attackers \
         see every honest payload of the step before sending theirs. Witnesses recompute at \
         micro-batch {witness_micro_batch} (the job's is 8): another summation order, so other \
         rounding, as on other hardware. Loss is the final validation loss as a ratio to the honest \
         run of the same seed, as mean (min–max over seeds); the honest run's own loss is {:.4} \
         ({:.4}–{:.4}). *Undefended* is the same attack on the plain sign vote, with no screen, audits \
         or slashing. *Honest alone* is the honest run with as many members fewer as there are \
         attackers (members 0 to n − k − 1, so other data shards than the attackers leave): it shows \
         what losing that much data costs, and, against a defended row whose attackers were slashed \
         at the first step, how much the choice of shards alone moves the loss. *Harm removed* is (undefended − \
         defended) ÷ (undefended − 1) on the means, shown where the undefended mean is at least \
         {HARMFUL} and every seed was harmed. *Damage removed* is (undefended − defended) ÷ \
         (undefended − honest alone): the same, counting as harm only what the attackers' payloads \
         did, not the data they never brought, which no defence can give back (only a new member \
         in the slashed seat can). {}Audits: {:.0}% of contributions at random plus every one \
         the screen flags; a slash needs {} witnesses whose audits failed. Goals: at 33%, at least 80% \
         of the harm removed for every attack that does harm undefended, and loss ≤ 1.10× honest for \
         every mode; every attacker slashed within one epoch; audit overhead ≤ 5%.\n",
        if name == "adversary" {
            String::new()
        } else {
            format!(" over {steps} steps")
        },
        if rule == Select::Shared {
            " --rule shared"
        } else {
            ""
        },
        if name == "adversary" {
            String::new()
        } else {
            format!(" --name {name}")
        },
        match rule {
            Select::TopK =>
                "top-k rule (top-4 per chunk, decay 0.9, lr 2e-3: the job recipe before the shared rule)",
            Select::Shared => "shared rule (the job's recipe)",
        },
        loss.mean,
        loss.min,
        loss.max,
        match standby {
            Some(after) if rows.iter().any(|r| r.standby.is_some()) => format!(
                "*With a standby* is the defended run in which a node waiting for work takes each \
                 slashed seat {after} epoch(s) after the slash's, as `cohort node` joins any open job \
                 it qualifies for: from the shared weights, with no momentum, on the seat's data \
                 shard. It assumes such a node is waiting; *harm removed with a standby* is the \
                 harm-removed share for that run. "
            ),
            _ => String::new(),
        },
        100.0 * audit.rate,
        audit.quorum
    );
    md.push_str("| mode | attackers | loss ÷ honest | undefended | honest alone | harm removed | damage removed | with a standby | harm removed with a standby | detected | all slashed by epoch | audit overhead | false accusations |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let _ = writeln!(
        md,
        "| honest | 0 | 1.000 | 1.000 | – | – | – | – | – | – | – | {:.2}% ({flagged:.1} honest payloads flagged per run) | {false_acc} |",
        100.0 * overhead,
    );
    let mut worst_33 = 0.0f64;
    let mut least_removed_33 = f64::INFINITY;
    let mut least_damage_33 = f64::INFINITY;
    let mut least_standby_33 = f64::INFINITY;
    for r in rows {
        println!("{}", line(r));
        let pct = (100.0 * r.fraction).round() as u32;
        let key = format!("{}_{pct}", r.mode.name().replace('-', "_"));
        let removed = r.removed();
        let damage = r.damage_removed();
        let with_standby = r.removed_with_standby();
        if pct == 33 {
            if let Some(x) = with_standby {
                least_standby_33 = least_standby_33.min(x);
            }
            worst_33 = worst_33.max(r.defended.mean);
            if let Some(x) = removed {
                least_removed_33 = least_removed_33.min(x);
            }
            if let Some(x) = damage {
                least_damage_33 = least_damage_33.min(x);
            }
        }
        let nan = f64::NAN;
        // A ratio over seeds as `<name>`, `<name>_min`, `<name>_max`.
        let ratio = |f: &mut Figures, name: &str, v: Option<Spread>| {
            f.num(&format!("{key}_{name}"), v.map_or(nan, |x| x.mean))
                .num(&format!("{key}_{name}_min"), v.map_or(nan, |x| x.min))
                .num(&format!("{key}_{name}_max"), v.map_or(nan, |x| x.max));
        };
        f.num(&format!("{key}_attackers"), r.count as f64);
        ratio(&mut f, "loss_ratio", Some(r.defended));
        ratio(&mut f, "undefended_loss_ratio", r.undefended);
        f.num(&format!("{key}_alone_loss_ratio"), r.alone.mean)
            .num(&format!("{key}_harm_removed"), removed.unwrap_or(nan))
            .num(&format!("{key}_damage_removed"), damage.unwrap_or(nan));
        // Standby figures only in a table that has standby runs.
        if rows.iter().any(|r| r.standby.is_some()) {
            ratio(&mut f, "standby_loss_ratio", r.standby);
            f.num(
                &format!("{key}_harm_removed_with_standby"),
                with_standby.unwrap_or(nan),
            );
        }
        f.num(&format!("{key}_detection"), r.detection)
            .num(
                &format!("{key}_epochs_to_slash"),
                r.epochs_to_slash.map_or(nan, f64::from),
            )
            .num(&format!("{key}_audit_overhead_pct"), 100.0 * r.overhead)
            .num(
                &format!("{key}_false_accusations"),
                r.false_accusations as f64,
            );
        let _ = writeln!(
            md,
            "| {} | {} of {members} ({pct}%) | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {} | {:.2}% | {} |",
            r.mode.name(),
            r.count,
            r.defended.cell(),
            r.undefended.map_or("–".into(), |u| u.cell()),
            r.alone.cell(),
            match (removed, r.undefended) {
                (Some(x), _) => format!("{:.0}%", 100.0 * x),
                (None, Some(_)) => "– (no harm undefended)".into(),
                (None, None) => "–".into(),
            },
            damage.map_or("–".into(), |x| format!("{:.0}%", 100.0 * x)),
            r.standby.map_or("–".into(), |x| x.cell()),
            with_standby.map_or("–".into(), |x| format!("{:.0}%", 100.0 * x)),
            100.0 * r.detection,
            r.epochs_to_slash.map_or("never".into(), |e| e.to_string()),
            100.0 * r.overhead,
            r.false_accusations
        );
    }
    f.num("worst_loss_ratio_at_33", worst_33)
        .num("least_harm_removed_at_33", least_removed_33)
        .num("least_damage_removed_at_33", least_damage_33)
        .num("least_harm_removed_at_33_with_standby", least_standby_33)
        .num("standby_epochs", standby.map_or(f64::NAN, f64::from));
    let goal = |ok: bool| if ok { "met" } else { "not met" };
    let removed_line = if least_removed_33.is_finite() {
        format!(
            "least harm removed at 33%: **{:.0}%** (goal ≥ 80%: {})",
            100.0 * least_removed_33,
            goal(least_removed_33 >= 0.8)
        )
    } else {
        "no attack at 33% did harm undefended on every seed, so the harm-removed goal was not tested"
            .into()
    };
    let removed_line = if least_damage_33.is_finite() {
        format!(
            "{removed_line}; least damage removed at 33% (harm above the honest members alone): \
             **{:.0}%** (not the goal's measure)",
            100.0 * least_damage_33
        )
    } else {
        removed_line
    };
    let removed_line = if least_standby_33.is_finite() {
        format!(
            "{removed_line}; with a standby node in each slashed seat, least harm removed at 33%: \
             **{:.0}%** (goal ≥ 80%: {})",
            100.0 * least_standby_33,
            goal(least_standby_33 >= 0.8)
        )
    } else {
        removed_line
    };
    let _ = writeln!(
        md,
        "\nWorst loss ratio at 33%: **{worst_33:.3}** (goal ≤ 1.10: {}); {removed_line}. \
         Not in this table: `scale` is a no-op (top-k selection and the sign vote ignore a payload's \
         scale, so it can neither harm nor be detected); the equivocating leader attacks manifests, and \
         the arena has no leaders: it is measured over the network by `engine/tests/p2p.rs` (the \
         lying-leader run: evidence recorded, reported on chain, no honest node fails its epoch). \
         Where attackers are slashed at the first step, the run continues with the honest members \
         only, so its loss is the *honest alone* one: what the attackers took away is their data, \
         not damage they did. Audit overhead counts the witnesses' gradient recomputations (the \
         momentum chain check included); the screen (two passes over the votes) is not counted. \
         *forged-momentum* is not one of the nine: a sign-flipper that reveals momenta forged so its \
         flipped payloads recompute exactly; one-step audits pass it, and only the momentum chain \
         (`audit::chain_error`) convicts it. *collude* is not one of the nine either: the step's \
         attackers act as one, sharing the honest votes and splitting their slots so that together \
         they overturn as many honest coefficients as they can, thinnest margins first (ALIE \
         coordinated); each overturning vote sees the others' votes tied, and the screen counts a tie \
         half, so it flags them. *collude-hidden* is the colluders' answer: one vote more than a margin \
         needs, so each colluder sees the others agree with it, and left-over slots vote with the \
         strongest honest majorities; the screen cannot tell it from honest work, so only random \
         audits find it, and it overturns fewer coefficients. Every run is kept in `docs/bench/adversary-runs.jsonl` as \
         it ends, so the same command resumes a sweep cut short; the runs took {secs:.0} s in all.",
        goal(worst_33 <= 1.10)
    );
    println!("\nworst loss ratio at 33%: {worst_33:.3} (goal ≤ 1.10); {removed_line}");
    report::publish(name, &f, &md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(defended: f64, undefended: [f64; 3]) -> Row {
        Row {
            mode: Mode::SignFlip,
            fraction: 0.33,
            count: 3,
            defended: Spread::of(&[defended; 3]),
            undefended: Some(Spread::of(&undefended)),
            standby: Some(Spread::of(&[1.0; 3])),
            alone: Spread::of(&[1.01; 3]),
            detection: 1.0,
            epochs_to_slash: Some(1),
            overhead: 0.01,
            false_accusations: 0,
        }
    }

    #[test]
    fn harm_counts_only_when_the_mean_is_large_and_every_seed_was_harmed() {
        // (1.20 − 1.04) ÷ (1.20 − 1) = 80%.
        let r = row(1.04, [1.15, 1.20, 1.25]);
        assert!((r.removed().unwrap() - 0.8).abs() < 1e-9);
        // Against the honest members alone (1.01): (1.20 − 1.04) ÷ (1.20 − 1.01).
        assert!((r.damage_removed().unwrap() - 0.16 / 0.19).abs() < 1e-9);
        // A large mean from one seed, another seed unharmed: within the
        // spread, not harm.
        assert_eq!(row(1.0, [0.99, 1.0, 1.2]).removed(), None);
        // Every seed harmed, but too little.
        assert_eq!(row(1.0, [1.005, 1.01, 1.015]).removed(), None);
        // With the slashed seats taken, the loss is the honest run's: all
        // of the harm is removed.
        assert!((r.removed_with_standby().unwrap() - 1.0).abs() < 1e-9);
        // A defence that makes it worse removes a negative share.
        assert!(row(1.30, [1.15, 1.20, 1.25]).removed().unwrap() < 0.0);
    }
}
