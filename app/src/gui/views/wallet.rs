//! Balance, address (copy, QR), send with a confirmation that shows the
//! fee, history, and the Sandbox faucet.

use super::{Out, field, heading};
use crate::chain::sol;
use crate::cli::sol_to_lamports;
use crate::gui::model::{Model, Notice};
use crate::gui::worker::Command;
use eframe::egui;
use solana_sdk::pubkey::Pubkey;
use std::str::FromStr;

#[derive(Default)]
pub struct Form {
    pub to: String,
    pub amount: String,
}

/// The recipient and amount, or the message to show.
pub fn parse_send(to: &str, amount: &str) -> Result<(Pubkey, u64), String> {
    let to = to.trim();
    let key = Pubkey::from_str(to).map_err(|_| {
        format!("Invalid address `{to}`: a Solana address is 32–44 base58 characters")
    })?;
    let sol: f64 = amount
        .trim()
        .parse()
        .map_err(|_| format!("Invalid amount `{}`: enter SOL, e.g. 0.5", amount.trim()))?;
    if sol.is_nan() || sol <= 0.0 {
        return Err("Enter an amount above zero".into());
    }
    let lamports = sol_to_lamports(sol, "The amount").map_err(|e| e.to_string())?;
    Ok((key, lamports))
}

pub fn show(ui: &mut egui::Ui, model: &mut Model, f: &mut Form, out: &mut Out) {
    heading(ui, "Wallet");
    let Some(address) = model.address.clone() else {
        return;
    };
    ui.horizontal(|ui| {
        ui.vertical(|ui| {
            ui.label("Balance");
            ui.label(
                egui::RichText::new(model.balance.map_or("…".into(), sol))
                    .size(26.0)
                    .strong(),
            );
            ui.add_space(8.0);
            ui.label("Address");
            ui.monospace(&address);
            ui.horizontal(|ui| {
                if ui.button("Copy address").clicked() {
                    ui.ctx().copy_text(address.clone());
                    model.notice = Some(Notice::Info("Address copied".into()));
                }
                if model.network == "Sandbox" && ui.button("Airdrop 2 SOL").clicked() {
                    model.pending = Some("Airdrop".into());
                    out.push(Command::Airdrop);
                }
            });
        });
        ui.add_space(24.0);
        qr(ui, &address, 150.0);
    });
    ui.separator();
    ui.strong("Send SOL");
    match model.quote {
        None => {
            field(ui, "Recipient address", &mut f.to, false);
            field(ui, "Amount (SOL)", &mut f.amount, false);
            if ui.button("Review transfer").clicked() {
                match parse_send(&f.to, &f.amount) {
                    Ok((to, lamports)) => {
                        model.notice = None;
                        out.push(Command::QuoteSend { to, lamports });
                    }
                    Err(e) => model.notice = Some(Notice::Error(e)),
                }
            }
        }
        Some((to, lamports, fee)) => {
            ui.label(format!(
                "Send {} to {to}?\nNetwork fee: {} · Total: {}",
                sol(lamports),
                sol(fee),
                sol(lamports + fee)
            ));
            ui.horizontal(|ui| {
                if ui.button("Confirm send").clicked() {
                    model.pending = Some("Sending".into());
                    out.push(Command::Send { to, lamports });
                    f.to.clear();
                    f.amount.clear();
                }
                if ui.button("Cancel").clicked() {
                    model.quote = None;
                }
            });
        }
    }
    ui.separator();
    ui.strong("History");
    if model.history.is_empty() {
        ui.label("No transfers or claims yet.");
    }
    egui::Grid::new("history").striped(true).show(ui, |ui| {
        for h in model.history.iter().take(12) {
            ui.label(&h.kind);
            let s = sol(h.lamports.unsigned_abs());
            ui.monospace(if h.lamports < 0 {
                format!("-{s}")
            } else {
                format!("+{s}")
            });
            ui.monospace(super::short(&h.counterparty));
            ui.end_row();
        }
    });
}

/// The address as a QR code, drawn module by module.
fn qr(ui: &mut egui::Ui, text: &str, size: f32) {
    let Ok(code) = qrcode::QrCode::new(text.as_bytes()) else {
        return;
    };
    let w = code.width();
    let quiet = 2;
    let cells = (w + 2 * quiet) as f32;
    let (rect, _) = ui.allocate_exact_size(egui::vec2(size, size), egui::Sense::hover());
    let p = ui.painter_at(rect);
    p.rect_filled(rect, 4.0, egui::Color32::WHITE);
    let cell = size / cells;
    for (i, c) in code.to_colors().iter().enumerate() {
        if *c == qrcode::Color::Dark {
            let (x, y) = ((i % w + quiet) as f32, (i / w + quiet) as f32);
            let min = rect.min + egui::vec2(x * cell, y * cell);
            p.rect_filled(
                egui::Rect::from_min_size(min, egui::vec2(cell, cell)),
                0.0,
                egui::Color32::BLACK,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_send_input_is_a_clear_message() {
        let e = parse_send("not-an-address", "1").unwrap_err();
        assert!(e.starts_with("Invalid address"), "{e}");
        let k = Pubkey::new_unique().to_string();
        assert!(
            parse_send(&k, "abc")
                .unwrap_err()
                .starts_with("Invalid amount")
        );
        assert!(parse_send(&k, "0").unwrap_err().contains("above zero"));
        assert_eq!(parse_send(&k, " 0.5 ").unwrap().1, 500_000_000);
    }
}
