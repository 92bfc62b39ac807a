//! The machine benchmark: adapters found, measured throughput and
//! bandwidth against well-known cards, and the signed attestation that
//! registering the node submits.

use super::{Out, bar, heading};
use crate::benchmark::REFERENCES;
use crate::gui::model::Model;
use crate::gui::worker::Command;
use cohort_program::state::Backend;
use eframe::egui;

pub fn show(ui: &mut egui::Ui, model: &Model, out: &mut Out) {
    heading(ui, "GPU benchmark");
    ui.label(
        "Measures what this machine can train with. The result is signed with \
         your wallet and is what the job board sees when you join.",
    );
    super::training::gpu_health(ui, model);
    ui.horizontal(|ui| {
        let label = if model.bench.is_some() {
            "Run again"
        } else {
            "Run benchmark"
        };
        if ui
            .add_enabled(!model.benchmarking, egui::Button::new(label))
            .clicked()
        {
            out.push(Command::RunBenchmark);
        }
        if model.benchmarking {
            ui.spinner();
            ui.label("Benchmarking…");
        }
    });
    let Some((r, att)) = &model.bench else {
        return;
    };
    ui.separator();
    ui.strong("Devices found");
    egui::Grid::new("adapters").striped(true).show(ui, |ui| {
        ui.label(format!("CPU ({} threads)", r.cpu_threads));
        ui.label(format!("{:.1} GFLOPS fp32", r.cpu_fp32_gflops));
        ui.end_row();
        match &r.cuda {
            Some(Ok(name)) => {
                ui.label("CUDA");
                ui.label(name);
            }
            Some(Err(why)) => {
                ui.label("CUDA");
                ui.weak(why);
            }
            None => {}
        }
        ui.end_row();
        if r.adapters.is_empty() {
            ui.label("wgpu");
            ui.weak("no Vulkan / Metal / DX12 adapter found");
            ui.end_row();
        }
        for d in &r.devices {
            ui.label(format!(
                "{} ({}, {})",
                d.adapter.name, d.adapter.kind, d.adapter.api
            ));
            let fp16 = d
                .fp16_tflops
                .map_or("fp16 unsupported".into(), |v| format!("{} fp16", flops(v)));
            ui.label(format!(
                "{} fp32 · {fp16} · {:.1} GB/s",
                flops(d.fp32_tflops),
                d.bandwidth_gbps
            ));
            ui.end_row();
        }
        for f in &r.failures {
            ui.label("failed");
            ui.weak(f);
            ui.end_row();
        }
    });
    ui.separator();
    let (backend, name, fp32, _, bw, _) = r.training_device();
    ui.strong(format!("Trains on: {name}"));
    if backend == Backend::Cpu {
        ui.weak("No hardware GPU is usable here, so training runs on the CPU.");
    }
    ui.add_space(4.0);
    for (card, tflops, gbps) in REFERENCES {
        bar(
            ui,
            fp32,
            tflops * 1e3,
            format!(
                "fp32 vs {card}: {:.2}% of {tflops} TFLOPS",
                100.0 * fp32 / (tflops * 1e3)
            ),
        );
        if bw > 0.0 {
            bar(
                ui,
                bw,
                *gbps,
                format!(
                    "bandwidth vs {card}: {:.1}% of {gbps} GB/s",
                    100.0 * bw / gbps
                ),
            );
        }
    }
    ui.separator();
    ui.strong("Signed attestation");
    ui.monospace(format!(
        "{} · backend {} · {} GFLOPS fp32 · {} GFLOPS fp16 · {} GB/s",
        att.device_name(),
        att.backend,
        att.fp32_gflops,
        att.fp16_gflops,
        att.mem_bw_gbps
    ));
    let sig: String = att.signature[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    ui.monospace(format!("signature {sig}… (measured in {:.1} s)", r.secs));
}

/// TFLOPS, or GFLOPS for slow (software) devices.
fn flops(tflops: f64) -> String {
    if tflops >= 0.1 {
        format!("{tflops:.2} TFLOPS")
    } else {
        format!("{:.1} GFLOPS", tflops * 1e3)
    }
}
