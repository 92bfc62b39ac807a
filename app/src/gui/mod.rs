//! The desktop app. [`CohortApp`] owns the UI state ([`Model`] and the
//! views' forms) and a [`worker::Handle`]; each frame it folds the
//! worker's events into the model, renders the current screen and sends
//! what the user asked for. The worker thread owns every I/O resource.

pub mod autostart;
#[cfg(not(target_os = "linux"))]
pub mod desktop;
pub mod gpu;
pub mod model;
pub mod notify;
pub mod sandbox;
pub mod sensors;
pub mod settings;
pub mod tour;
pub mod tray;
pub mod views;
pub mod worker;
#[cfg(target_os = "linux")]
pub mod x11;

use anyhow::{Result, bail};
use eframe::egui;
use model::{Model, Notice};
use settings::Settings;
use std::sync::Arc;
use std::time::Instant;
use views::{Screen, Views};
use worker::Command;

pub struct CohortApp {
    pub model: Model,
    pub views: Views,
    worker: worker::Handle,
    tray: Option<tray::Tray>,
    pub notifier: notify::Notifier,
    /// Milliseconds each `ui` call took (the app's share of a frame).
    pub frame_ms: Vec<f64>,
    /// eframe's CPU time per frame: the app's `ui` plus tessellation and
    /// painting.
    pub frame_cpu_ms: Vec<f64>,
    pub tour: Option<tour::Tour>,
    frames: u64,
    first_frame: Option<(Instant, Option<std::path::PathBuf>)>,
}

impl CohortApp {
    /// Starts the worker on `settings`; `ctx` is woken by its events. With
    /// `desktop` the app joins the desktop: the tray, notifications, login
    /// items (tests and the tour stay out of it).
    pub fn new(settings: Settings, ctx: &egui::Context, desktop: bool) -> Self {
        let c = ctx.clone();
        let repaint: Arc<dyn Fn() + Send + Sync> = Arc::new(move || c.request_repaint());
        let views = Views::new(&settings);
        let tray = if desktop {
            tray::start(repaint.clone())
        } else {
            None
        };
        Self {
            model: Model::default(),
            views,
            worker: worker::spawn(settings, repaint, desktop),
            notifier: notify::Notifier::new(desktop),
            tray,
            frame_ms: Vec::new(),
            frame_cpu_ms: Vec::new(),
            tour: None,
            frames: 0,
            first_frame: None,
        }
    }

    pub fn send(&self, c: Command) {
        self.worker.send(c);
    }

    /// Drains what the worker has said since the last frame.
    pub fn pump(&mut self) {
        while let Ok(ev) = self.worker.events.try_recv() {
            self.model.apply(ev);
        }
    }

    /// One frame: events in, screen drawn, commands out.
    pub fn ui(&mut self, ui: &mut egui::Ui) {
        let t0 = Instant::now();
        self.pump();
        let in_front = ui.ctx().input(|i| i.focused);
        for a in std::mem::take(&mut self.model.alerts) {
            self.notifier.alert(a, in_front);
        }
        let status = self.model.tray_status(sensors::secs_since_midnight());
        if let Some(tray) = &mut self.tray {
            tray.show(&status);
        }
        if let Some(tray) = &self.tray {
            while let Some(a) = tray.poll() {
                match a {
                    tray::Action::Pause => self.send(Command::Pause),
                    tray::Action::Resume => self.send(Command::Resume),
                    tray::Action::Quit => ui.ctx().send_viewport_cmd(egui::ViewportCommand::Close),
                }
            }
        }
        let mut out = Vec::new();
        self.draw(ui, &mut out);
        for c in out {
            self.send(c);
        }
        if let Some(mut tour) = self.tour.take() {
            tour.frame(self, ui.ctx());
            self.tour = Some(tour);
        }
        // Training and the chain move on their own: look again soon.
        if self.first_frame.is_some() {
            ui.ctx().request_repaint();
        } else {
            ui.ctx()
                .request_repaint_after(std::time::Duration::from_millis(250));
        }
        self.frame_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        self.frames += 1;
        if self.frames == 2
            && let Some((start, report)) = self.first_frame.take()
        {
            first_frame_done(ui.ctx(), start, report.as_deref());
        }
    }

