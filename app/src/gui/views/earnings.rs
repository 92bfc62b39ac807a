//! Earnings: per epoch, claimable now, claimed so far, over time; Claim.

use super::{Out, heading};
use crate::chain::sol;
use crate::gui::model::Model;
use crate::gui::worker::Command;
use eframe::egui;
use egui_plot::{Bar, BarChart, Line, Plot, PlotPoints};

pub fn show(ui: &mut egui::Ui, model: &mut Model, out: &mut Out) {
    heading(ui, "Earnings");
    let Some(e) = model.earnings.clone() else {
        ui.label("Join a job to start earning. Earnings appear here as epochs are attested.");
        return;
    };
    ui.horizontal(|ui| {
        for (label, v) in [
            ("Claimable now", e.claimable),
            ("Claimed so far", e.claimed),
        ] {
            ui.vertical(|ui| {
                ui.label(label);
                ui.label(egui::RichText::new(sol(v)).size(22.0).strong());
            });
            ui.add_space(30.0);
        }
    });
    let busy = model.pending.is_some();
    if ui
        .add_enabled(e.claimable > 0 && !busy, egui::Button::new("Claim"))
        .clicked()
    {
        model.pending = Some("Claiming".into());
        out.push(Command::Claim);
    }
    ui.label(format!("Epochs attested on chain: {}", e.epochs_finalized));
    ui.separator();
    ui.columns(2, |c| {
        let ui = &mut c[0];
        ui.strong("Per epoch");
        let bars: Vec<Bar> = e
            .per_epoch
            .iter()
            .map(|(ep, l)| Bar::new(*ep as f64 + 1.0, *l as f64 / 1e9).width(0.6))
            .collect();
        // Whole epochs on the axis, from 0, however few there are yet.
        let last = e.per_epoch.iter().map(|(ep, _)| *ep + 1).max().unwrap_or(1);
        Plot::new("per-epoch")
            .height(160.0)
            .include_x(0.0)
            .include_x(last as f64 + 1.0)
            .include_y(0.0)
            .allow_drag(false)
            .allow_zoom(false)
            .allow_scroll(false)
            .x_axis_label("epoch")
            .show(ui, |p| p.bar_chart(BarChart::new("SOL", bars)));
        egui::Grid::new("epochs").striped(true).show(ui, |ui| {
            for (ep, l) in &e.per_epoch {
                ui.label(format!("Epoch {}", ep + 1));
                ui.monospace(sol(*l));
                ui.end_row();
            }
        });
        let ui = &mut c[1];
        ui.strong("Earned over time");
        let pts: PlotPoints = model.earned_series.iter().copied().collect();
        Plot::new("over-time")
            .height(160.0)
            .include_y(0.0)
            .allow_drag(false)
            .allow_zoom(false)
            .allow_scroll(false)
            .x_axis_label("seconds")
            .show(ui, |p| p.line(Line::new("SOL earned", pts)));
    });
}
