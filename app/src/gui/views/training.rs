//! Live training: state, progress, the loss curve, where each step's time
//! went, the job's members, and Pause / Resume / Leave.

use super::{Out, bar, heading};
use crate::gui::model::Model;
use crate::gui::worker::Command;
use eframe::egui;
use egui_plot::{Line, Plot, PlotPoints};

pub fn show(ui: &mut egui::Ui, model: &Model, out: &mut Out) {
    heading(ui, "Training");
    let t = &model.training;
    ui.strong(t.status());
    gpu_health(ui, model);
    if t.job.is_none() {
        ui.label("Pick a job on the Job board and press Join.");
        return;
    }
    match model.earning_rate() {
        Some(r) => ui.label(format!(
            "Earning about {} an hour since you joined ({} a day at this rate)",
            crate::chain::sol(r),
            crate::chain::sol(r.saturating_mul(24))
        )),
        None => ui.weak("Earning rate: shown once an epoch you trained has been paid"),
    };
    let job = model.training_job();
    let epochs = job.map_or(0, |r| r.job.spec.epochs);
    ui.add_space(6.0);
    bar(
        ui,
        t.epoch as f64
            + if t.of > 0 {
                t.done as f64 / t.of as f64
            } else {
                0.0
            },
        epochs as f64,
        format!("Epoch {} of {epochs}", (t.epoch + 1).min(epochs.max(1))),
    );
    bar(
        ui,
        t.done as f64,
        t.of as f64,
        format!("Step {} of {}", t.done, t.of),
    );
    ui.add_space(6.0);
    ui.horizontal(|ui| {
        let running = t.finished.is_none();
        if t.paused {
            if ui
                .add_enabled(running, egui::Button::new("Resume"))
                .clicked()
            {
                out.push(Command::Resume);
            }
        } else if ui
            .add_enabled(running, egui::Button::new("Pause"))
            .clicked()
        {
            out.push(Command::Pause);
        }
        if ui
            .add_enabled(running, egui::Button::new("Leave"))
            .clicked()
        {
            out.push(Command::Leave);
        }
    });
    ui.add_space(6.0);
    ui.columns(2, |c| {
        let ui = &mut c[0];
        ui.strong("Loss");
        let pts: PlotPoints = t.loss.iter().copied().collect();
        Plot::new("loss")
            .height(180.0)
            .allow_drag(false)
            .allow_zoom(false)
            .allow_scroll(false)
            .x_axis_label("step")
            .show(ui, |p| p.line(Line::new("loss", pts)));
        let ui = &mut c[1];
        ui.strong("Last step");
        let total = t.compute + t.comm;
        egui::Grid::new("step-split").show(ui, |ui| {
            ui.label("Compute");
            ui.label(format!("{:.0} ms", t.compute * 1e3));
            ui.end_row();
            ui.label("Communication");
            ui.label(format!("{:.0} ms", t.comm * 1e3));
            ui.end_row();
            ui.label("Device busy");
            ui.label(if total > 0.0 {
                format!("{:.0}% of the step", 100.0 * t.compute / total)
            } else {
                "—".into()
            });
            ui.end_row();
            ui.label("Loss");
            ui.label(t.loss.last().map_or("—".into(), |l| format!("{:.3}", l[1])));
            ui.end_row();
        });
        ui.add_space(6.0);
        ui.strong("Peers");
        if let Some(r) = job {
            ui.label(format!(
                "{} members; {} contributed to the last step",
                r.job.member_count, t.contributors
            ));
            ui.label(format!(
                "Epochs attested on chain: {} of {}",
                r.job.epochs_finalized, r.job.spec.epochs
            ));
        }
        egui::Grid::new("peers").striped(true).show(ui, |ui| {
            for h in ["Member", "Latency", "Received"] {
                ui.strong(h);
            }
            ui.end_row();
            for p in &t.peers {
                ui.label(format!("member {}", p.member));
                ui.label(p.rtt_ms.map_or("…".into(), |ms| format!("{ms:.1} ms")));
                ui.label(format!(
                    "{:.1} KB/s ({:.1} MB in all)",
                    p.rate / 1e3,
                    p.bytes_in as f64 / 1e6
                ));
                ui.end_row();
            }
        });
        ui.label(audits_line(t.audits, t.audits_failed));
    });
    ui.separator();
    for l in &t.lines {
        ui.weak(l);
    }
}

/// What this node's audits of the others came to.
pub fn audits_line(audits: u32, failed: u32) -> String {
    match (audits, failed) {
        (0, _) => {
            "Audits: none yet (witnesses audit flagged and randomly drawn contributions)".into()
        }
        (n, 0) => format!("Audits run as a witness: {n}, all passed"),
        (n, f) => format!("Audits run as a witness: {n}, {f} failed (reported for slashing)"),
    }
}

/// The GPU's temperature, power, load and memory, or why they are not shown.
pub fn gpu_health(ui: &mut egui::Ui, model: &Model) {
    match &model.gpu {
        Some(g) => ui.label(format!("GPU: {}", g.words())),
        None => ui.weak(
            "GPU health: not readable here (needs an NVIDIA driver, or a Linux GPU driver \
             that reports its load)",
        ),
    };
}

#[cfg(test)]
mod tests {
    use super::audits_line;

    #[test]
    fn the_audit_tally_says_what_happened() {
        assert!(audits_line(0, 0).starts_with("Audits: none yet"));
        assert_eq!(audits_line(4, 0), "Audits run as a witness: 4, all passed");
        assert!(audits_line(5, 2).contains("2 failed"));
    }
}
