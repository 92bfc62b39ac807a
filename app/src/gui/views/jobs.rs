//! The job board: jobs on chain, filter and sort, whether this machine
//! qualifies (and why not), and Join with a confirmation that shows the
//! stake and the expected earnings.

use super::{Out, heading, short};
use crate::chain::sol;
use crate::gui::model::Model;
use crate::gui::worker::{Command, JobRow, stake_for};
use eframe::egui;
use solana_sdk::pubkey::Pubkey;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sort {
    #[default]
    Newest,
    Price,
    SlotsLeft,
    Progress,
}

#[derive(Default)]
pub struct Form {
    pub filter: String,
    pub sort: Sort,
    pub qualifying_only: bool,
    /// The job whose Join confirmation is open.
    pub confirm: Option<Pubkey>,
}

fn slots(r: &JobRow) -> u32 {
    (r.job.spec.max_nodes as u32).saturating_sub(r.job.member_count)
}

/// The rows to show, filtered and sorted.
pub fn visible<'a>(rows: &'a [JobRow], f: &Form) -> Vec<&'a JobRow> {
    let needle = f.filter.trim().to_lowercase();
    let mut v: Vec<&JobRow> = rows
        .iter()
        .filter(|r| !f.qualifying_only || r.blocker.is_none())
        .filter(|r| {
            needle.is_empty()
                || r.address.to_string().to_lowercase().contains(&needle)
                || r.job.spec.arch_str().to_lowercase().contains(&needle)
        })
        .collect();
    match f.sort {
        Sort::Newest => v.sort_by_key(|r| std::cmp::Reverse(r.job.created_at)),
        Sort::Price => v.sort_by_key(|r| std::cmp::Reverse(r.job.spec.max_price)),
        Sort::SlotsLeft => v.sort_by_key(|r| std::cmp::Reverse(slots(r))),
        Sort::Progress => v.sort_by_key(|r| r.job.epochs_finalized),
    }
    v
}

pub fn show(ui: &mut egui::Ui, model: &mut Model, f: &mut Form, out: &mut Out) {
    heading(ui, "Job board");
    ui.horizontal(|ui| {
        let l = ui.label("Filter");
        ui.add(egui::TextEdit::singleline(&mut f.filter).desired_width(200.0))
            .labelled_by(l.id);
        egui::ComboBox::from_label("Sort by")
            .selected_text(format!("{:?}", f.sort))
            .show_ui(ui, |ui| {
                for s in [Sort::Newest, Sort::Price, Sort::SlotsLeft, Sort::Progress] {
                    ui.selectable_value(&mut f.sort, s, format!("{s:?}"));
                }
            });
        ui.checkbox(
            &mut f.qualifying_only,
            "Only jobs this machine qualifies for",
        );
    });
    ui.add_space(6.0);
    let rows = visible(&model.jobs, f);
    if rows.is_empty() {
        ui.label("No jobs to show.");
    }
    let joined = model.training.job.is_some() && model.training.finished.is_none();
    egui::Grid::new("jobs")
        .striped(true)
        .spacing([14.0, 6.0])
        .show(ui, |ui| {
            for h in [
                "Job",
                "Model",
                "Progress",
                "Pays / epoch",
                "This machine earns ≈",
                "Slots left",
                "State",
                "This machine",
                "",
            ] {
                ui.strong(h);
            }
            ui.end_row();
            for r in rows {
                let j = &r.job;
                ui.monospace(short(&r.address.to_string()));
                ui.label(j.spec.arch_str());
                ui.label(format!("{} / {} epochs", j.epochs_finalized, j.spec.epochs));
                ui.label(sol(j.spec.max_price));
                match estimate(model, r) {
                    Some(e) => ui.label(format!(
                        "{} / hour · {} / day",
                        sol(e.per_hour),
                        sol(e.per_day)
                    )),
                    None => ui.weak("run the benchmark"),
                };
                ui.label(slots(r).to_string());
                ui.label(format!("{:?}", j.state));
                match &r.blocker {
                    None => ui.colored_label(egui::Color32::from_rgb(60, 170, 90), "qualifies"),
                    Some(why) => ui.weak(why),
                };
                let can = r.blocker.is_none() && !joined;
                if ui.add_enabled(can, egui::Button::new("Join")).clicked() {
                    f.confirm = Some(r.address);
                }
                ui.end_row();
            }
        });
    confirm(ui, model, f, out);
}

/// Pay per hour and per day on `r` for this machine, from its benchmark.
fn estimate(model: &Model, r: &JobRow) -> Option<crate::estimate::Estimate> {
    let (_, att) = model.bench.as_ref()?;
    let left = r.job.spec.epochs.saturating_sub(r.job.epochs_finalized);
    crate::estimate::before_joining(&r.job.spec, left, f64::from(att.fp32_gflops))
}

fn confirm(ui: &mut egui::Ui, model: &mut Model, f: &mut Form, out: &mut Out) {
    let Some(k) = f.confirm else {
        return;
    };
    let Some(r) = model.jobs.iter().find(|r| r.address == k) else {
        f.confirm = None;
        return;
    };
    let est = estimate(model, r);
    let j = &r.job;
    let stake = stake_for(j);
    let left = j.spec.epochs.saturating_sub(j.epochs_finalized);
    let expected = j.spec.max_price * left as u64;
    let mut close = false;
    egui::Modal::new(egui::Id::new("join-confirm")).show(ui.ctx(), |ui| {
        ui.heading("Join this job?");
        ui.label(format!("Job {k}"));
        ui.label(format!("Model {} · {} epochs of {} steps", j.spec.arch_str(), j.spec.epochs, j.spec.steps_per_epoch));
        ui.add_space(6.0);
        ui.label(format!(
            "Stake: {} (locked while you are registered; slashed only if audits prove cheating)",
            sol(stake)
        ));
        ui.label(format!(
            "Expected earnings: up to {} ({} per epoch × {left} epochs left), paid per attested epoch",
            sol(expected),
            sol(j.spec.max_price)
        ));
        if let Some(e) = est {
            ui.label(format!(
                "On this machine: about {} an hour, {} a day (epochs of about {:.0} s, {}; \
                 assuming training reaches {:.0}% of the benchmark's speed)",
                sol(e.per_hour),
                sol(e.per_day),
                e.epoch_secs,
                if e.machine_bound {
                    "set by this machine's speed"
                } else {
                    "set by the job's pace"
                },
                crate::estimate::TRAINING_SHARE * 100.0
            ));
        }
        ui.label("Joining registers this machine if needed, posts the stake and joins, in one go.");
        ui.add_space(6.0);
        ui.horizontal(|ui| {
            if ui.button("Confirm and join").clicked() {
                model.pending = Some("Joining".into());
                out.push(Command::Join { job: k });
                close = true;
            }
            if ui.button("Cancel").clicked() {
                close = true;
            }
        });
    });
    if close {
        f.confirm = None;
    }
}
