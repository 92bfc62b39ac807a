//! The screens. Each renders the [`Model`] and its own form fields and
//! queues [`Command`]s; none does I/O.

pub mod benchmark;
pub mod earnings;
pub mod jobs;
pub mod onboarding;
pub mod settings;
pub mod training;
pub mod wallet;

use super::settings::Settings;
use super::worker::Command;
use eframe::egui;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Wallet,
    Benchmark,
    Jobs,
    Training,
    Earnings,
    Settings,
}

impl Screen {
    pub const NAV: [Screen; 6] = [
        Screen::Wallet,
        Screen::Benchmark,
        Screen::Jobs,
        Screen::Training,
        Screen::Earnings,
        Screen::Settings,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Screen::Wallet => "Wallet",
            Screen::Benchmark => "Benchmark",
            Screen::Jobs => "Job board",
            Screen::Training => "Training",
            Screen::Earnings => "Earnings",
            Screen::Settings => "Settings",
        }
    }
}

/// The UI's own state: where the user is and what they typed.
pub struct Views {
    pub screen: Screen,
    pub onboarding: onboarding::Form,
    pub wallet: wallet::Form,
    pub jobs: jobs::Form,
    pub settings: settings::Form,
}

impl Views {
    pub fn new(settings: &Settings) -> Self {
        Self {
            screen: Screen::Wallet,
            onboarding: Default::default(),
            wallet: Default::default(),
            jobs: Default::default(),
            settings: settings::Form::new(settings),
        }
    }
}

/// Queued commands, sent to the worker after the frame.
pub type Out = Vec<Command>;

/// A labelled single-line text field; the label names the field for
/// screen readers and for the UI tests.
pub fn field(ui: &mut egui::Ui, label: &str, text: &mut String, password: bool) -> egui::Response {
    ui.horizontal(|ui| {
        let l = ui.add_sized([150.0, 20.0], egui::Label::new(label));
        ui.add(
            egui::TextEdit::singleline(text)
                .password(password)
                .desired_width(380.0),
        )
        .labelled_by(l.id)
    })
    .inner
}

pub fn heading(ui: &mut egui::Ui, text: &str) {
    ui.add_space(4.0);
    ui.heading(text);
    ui.add_space(6.0);
}

pub fn short(key: &str) -> String {
    if key.len() > 12 {
        format!("{}…{}", &key[..6], &key[key.len() - 4..])
    } else {
        key.to_string()
    }
}

/// `x / of` as a filled bar with a caption.
pub fn bar(ui: &mut egui::Ui, x: f64, of: f64, text: String) {
    let f = if of > 0.0 {
        (x / of).clamp(0.0, 1.0)
    } else {
        0.0
    };
    ui.add(
        egui::ProgressBar::new(f as f32)
            .text(text)
            .desired_width(420.0),
    );
}
