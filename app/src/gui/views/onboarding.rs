//! First run and unlock: create a wallet (phrase shown once, then two of
//! its words confirmed), or import a phrase or a Solana CLI keypair file;
//! either way a passphrase encrypts it on this computer.

use super::{Out, field, heading};
use crate::gui::model::{Model, Notice};
use crate::gui::worker::{Command, NewWallet};
use crate::wallet::derive;
use eframe::egui;
use std::path::PathBuf;
use zeroize::Zeroizing;

#[derive(Default, PartialEq, Eq, Clone, Copy, Debug)]
pub enum Stage {
    #[default]
    Start,
    /// The new phrase is on screen.
    ShowPhrase,
    /// Two of its words asked back.
    Confirm,
    Passphrase(Source),
}

#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub enum Source {
    Created,
    Phrase,
    Keypair,
}

#[derive(Default)]
pub struct Form {
    pub stage: Stage,
    pub words: usize,
    pub import_phrase: Zeroizing<String>,
    pub keypair_path: String,
    pub confirm: [String; 2],
    pub pass: Zeroizing<String>,
    pub repeat: Zeroizing<String>,
}

/// Which two words the confirm step asks for: fixed per phrase, different
/// between phrases.
fn asked(phrase: &str) -> [usize; 2] {
    let n = phrase.split_whitespace().count().max(2);
    let h = blake3::hash(phrase.as_bytes());
    let a = h.as_bytes()[0] as usize % n;
    let mut b = h.as_bytes()[1] as usize % n;
    if b == a {
        b = (a + 1) % n;
    }
    [a.min(b), a.max(b)]
}

pub fn unlock(ui: &mut egui::Ui, model: &Model, f: &mut Form, out: &mut Out) {
    heading(ui, "Unlock your wallet");
    ui.label("Your wallet is encrypted on this computer. Enter its passphrase.");
    ui.add_space(8.0);
    let r = field(ui, "Passphrase", &mut f.pass, true);
    let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
    let busy = model.pending.is_some();
    if (ui.add_enabled(!busy, egui::Button::new("Unlock")).clicked() || enter) && !busy {
        out.push(Command::Unlock {
            pass: std::mem::take(&mut f.pass),
        });
    }
}

pub fn welcome(ui: &mut egui::Ui, model: &mut Model, f: &mut Form, out: &mut Out) {
    if f.words == 0 {
        f.words = 12;
    }
    match f.stage {
        Stage::Start => start(ui, model, f, out),
        Stage::ShowPhrase => show_phrase(ui, model, f),
        Stage::Confirm => confirm(ui, model, f),
        Stage::Passphrase(src) => passphrase(ui, model, f, src, out),
    }
}

fn start(ui: &mut egui::Ui, model: &mut Model, f: &mut Form, out: &mut Out) {
    heading(ui, "Welcome to Cohort");
    ui.label(
        "Cohort pays your idle GPU to train AI models with other people's. \
         First, a wallet: it receives your earnings.",
    );
    ui.add_space(10.0);
    ui.group(|ui| {
        ui.strong("Create a new wallet");
        ui.horizontal(|ui| {
            ui.radio_value(&mut f.words, 12, "12 words");
            ui.radio_value(&mut f.words, 24, "24 words");
        });
        if ui.button("Create wallet").clicked() {
            out.push(Command::NewPhrase { words: f.words });
            f.stage = Stage::ShowPhrase;
        }
    });
    ui.add_space(8.0);
    ui.group(|ui| {
        ui.strong("Import a recovery phrase (Phantom, Solflare, …)");
        let l = ui.label("Recovery phrase");
        ui.add(
            egui::TextEdit::multiline(&mut *f.import_phrase)
                .desired_rows(2)
                .desired_width(540.0),
        )
        .labelled_by(l.id);
        if ui.button("Import phrase").clicked() {
            match derive::parse_phrase(&f.import_phrase) {
                Ok(_) => {
                    model.notice = None;
                    f.stage = Stage::Passphrase(Source::Phrase);
                }
                Err(e) => model.notice = Some(Notice::Error(capital(&e.to_string()))),
            }
        }
    });
    ui.add_space(8.0);
    ui.group(|ui| {
        ui.strong("Import a Solana CLI keypair file");
        field(ui, "Keypair file", &mut f.keypair_path, false);
        if ui.button("Import keypair file").clicked() {
            if f.keypair_path.trim().is_empty() {
                model.notice = Some(Notice::Error("Enter the keypair file's path".into()));
            } else {
                model.notice = None;
                f.stage = Stage::Passphrase(Source::Keypair);
            }
        }
    });
}

