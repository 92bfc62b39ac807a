//! `cohort app --tour DIR`: the real app, in a real window, walked through
//! every screen on a fresh Sandbox wallet the way a new user would go,
//! saving a screenshot of each and the frame times seen while training.
//! `scripts/screenshots.sh` runs it under Xvfb.

use super::CohortApp;
use super::views::Screen;
use super::views::onboarding::{Source, Stage};
use super::worker::Command;
use eframe::egui;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

const PASS: &str = "correct horse battery";

pub struct Tour {
    dir: PathBuf,
    data: PathBuf,
    step: usize,
    /// When the current step began (conditions are given time to settle).
    since: Instant,
    waiting_shot: Option<String>,
    frames_training: Vec<f64>,
    cpu_training: Vec<f64>,
    failed: Option<String>,
}

impl Tour {
    pub fn new(dir: PathBuf, data: PathBuf) -> Self {
        Self {
            dir,
            data,
            step: 0,
            since: Instant::now(),
            waiting_shot: None,
            frames_training: Vec::new(),
            cpu_training: Vec::new(),
            failed: None,
        }
    }

    fn shoot(&mut self, ctx: &egui::Context, name: &str) {
        self.waiting_shot = Some(name.to_string());
        ctx.send_viewport_cmd(egui::ViewportCommand::Screenshot(egui::UserData::new(
            name.to_string(),
        )));
    }

    fn next(&mut self) {
        self.step += 1;
        self.since = Instant::now();
    }

    /// Called once per frame after the app drew.
    pub fn frame(&mut self, app: &mut CohortApp, ctx: &egui::Context) {
        ctx.request_repaint_after(Duration::from_millis(100));
        // Screenshots come back as events a frame or two later.
        let shots: Vec<(String, std::sync::Arc<egui::ColorImage>)> = ctx.input(|i| {
            i.raw
                .events
                .iter()
                .filter_map(|e| match e {
                    egui::Event::Screenshot {
                        user_data, image, ..
                    } => user_data
                        .data
                        .as_ref()
                        .and_then(|d| d.downcast_ref::<String>())
                        .map(|n| (n.clone(), image.clone())),
                    _ => None,
                })
                .collect()
        });
        for (name, img) in shots {
            if let Err(e) = save(&self.dir.join(format!("{name}.png")), &img) {
                self.failed = Some(format!("saving {name}: {e}"));
            }
            println!("screenshot {name}");
            if self.waiting_shot.as_deref() == Some(name.as_str()) {
                self.waiting_shot = None;
                self.next();
            }
        }
        if self.waiting_shot.is_some() {
            return;
        }
        let m = &app.model;
        let settled = self.since.elapsed() > Duration::from_millis(600);
        if self.since.elapsed() > Duration::from_secs(600) {
            self.failed = Some(format!(
                "step {} did not happen within 10 minutes",
                self.step
            ));
        }
        if let Some(f) = &self.failed {
            eprintln!("tour failed: {f}");
            self.finish(app, ctx);
            return;
        }
        if app.views.screen == Screen::Training && app.model.training.of > 0 {
            if let Some(ms) = app.frame_ms.last() {
                self.frames_training.push(*ms);
            }
            if let Some(ms) = app.frame_cpu_ms.last() {
                self.cpu_training.push(*ms);
            }
        }
        match self.step {
            0 if m.keystore_exists == Some(false) && settled => self.shoot(ctx, "01-welcome"),
            1 => {
                app.send(Command::NewPhrase { words: 12 });
                app.views.onboarding.stage = Stage::ShowPhrase;
                self.next();
            }
            2 if m.phrase.is_some() && settled => self.shoot(ctx, "02-recovery-phrase"),
            3 => {
                app.views.onboarding.stage = Stage::Confirm;
                self.next();
            }
            4 if settled => self.shoot(ctx, "03-confirm-phrase"),
            5 => {
                app.views.onboarding.stage = Stage::Passphrase(Source::Created);
                self.next();
            }
            6 if settled => self.shoot(ctx, "04-passphrase"),
            7 => {
                if let Some(p) = app.model.phrase.clone() {
                    app.send(Command::SaveWallet {
                        from: super::worker::NewWallet::Phrase(p),
                        pass: Zeroizing::new(PASS.into()),
                    });
                    self.next();
                }
            }
            8 if m.address.is_some() && matches!(m.network_state, Some(Ok(()))) => {
                app.send(Command::Airdrop);
                self.next();
            }
            9 if m.balance.unwrap_or(0) > 0 && settled => {
                app.views.screen = Screen::Wallet;
                self.shoot(ctx, "05-wallet");
            }
            10 => {
                app.send(Command::RunBenchmark);
                app.views.screen = Screen::Benchmark;
                self.next();
            }
            11 if m.bench.is_some() && settled => self.shoot(ctx, "06-benchmark"),
            12 => {
                app.views.screen = Screen::Jobs;
                self.next();
            }
            13 if !m.jobs.is_empty() && settled => self.shoot(ctx, "07-job-board"),
            14 => {
                app.views.jobs.confirm = m.jobs.first().map(|r| r.address);
                self.next();
            }
            15 if settled => self.shoot(ctx, "08-join-confirm"),
            16 => {
                if let Some(k) = app.views.jobs.confirm.take() {
                    app.send(Command::Join { job: k });
                }
                app.views.screen = Screen::Training;
                self.next();
            }
            // Into the second epoch: a loss curve with some length.
            17 if m.training.epoch >= 1 && m.training.done >= m.training.of / 2 => {
                self.shoot(ctx, "09-training")
            }
            18 if m.earnings.as_ref().is_some_and(|e| e.claimable > 0) => {
                app.views.screen = Screen::Earnings;
                self.next();
            }
            19 if settled => self.shoot(ctx, "10-earnings"),
            20 => {
                app.views.screen = Screen::Settings;
                self.next();
            }
            21 if settled => self.shoot(ctx, "11-settings"),
            22 => {
                app.send(Command::Lock);
                app.model.address = None;
                self.next();
            }
            23 if settled => self.shoot(ctx, "12-unlock"),
            24 => self.finish(app, ctx),
            _ => {}
        }
    }

