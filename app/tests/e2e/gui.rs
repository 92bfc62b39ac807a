//! The desktop app driven through its real UI (egui_kittest: clicks and
//! typing found by label through the accessibility tree), with the real
//! worker thread behind it: keystore on disk, Sandbox chain, in-process
//! peers and training.

use cohort_app::gui::CohortApp;
use cohort_app::gui::settings::{Network, Settings};
use cohort_app::gui::views::Screen;
use cohort_app::wallet::keystore::Kdf;
use eframe::egui;
use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use solana_sdk::signature::Signer;
use std::path::Path;
use std::time::{Duration, Instant};

const PASS: &str = "hunter2hunter2";
const ALL: &str = "all all all all all all all all all all all all";
/// trezor-firmware's fixture for that phrase at m/44'/501'/0'/0' (what
/// Phantom shows for it).
const ALL_ADDRESS: &str = "14CCvQzQzHCVgZM3j9soPnXuJXh1RmCfwLVUcdfbZVBS";

fn app(dir: &Path, network: Network) -> Harness<'static, CohortApp> {
    let settings = Settings {
        network,
        // Loopback port 9 refuses at once: the wallet works offline.
        custom_url: "http://127.0.0.1:9".into(),
        data_dir: dir.to_path_buf(),
        kdf: Kdf {
            m_kib: 256,
            t: 1,
            p: 1,
        },
        ..Default::default()
    };
    let app = CohortApp::new(settings, &egui::Context::default(), false);
    Harness::builder()
        .with_size([1100.0, 900.0])
        .build_ui_state(|ui, app: &mut CohortApp| app.ui(ui), app)
}