    fn draw(&mut self, ui: &mut egui::Ui, out: &mut views::Out) {
        let m = &mut self.model;
        let v = &mut self.views;
        egui::Panel::top("top").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.label(egui::RichText::new("Cohort").strong().size(18.0));
                ui.separator();
                match &m.network_state {
                    None => {
                        ui.spinner();
                        ui.label("Starting the Sandbox chain…");
                    }
                    Some(Ok(())) => {
                        ui.label(format!("{} · connected", m.network));
                    }
                    Some(Err(_)) => {
                        ui.colored_label(
                            egui::Color32::LIGHT_RED,
                            format!("{}: unreachable", m.network),
                        );
                    }
                }
                if let Some(a) = &m.address {
                    ui.separator();
                    ui.monospace(views::short(a));
                    if let Some(b) = m.balance {
                        ui.label(crate::chain::sol(b));
                    }
                    if ui.small_button("Lock").clicked() {
                        out.push(Command::Lock);
                        m.address = None;
                        m.balance = None;
                    }
                }
                if let Some(p) = &m.pending {
                    ui.separator();
                    ui.spinner();
                    ui.label(format!("{p}…"));
                }
            });
        });
        egui::Panel::bottom("notice").show(ui, |ui| {
            ui.horizontal(|ui| match &m.notice {
                Some(Notice::Error(e)) => {
                    ui.colored_label(egui::Color32::from_rgb(230, 80, 80), e);
                }
                Some(Notice::Info(i)) => {
                    ui.label(i);
                }
                None => {
                    ui.weak(m.training.status());
                }
            });
        });
        if m.address.is_some() {
            egui::Panel::left("nav")
                .resizable(false)
                .default_size(150.0)
                .show(ui, |ui| {
                    ui.add_space(8.0);
                    for s in Screen::NAV {
                        if ui.selectable_label(v.screen == s, s.label()).clicked() {
                            v.screen = s;
                        }
                    }
                });
        }
        egui::CentralPanel::default().show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| {
                match (m.address.is_some(), m.keystore_exists) {
                    (false, None) => {
                        ui.spinner();
                    }
                    (false, Some(true)) => views::onboarding::unlock(ui, m, &mut v.onboarding, out),
                    (false, Some(false)) => {
                        views::onboarding::welcome(ui, m, &mut v.onboarding, out)
                    }
                    (true, _) => match v.screen {
                        Screen::Wallet => views::wallet::show(ui, m, &mut v.wallet, out),
                        Screen::Benchmark => views::benchmark::show(ui, m, out),
                        Screen::Jobs => views::jobs::show(ui, m, &mut v.jobs, out),
                        Screen::Training => views::training::show(ui, m, out),
                        Screen::Earnings => views::earnings::show(ui, m, out),
                        Screen::Settings => views::settings::show(ui, m, &mut v.settings, out),
                    },
                }
            });
        });
        // Joining moves the user to the training view.
        if out.iter().any(|c| matches!(c, Command::Join { .. })) {
            v.screen = Screen::Training;
        }
    }
}

impl eframe::App for CohortApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        if let Some(cpu) = frame.info().cpu_usage {
            self.frame_cpu_ms.push(cpu as f64 * 1e3);
        }
        CohortApp::ui(self, ui);
    }
}

pub const USAGE: &str = "\
Usage: cohort [app] [--data DIR] [--minimized] [--tour DIR] [--first-frame FILE] [--bare]
  The desktop app (needs a display). Sandbox is the default network.
  --data DIR          wallet, settings and node state           [~/.cohort]
  --minimized         start with the window minimised (how the app starts with
                      the computer, when Settings asks it to)
  --tour DIR          walk every screen on a fresh Sandbox wallet, saving a
                      screenshot of each into DIR, and frame times to DIR/frames.json
  --first-frame FILE  exit after the first frame, writing to FILE its time since
                      main() and the Unix time in ms
  --bare              with --first-frame: an empty window (the baseline)
