//! Settings: network, data folder, training device, memory cap, when to
//! train and starting with the computer. Saved to the data folder; secrets never are.

use super::{Out, field, heading};
use crate::gui::model::Model;
use crate::gui::settings::{Gpu, Network, Settings};
use crate::gui::worker::Command;
use eframe::egui;
use std::path::PathBuf;

pub struct Form {
    pub draft: Settings,
    pub data_dir: String,
}

impl Form {
    pub fn new(s: &Settings) -> Self {
        Self {
            draft: s.clone(),
            data_dir: s.data_dir.display().to_string(),
        }
    }
}

pub fn show(ui: &mut egui::Ui, model: &Model, f: &mut Form, out: &mut Out) {
    heading(ui, "Settings");
    let d = &mut f.draft;
    ui.horizontal(|ui| {
        ui.add_sized([150.0, 20.0], egui::Label::new("Network"));
        egui::ComboBox::from_id_salt("network")
            .selected_text(d.network.label())
            .show_ui(ui, |ui| {
                for n in Network::ALL {
                    ui.selectable_value(&mut d.network, n, n.label());
                }
            });
    });
    if let Some(url) = d.network.url() {
        ui.weak(format!("RPC {url}"));
    }
    if d.network == Network::Custom {
        field(ui, "RPC URL", &mut d.custom_url, false);
        field(ui, "Program id", &mut d.program_id, false);
    }
    if d.network == Network::Sandbox {
        ui.weak(
            "A chain, a demo job and two peers, all on this computer. Nothing real is at stake.",
        );
    }
    field(ui, "Data folder", &mut f.data_dir, false);
    ui.horizontal(|ui| {
        ui.add_sized([150.0, 20.0], egui::Label::new("Training device"));
        egui::ComboBox::from_id_salt("gpu")
            .selected_text(d.gpu.label())
            .show_ui(ui, |ui| {
                for g in Gpu::ALL {
                    ui.selectable_value(&mut d.gpu, g, g.label());
                }
            });
    });
    ui.horizontal(|ui| {
        ui.add_sized([150.0, 20.0], egui::Label::new("Memory cap (MiB)"));
        ui.add(egui::DragValue::new(&mut d.memory_cap_mib).range(0..=1_048_576));
        ui.weak("0 = no cap");
    });
    when_to_train(
        ui,
        model,
        &mut d.when,
        &mut d.release_gpu_memory_when_paused,
    );
    ui.add_space(8.0);
    ui.checkbox(
        &mut d.start_with_computer,
        "Start with the computer (minimised, training by the rules above)",
    );
    ui.add_space(8.0);
    if ui.button("Save settings").clicked() {
        d.data_dir = PathBuf::from(f.data_dir.trim());
        out.push(Command::ApplySettings(d.clone()));
    }
    ui.separator();
    match &model.network_state {
        Some(Ok(())) => ui.label(format!("Connected to {}", model.network)),
        Some(Err(e)) => {
            ui.colored_label(egui::Color32::LIGHT_RED, format!("{}: {e}", model.network))
        }
        None => ui.label("Connecting…"),
    };
}

/// The "when to train" rules ([`crate::when::Rules`]).
fn when_to_train(ui: &mut egui::Ui, model: &Model, w: &mut crate::when::Rules, release: &mut bool) {
    ui.add_space(8.0);
    ui.strong("When to train");
    ui.horizontal(|ui| {
        ui.add_sized([150.0, 20.0], egui::Label::new("Idle for (minutes)"));
        ui.add(egui::DragValue::new(&mut w.idle_minutes).range(0..=240));
        ui.weak("0 = also while you use the computer");
    });
    ui.checkbox(
        &mut w.pause_on_fullscreen,
        "Pause while a full-screen program (a game) is in front",
    );
    ui.horizontal(|ui| {
        ui.add_sized([150.0, 20.0], egui::Label::new("GPU busy above (%)"));
        ui.add(egui::DragValue::new(&mut w.busy_gpu_percent).range(1..=100));
        ui.weak("other programs' use; 100 = never pause for it");
    });
    ui.checkbox(&mut w.pause_on_battery, "Pause on battery");
    ui.horizontal(|ui| {
        ui.add_sized([150.0, 20.0], egui::Label::new("GPU limit (°C)"));
        ui.add(egui::DragValue::new(&mut w.thermal_limit_c).range(0..=110));
        ui.weak(format!(
            "pauses there, resumes {} °C below; 0 = no limit",
            crate::when::COOL_DOWN_C
        ));
    });
    let mut scheduled = w.schedule.is_some();
    ui.checkbox(&mut scheduled, "Only during these hours");
    match (scheduled, &mut w.schedule) {
        (false, s) => *s = None,
        (true, s @ None) => {
            *s = Some(crate::when::Window {
                from: 22 * 60,
                until: 7 * 60,
            })
        }
        (true, Some(win)) => {
            ui.horizontal(|ui| {
                ui.add_sized([150.0, 20.0], egui::Label::new("From, until (hour)"));
                let mut from = win.from / 60;
                let mut until = win.until / 60;
                ui.add(egui::DragValue::new(&mut from).range(0..=23));
                ui.add(egui::DragValue::new(&mut until).range(0..=23));
                win.from = from * 60;
                win.until = until * 60;
            });
        }
    }
    ui.checkbox(
        release,
        "While paused, give the GPU's memory back (resuming takes a moment longer)",
    );
    if !model.sensors_missing.is_empty() {
        ui.weak(format!(
            "Not readable on this computer yet, so never a reason to pause: {}.",
            model.sensors_missing.join(", ")
        ));
    }
}