fn show_phrase(ui: &mut egui::Ui, model: &Model, f: &mut Form) {
    heading(ui, "Your recovery phrase");
    let Some(phrase) = &model.phrase else {
        ui.spinner();
        return;
    };
    ui.label(
        "Write these words down, in order, and keep them offline. They are \
         the only way to recover this wallet; Cohort shows them once.",
    );
    ui.add_space(8.0);
    egui::Grid::new("phrase")
        .num_columns(4)
        .spacing([24.0, 6.0])
        .show(ui, |ui| {
            for (i, w) in phrase.split_whitespace().enumerate() {
                ui.monospace(format!("{:>2}. {w}", i + 1));
                if i % 4 == 3 {
                    ui.end_row();
                }
            }
        });
    ui.add_space(10.0);
    ui.horizontal(|ui| {
        if ui.button("I have written it down").clicked() {
            f.confirm = Default::default();
            f.stage = Stage::Confirm;
        }
        if ui.button("Back").clicked() {
            f.stage = Stage::Start;
        }
    });
}

fn confirm(ui: &mut egui::Ui, model: &mut Model, f: &mut Form) {
    heading(ui, "Confirm your recovery phrase");
    let Some(phrase) = model.phrase.clone() else {
        f.stage = Stage::Start;
        return;
    };
    let words: Vec<&str> = phrase.split_whitespace().collect();
    let ask = asked(&phrase);
    ui.label("To check you have it, type two of its words.");
    for (k, i) in ask.iter().enumerate() {
        field(ui, &format!("Word #{}", i + 1), &mut f.confirm[k], false);
    }
    ui.horizontal(|ui| {
        if ui.button("Confirm").clicked() {
            let ok = ask
                .iter()
                .zip(&f.confirm)
                .all(|(i, typed)| typed.trim().eq_ignore_ascii_case(words[*i]));
            if ok {
                model.notice = None;
                f.stage = Stage::Passphrase(Source::Created);
            } else {
                model.notice = Some(Notice::Error(
                    "Those words do not match the phrase: check what you wrote down".into(),
                ));
            }
        }
        if ui.button("Show the phrase again").clicked() {
            f.stage = Stage::ShowPhrase;
        }
    });
}

fn passphrase(ui: &mut egui::Ui, model: &mut Model, f: &mut Form, src: Source, out: &mut Out) {
    heading(ui, "Choose a passphrase");
    ui.label("It encrypts the wallet on this computer (at least 8 characters).");
    ui.add_space(6.0);
    field(ui, "Passphrase", &mut f.pass, true);
    field(ui, "Repeat passphrase", &mut f.repeat, true);
    let busy = model.pending.is_some();
    ui.horizontal(|ui| {
        if ui
            .add_enabled(!busy, egui::Button::new("Encrypt and save wallet"))
            .clicked()
        {
            if f.pass.len() < 8 {
                model.notice = Some(Notice::Error(
                    "The passphrase needs at least 8 characters".into(),
                ));
                return;
            }
            if *f.pass != *f.repeat {
                model.notice = Some(Notice::Error("The two passphrases differ".into()));
                return;
            }
            let from = match src {
                Source::Created => match &model.phrase {
                    Some(p) => NewWallet::Phrase(p.clone()),
                    None => return,
                },
                Source::Phrase => NewWallet::Phrase(f.import_phrase.clone()),
                Source::Keypair => NewWallet::KeypairFile(PathBuf::from(f.keypair_path.trim())),
            };
            model.notice = None;
            model.pending = Some("Encrypting the wallet".into());
            out.push(Command::SaveWallet {
                from,
                pass: f.pass.clone(),
            });
        }
        if ui.add_enabled(!busy, egui::Button::new("Back")).clicked() {
            f.stage = Stage::Start;
        }
    });
    if busy {
        ui.horizontal(|ui| {
            ui.spinner();
            ui.label("Encrypting (Argon2id takes a moment)…");
        });
    }
}

fn capital(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_confirm_step_asks_two_different_words_in_range() {
        let p =
            "abandon ability able about above absent absorb abstract absurd abuse access accident";
        let [a, b] = asked(p);
        assert!(a < b && b < 12, "{a} {b}");
        assert_eq!(asked(p), [a, b]);
    }
}