/// Steps frames in real time until `cond` holds.
fn wait(h: &mut Harness<'_, CohortApp>, what: &str, secs: u64, cond: impl Fn(&CohortApp) -> bool) {
    let t = Instant::now();
    loop {
        h.step();
        if cond(h.state()) {
            h.step();
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}; notice: {:?}",
            h.state().model.notice
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn click(h: &mut Harness<'_, CohortApp>, label: &str) {
    h.get_by_role_and_label(Role::Button, label).click();
    h.step();
    h.step();
}

fn type_into(h: &mut Harness<'_, CohortApp>, role: Role, label: &str, text: &str) {
    h.get_by_role_and_label(role, label).focus();
    h.step();
    h.get_by_role_and_label(role, label).type_text(text);
    h.step();
}

/// Replaces a field's text, as select-all then typing does.
fn set_text(h: &mut Harness<'_, CohortApp>, role: Role, label: &str, text: &str) {
    h.get_by_role_and_label(role, label).focus();
    h.step();
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::A);
    h.step();
    h.get_by_role_and_label(role, label).type_text(text);
    h.step();
}

fn notice(h: &Harness<'_, CohortApp>) -> String {
    format!("{:?}", h.state().model.notice)
}

fn ready(h: &mut Harness<'_, CohortApp>) {
    wait(h, "the keystore check", 30, |a| {
        a.model.keystore_exists.is_some()
    });
}

fn set_passphrase(h: &mut Harness<'_, CohortApp>) {
    type_into(h, Role::PasswordInput, "Passphrase", PASS);
    type_into(h, Role::PasswordInput, "Repeat passphrase", PASS);
    click(h, "Encrypt and save wallet");
    wait(h, "the wallet to unlock", 60, |a| a.model.address.is_some());
}

#[test]
fn create_a_wallet_confirm_its_phrase_then_lock_and_unlock() {
    let _cores = crate::common::cores_shared();
    let dir = tempfile::tempdir().unwrap();
    let mut h = app(dir.path(), Network::Custom);
    ready(&mut h);
    h.get_by_label("Welcome to Cohort");
    click(&mut h, "Create wallet");
    wait(&mut h, "a new phrase", 10, |a| a.model.phrase.is_some());
    let phrase = h.state().model.phrase.clone().unwrap();
    let words: Vec<String> = phrase.split_whitespace().map(String::from).collect();
    assert_eq!(words.len(), 12);
    // The phrase is on screen, numbered.
    h.get_by_label(&format!(" 1. {}", words[0]));
    click(&mut h, "I have written it down");
    // Wrong words are refused.
    let asked: Vec<usize> = (0..12)
        .filter(|i| h.query_by_label(&format!("Word #{}", i + 1)).is_some())
        .collect();
    assert_eq!(asked.len(), 2, "the confirm step asks two words");
    for i in &asked {
        type_into(
            &mut h,
            Role::TextInput,
            &format!("Word #{}", i + 1),
            "zebra",
        );
    }
    click(&mut h, "Confirm");
    assert!(notice(&h).contains("do not match"), "{}", notice(&h));
    // The right ones pass.
    click(&mut h, "Show the phrase again");
    click(&mut h, "I have written it down");
    for i in &asked {
        type_into(
            &mut h,
            Role::TextInput,
            &format!("Word #{}", i + 1),
            &words[*i],
        );
    }
    click(&mut h, "Confirm");
    // Too short a passphrase is refused before anything is written.
    type_into(&mut h, Role::PasswordInput, "Passphrase", "short");
    type_into(&mut h, Role::PasswordInput, "Repeat passphrase", "short");
    click(&mut h, "Encrypt and save wallet");
    assert!(notice(&h).contains("at least 8"), "{}", notice(&h));
    set_text(&mut h, Role::PasswordInput, "Passphrase", "");
    set_text(&mut h, Role::PasswordInput, "Repeat passphrase", "");
    set_passphrase(&mut h);
    let address = h.state().model.address.clone().unwrap();
    let expect = cohort_app::wallet::derive::keypair_from_phrase(&phrase, 0).unwrap();
    assert_eq!(address, expect.pubkey().to_string());
    assert!(h.state().model.phrase.is_none(), "the phrase is shown once");
    assert!(dir.path().join("wallet.json").exists());

    // Lock, then a wrong passphrase, then the right one.
    click(&mut h, "Lock");
    wait(&mut h, "the unlock screen", 10, |a| {
        a.model.address.is_none()
    });
    h.get_by_label("Unlock your wallet");
    type_into(
        &mut h,
        Role::PasswordInput,
        "Passphrase",
        "not the passphrase",
    );
    click(&mut h, "Unlock");
    wait(&mut h, "the wrong-passphrase message", 30, |a| {
        a.model.notice.is_some()
    });
    assert!(notice(&h).contains("Wrong passphrase"), "{}", notice(&h));
    assert!(h.state().model.address.is_none());
    type_into(&mut h, Role::PasswordInput, "Passphrase", PASS);
    click(&mut h, "Unlock");
    wait(&mut h, "the wallet to unlock", 30, |a| {
        a.model.address.is_some()
    });
    assert_eq!(h.state().model.address.as_deref(), Some(address.as_str()));
}

#[test]
fn import_a_phrase_and_a_keypair_file() {
    let _cores = crate::common::cores_shared();
    // A phrase: an invalid one is refused on the spot, a valid one gives
    // the address Phantom shows.
    let dir = tempfile::tempdir().unwrap();
    let mut h = app(dir.path(), Network::Custom);
    ready(&mut h);
    type_into(
        &mut h,
        Role::MultilineTextInput,
        "Recovery phrase",
        "all all all all all all all all all all all alll",
    );
    click(&mut h, "Import phrase");
    assert!(
        notice(&h).contains("Invalid recovery phrase"),
        "{}",
        notice(&h)
    );
    set_text(&mut h, Role::MultilineTextInput, "Recovery phrase", ALL);
    click(&mut h, "Import phrase");
    set_passphrase(&mut h);
    assert_eq!(h.state().model.address.as_deref(), Some(ALL_ADDRESS));
    drop(h);

    // A Solana CLI keypair file.
    let dir = tempfile::tempdir().unwrap();
    let key = solana_sdk::signature::Keypair::new();
    let file = dir.path().join("id.json");
    cohort_app::chain::keys::save(&file, &key).unwrap();
    let mut h = app(&dir.path().join("data"), Network::Custom);
    ready(&mut h);
    type_into(
        &mut h,
        Role::TextInput,
        "Keypair file",
        file.to_str().unwrap(),
    );
    click(&mut h, "Import keypair file");
    set_passphrase(&mut h);
    assert_eq!(h.state().model.address, Some(key.pubkey().to_string()));

    // When to train: a rule changed in Settings is saved, and the sources
    // this machine cannot read are named; so is starting with the computer.
    let data = dir.path().join("data");
    assert!(Settings::load(&data).0.when.pause_on_battery);
    click(&mut h, "Settings");
    h.get_by_label_contains("Not readable on this computer yet");
    h.get_by_role_and_label(Role::CheckBox, "Pause on battery")
        .click();
    h.step();
    h.get_by_role_and_label(Role::CheckBox, "Only during these hours")
        .click();
    h.step();
    h.step();
    // Start with the computer is saved too (a test app leaves the system's
    // login items alone).
    assert!(!Settings::load(&data).0.start_with_computer);
    h.get_by_role_and_label(
        Role::CheckBox,
        "Start with the computer (minimised, training by the rules above)",
    )
    .click();
    h.step();
    h.step();
    click(&mut h, "Save settings");
    wait(
        &mut h,
        "the saved rules and start-with-the-computer",
        30,
        |_| {
            let s = Settings::load(&data).0;
            !s.when.pause_on_battery && s.when.schedule.is_some() && s.start_with_computer
        },
    );
    let w = Settings::load(&data).0.when;
    assert_eq!(
        w.schedule,
        Some(cohort_app::when::Window {
            from: 22 * 60,
            until: 7 * 60
        })
    );
}

#[test]
fn sandbox_benchmark_join_train_and_claim_from_the_ui() {
    // Three training nodes in this process: sharing the cores with the
    // lifecycle tests' nodes, it timed out waiting for its worker.
    let _cores = crate::common::cores_alone();
    let dir = tempfile::tempdir().unwrap();
    let mut h = app(dir.path(), Network::Sandbox);
    ready(&mut h);
    type_into(&mut h, Role::MultilineTextInput, "Recovery phrase", ALL);
    click(&mut h, "Import phrase");
    set_passphrase(&mut h);
    wait(&mut h, "the Sandbox chain and its job", 120, |a| {
        matches!(a.model.network_state, Some(Ok(()))) && !a.model.jobs.is_empty()
    });

    // Sending: a bad address, then more than the wallet holds.
    type_into(&mut h, Role::TextInput, "Recipient address", "not-a-key");
    type_into(&mut h, Role::TextInput, "Amount (SOL)", "1");
    click(&mut h, "Review transfer");
    assert!(notice(&h).contains("Invalid address"), "{}", notice(&h));
    let other = solana_sdk::pubkey::Pubkey::new_unique().to_string();
    set_text(&mut h, Role::TextInput, "Recipient address", &other);
    click(&mut h, "Review transfer");
    wait(&mut h, "the insufficient-funds message", 30, |a| {
        format!("{:?}", a.model.notice).contains("Insufficient funds")
    });

    // Joining with an empty wallet is refused with the reason.
    click(&mut h, "Job board");
    click(&mut h, "Join");
    h.get_by_label_contains("Expected earnings");
    click(&mut h, "Confirm and join");
    wait(&mut h, "the refusal", 30, |a| {
        format!("{:?}", a.model.notice).contains("Insufficient funds")
    });

    // Fund it, then send for real with the fee shown first.
    click(&mut h, "Wallet");
    click(&mut h, "Airdrop 2 SOL");
    wait(&mut h, "the airdrop", 30, |a| {
        a.model.balance.unwrap_or(0) >= 2_000_000_000
    });
    click(&mut h, "Review transfer");
    wait(&mut h, "the fee quote", 30, |a| a.model.quote.is_some());
    h.get_by_label_contains("Network fee");
    click(&mut h, "Confirm send");
    wait(&mut h, "the transfer", 30, |a| {
        a.model.history.iter().any(|e| e.kind == "sent")
    });

    // The benchmark shows figures and signs them.
    click(&mut h, "Benchmark");
    click(&mut h, "Run benchmark");
    wait(&mut h, "the benchmark", 120, |a| a.model.bench.is_some());
    assert!(h.query_all_by_label_contains("GFLOPS fp32").count() >= 1);
    h.get_by_label("Signed attestation");

    // One click to join (plus the confirmation), then training moves.
    click(&mut h, "Job board");
    h.get_by_label("qualifies");
    click(&mut h, "Join");
    click(&mut h, "Confirm and join");
    wait(&mut h, "training steps", 240, |a| {
        a.model.training.steps_applied >= 3
    });
    assert_eq!(h.state().views.screen, Screen::Training);
    assert!(h.state().model.training.loss.len() >= 3);
    h.get_by_label_contains("contributed to the last step");
    // Both other members, with a measured round trip and bytes from each.
    wait(&mut h, "peer links", 60, |a| {
        let p = &a.model.training.peers;
        p.len() == 2 && p.iter().all(|p| p.rtt_ms.is_some() && p.bytes_in > 0)
    });
    h.get_by_label("Latency");
    assert!(h.query_all_by_label_contains(" ms").count() >= 2);
    // This node is one of the demo job's witnesses: its audit tally shows.
    h.get_by_label_contains("Audits");

    // Pause: steps still apply; resume.
    click(&mut h, "Pause");
    // The worker takes commands one at a time, after whatever chain reads
    // it is doing.
    wait(&mut h, "pause", 60, |a| a.model.training.paused);
    // The status says whose pause it is.
    h.get_by_label_contains("Paused by you");
    click(&mut h, "Resume");
    wait(&mut h, "resume", 60, |a| !a.model.training.paused);

    // An attested epoch makes earnings claimable; Claim pays into the wallet.
    wait(&mut h, "a claimable epoch", 300, |a| {
        a.model.earnings.as_ref().is_some_and(|e| e.claimable > 0)
    });
    click(&mut h, "Earnings");
    let before = h.state().model.balance.unwrap();
    let claimable = h.state().model.earnings.as_ref().unwrap().claimable;
    click(&mut h, "Claim");
    wait(&mut h, "the claim", 60, |a| {
        a.model.history.iter().any(|e| e.kind == "claim")
    });
    let paid = h.state().model.history[0].lamports;
    assert_eq!(h.state().model.history[0].kind, "claim");
    assert!(
        paid >= claimable as i64,
        "paid {paid}, claimable was {claimable}"
    );
    // The wallet grows by the claim (the node's own fees are far smaller).
    wait(&mut h, "the new balance", 30, |a| {
        a.model.balance.unwrap() > before
    });
}

#[cfg(target_os = "linux")]
#[test]
fn without_a_display_cohort_says_so_in_one_line_and_points_to_the_demo() {
    let _cores = crate::common::cores_shared();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cohort"))
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("no display") && err.contains("cohort demo"),
        "{err}"
    );
}