    fn finish(&mut self, app: &CohortApp, ctx: &egui::Context) {
        let mut all = app.frame_ms.clone();
        let mut training = self.frames_training.clone();
        let mut cpu = self.cpu_training.clone();
        let stats = serde_json::json!({
            "frames": all.len(),
            "frame_ms_p50": pct(&mut all, 0.5),
            "frame_ms_p99": pct(&mut all, 0.99),
            "training_frames": training.len(),
            "training_frame_ms_p50": pct(&mut training, 0.5),
            "training_frame_ms_p99": pct(&mut training, 0.99),
            "training_frame_ms_max": training.iter().copied().fold(0.0, f64::max),
            "training_frame_cpu_ms_p50": pct(&mut cpu, 0.5),
            "training_frame_cpu_ms_p99": pct(&mut cpu, 0.99),
            "training_frame_cpu_ms_max": cpu.iter().copied().fold(0.0, f64::max),
            "ok": self.failed.is_none(),
        });
        let _ = std::fs::write(self.dir.join("frames.json"), stats.to_string());
        let _ = std::fs::remove_dir_all(&self.data);
        println!(
            "tour {}: {stats}",
            if self.failed.is_none() {
                "done"
            } else {
                "FAILED"
            }
        );
        self.step = usize::MAX;
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn save(path: &std::path::Path, img: &egui::ColorImage) -> Result<(), String> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let [w, h] = img.size;
    let bytes: Vec<u8> = img.pixels.iter().flat_map(|c| c.to_array()).collect();
    image::save_buffer(path, &bytes, w as u32, h as u32, image::ColorType::Rgba8)
        .map_err(|e| e.to_string())
}