";

/// Whether a display is reachable; the reason when it is not.
pub fn display() -> Result<(), String> {
    if cfg!(target_os = "linux")
        && std::env::var_os("DISPLAY").is_none()
        && std::env::var_os("WAYLAND_DISPLAY").is_none()
    {
        return Err(
            "no display found (DISPLAY and WAYLAND_DISPLAY are unset): run `cohort demo` for the headless demo, or `cohort node` on servers".into(),
        );
    }
    Ok(())
}

/// `cohort` / `cohort app`.
pub fn main(args: &[String], started: Instant) -> Result<()> {
    let mut data = None;
    let mut tour_dir = None;
    let mut first = None;
    let mut bare = false;
    let mut minimized = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |n: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("{n} needs a value"))
        };
        match a.as_str() {
            "--data" => data = Some(std::path::PathBuf::from(value("--data")?)),
            "--tour" => tour_dir = Some(std::path::PathBuf::from(value("--tour")?)),
            "--first-frame" => first = Some(std::path::PathBuf::from(value("--first-frame")?)),
            "--bare" => bare = true,
            // How the login item starts it (see `autostart`).
            "--minimized" => minimized = true,
            "--help" | "-h" => {
                print!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown option `{other}` for `cohort app`"),
        }
    }
    if let Err(why) = display() {
        bail!("{why}");
    }
    let data = match (&tour_dir, data) {
        // The tour always starts from nothing: a fresh wallet and Sandbox.
        (Some(_), _) => std::env::temp_dir().join(format!("cohort-tour-{}", std::process::id())),
        (None, Some(d)) => d,
        (None, None) => crate::chain::keys::home(),
    };
    let (settings, warning) = Settings::load(&data);
    let opts = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("Cohort")
            // Matches the desktop entry's StartupWMClass, so launchers group the window.
            .with_app_id("cohort")
            .with_inner_size([1100.0, 760.0])
            .with_min_inner_size([800.0, 560.0])
            .with_icon(egui::IconData {
                rgba: tray::icon_rgba(64),
                width: 64,
                height: 64,
            }),
        ..Default::default()
    };
    let tour_data = data.clone();
    eframe::run_native(
        "Cohort",
        opts,
        Box::new(move |cc| {
            if bare {
                return Ok(Box::new(Bare {
                    started,
                    report: first,
                    frames: 0,
                }));
            }
            if minimized {
                cc.egui_ctx
                    .send_viewport_cmd(egui::ViewportCommand::Minimized(true));
            }
            // The tray is on for the timed start too: it is part of what a
            // user's launch costs.
            let mut app = CohortApp::new(settings, &cc.egui_ctx, tour_dir.is_none());
            if let Some(w) = warning {
                app.model.notice = Some(Notice::Error(w));
            }
            if let Some(f) = first {
                app.first_frame = Some((started, Some(f)));
            }
            if let Some(dir) = tour_dir {
                app.tour = Some(tour::Tour::new(dir, tour_data));
            }
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| anyhow::anyhow!("the window could not open: {e}"))
}

/// The second frame starts once the first has been presented: report the
/// time since `main()` and the wall clock (Unix milliseconds, so a parent
/// can time from its own spawn), and close.
fn first_frame_done(ctx: &egui::Context, started: Instant, report: Option<&std::path::Path>) {
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3);
    println!("first frame after {ms:.0} ms");
    if let Some(p) = report {
        let _ = std::fs::write(p, format!("{ms:.1} {unix_ms:.1}\n"));
    }
    ctx.send_viewport_cmd(egui::ViewportCommand::Close);
}

/// An empty window: what the first frame costs without Cohort's own start.
struct Bare {
    started: Instant,
    report: Option<std::path::PathBuf>,
    frames: u32,
}

impl eframe::App for Bare {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        egui::CentralPanel::default().show(ui, |ui| ui.label("Cohort"));
        self.frames += 1;
        if self.frames == 2 {
            first_frame_done(ui.ctx(), self.started, self.report.as_deref());
        }
        ui.ctx().request_repaint();
    }
}