#[test]
fn events_while_away_become_notifications_and_the_tray_says_why_paused_and_todays_pay() {
    use cohort_app::gui::worker::{Event, NodeUpdate};
    use cohort_app::node::Earnings;
    use cohort_app::when::{Reason, State};
    use solana_sdk::pubkey::Pubkey;

    let dir = tempfile::tempdir().unwrap();
    let mut h = app(dir.path(), Network::Custom);
    h.step();
    let earned = |claimable| {
        Event::Earnings(Earnings {
            claimable,
            ..Default::default()
        })
    };
    let end_of_day = 86_399.0;
    {
        let m = &mut h.state_mut().model;
        assert_eq!(m.tray_status(end_of_day).state, "Idle");
        m.apply(Event::Joined {
            job: Pubkey::new_unique(),
        });
        m.apply(earned(0));
        assert_eq!(m.tray_status(end_of_day).state, "Training");
    }
    // With the window in front the app says it itself: not for the desktop.
    h.input_mut().focused = true;
    h.state_mut().model.apply(earned(1_000_000));
    h.step();
    // Away: a payment, a pause for a game, a conviction.
    h.input_mut().focused = false;
    {
        let m = &mut h.state_mut().model;
        m.apply(earned(3_000_000));
        m.apply(Event::Training(State::Paused(Reason::FullScreen)));
        m.apply(Event::Node(NodeUpdate::Convicted(3)));
    }
    h.step();
    let sent: Vec<(String, bool)> = h
        .state()
        .notifier
        .sent
        .iter()
        .map(|(a, away)| (a.title.clone(), *away))
        .collect();
    assert_eq!(
        sent,
        vec![
            ("Paid 0.001000 SOL".to_string(), false),
            ("Paid 0.002000 SOL".to_string(), true),
            ("This node was convicted of cheating".to_string(), true),
        ]
    );
    let tray = h.state().model.tray_status(end_of_day);
    assert_eq!(tray.state, "Paused: a full-screen program is in front");
    assert_eq!(tray.today, 3_000_000);
    assert!(
        tray.line().contains("today 0.003000 SOL"),
        "{}",
        tray.line()
    );
    // Just after midnight nothing has been earned today yet.
    assert_eq!(h.state().model.tray_status(0.0).today, 0);
    // Training stopped by an error: said on the desktop, the tray goes idle.
    h.state_mut()
        .model
        .apply(Event::Node(NodeUpdate::Finished(Err(
            "the GPU driver crashed".into(),
        ))));
    h.step();
    let (last, away) = h.state().notifier.sent.last().unwrap().clone();
    assert_eq!(last.title, "Training stopped");
    assert!(
        away && last.body.contains("the GPU driver crashed"),
        "{last:?}"
    );
    assert_eq!(h.state().model.tray_status(end_of_day).state, "Idle");
}
