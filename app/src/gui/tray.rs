//! The tray icon: the state (training, paused and why, idle) and the day's
//! earnings, then Pause, Resume, Quit. `ksni` (StatusNotifierItem over
//! D-Bus, pure Rust) on Linux; `tray-icon` on Windows and macOS, whose
//! Linux backend would need GTK headers to build.

use super::model::TrayStatus;

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pause,
    Resume,
    Quit,
}

/// The app's end: actions chosen in the tray menu, and the status shown.
pub struct Tray {
    pub actions: Receiver<Action>,
    shown: Option<TrayStatus>,
    #[cfg(target_os = "linux")]
    status: tokio::sync::mpsc::UnboundedSender<String>,
    #[cfg(not(target_os = "linux"))]
    icon: Option<tray_icon::TrayIcon>,
}

impl Tray {
    /// Shows `s` in the tray's title, tooltip and menu, when it changed.
    pub fn show(&mut self, s: &TrayStatus) {
        if self.shown.as_ref() == Some(s) {
            return;
        }
        self.shown = Some(s.clone());
        #[cfg(target_os = "linux")]
        let _ = self.status.send(s.line());
        #[cfg(not(target_os = "linux"))]
        if let Some(icon) = &self.icon {
            let _ = icon.set_tooltip(Some(format!("Cohort: {}", s.line())));
        }
    }

    pub fn poll(&self) -> Option<Action> {
        #[cfg(not(target_os = "linux"))]
        if let Ok(ev) = tray_icon::menu::MenuEvent::receiver().try_recv() {
            return match ev.id().0.as_str() {
                "pause" => Some(Action::Pause),
                "resume" => Some(Action::Resume),
                "quit" => Some(Action::Quit),
                _ => None,
            };
        }
        self.actions.try_recv().ok()
    }
}

/// The app icon at 32 or 64 px, as RGBA rows: the PNGs `cohort-installer
/// icons` renders from `icons/icon.svg`, built into the binary.
pub fn icon_rgba(size: u32) -> Vec<u8> {
    let png: &[u8] = match size {
        32 => include_bytes!("../../../icons/32x32.png"),
        _ => include_bytes!("../../../icons/64x64.png"),
    };
    image::load_from_memory(png)
        .map(|i| i.to_rgba8().into_raw())
        .unwrap_or_default()
}

/// Starts the tray; `None` (with the reason logged) where the desktop has
/// no tray, which never stops the app.
pub fn start(repaint: Arc<dyn Fn() + Send + Sync>) -> Option<Tray> {
    let (tx, rx) = channel();
    let started = platform::start(tx, repaint);
    if let Err(e) = &started {
        eprintln!("tray: not shown ({e})");
    }
    #[cfg(target_os = "linux")]
    return started.ok().map(|status| Tray {
        actions: rx,
        shown: None,
        status,
    });
    #[cfg(not(target_os = "linux"))]
    return started.ok().map(|icon| Tray {
        actions: rx,
        shown: None,
        icon,
    });
}

#[cfg(target_os = "linux")]
mod platform {
    use super::{Action, Sender, icon_rgba};
    use ksni::TrayMethods;
    use std::sync::Arc;

    struct Item {
        tx: Sender<Action>,
        repaint: Arc<dyn Fn() + Send + Sync>,
        /// The state and the day's earnings, in words.
        status: String,
    }

    impl Item {
        fn act(&self, a: Action) {
            let _ = self.tx.send(a);
            (self.repaint)();
        }
    }

    impl ksni::Tray for Item {
        fn id(&self) -> String {
            "cohort".into()
        }
        fn title(&self) -> String {
            format!("Cohort: {}", self.status)
        }
        fn tool_tip(&self) -> ksni::ToolTip {
            ksni::ToolTip {
                title: "Cohort".into(),
                description: self.status.clone(),
                ..Default::default()
            }
        }
        fn icon_pixmap(&self) -> Vec<ksni::Icon> {
            // ksni wants ARGB in network order.
            let mut data = icon_rgba(32);
            for p in data.chunks_exact_mut(4) {
                p.rotate_right(1);
            }
            vec![ksni::Icon {
                width: 32,
                height: 32,
                data,
            }]
        }
        fn menu(&self) -> Vec<ksni::MenuItem<Self>> {
            let item = |label: &str, a: Action| {
                ksni::menu::StandardItem {
                    label: label.into(),
                    activate: Box::new(move |t: &mut Self| t.act(a)),
                    ..Default::default()
                }
                .into()
            };
            vec![
                ksni::menu::StandardItem {
                    label: self.status.clone(),
                    enabled: false,
                    ..Default::default()
                }
                .into(),
                ksni::MenuItem::Separator,
                item("Pause training", Action::Pause),
                item("Resume training", Action::Resume),
                ksni::MenuItem::Separator,
                item("Quit Cohort", Action::Quit),
            ]
        }
    }

    /// Runs the D-Bus service on a small thread of its own; the sender
    /// updates the status it shows.
    pub fn start(
        tx: Sender<Action>,
        repaint: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<tokio::sync::mpsc::UnboundedSender<String>, String> {
        if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_none() {
            return Err("no D-Bus session bus".into());
        }
        let (status_tx, mut status_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let (ok_tx, ok_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cohort-tray".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ok_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let item = Item {
                        tx,
                        repaint,
                        status: "Idle".into(),
                    };
                    match item.spawn().await {
                        Ok(handle) => {
                            let _ = ok_tx.send(Ok(()));
                            // The service lives as long as its handle, and
                            // the handle as long as the app sends statuses.
                            while let Some(s) = status_rx.recv().await {
                                handle.update(|i: &mut Item| i.status = s).await;
                            }
                        }
                        Err(e) => {
                            let _ = ok_tx.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .map_err(|e| e.to_string())?;
        ok_rx
            .recv_timeout(std::time::Duration::from_secs(3))
            .map_err(|_| "the tray service did not answer".to_string())??;
        Ok(status_tx)
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use super::{Action, Sender, icon_rgba};
    use std::sync::Arc;
    use tray_icon::menu::{Menu, MenuItem};

    /// Menu events arrive on tray-icon's own channel, polled each frame.
    pub fn start(
        _tx: Sender<Action>,
        _repaint: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<Option<tray_icon::TrayIcon>, String> {
        let menu = Menu::new();
        let items = [
            MenuItem::with_id("pause", "Pause training", true, None),
            MenuItem::with_id("resume", "Resume training", true, None),
            MenuItem::with_id("quit", "Quit Cohort", true, None),
        ];
        for i in &items {
            menu.append(i).map_err(|e| e.to_string())?;
        }
        let icon = tray_icon::Icon::from_rgba(icon_rgba(32), 32, 32).map_err(|e| e.to_string())?;
        let tray = tray_icon::TrayIconBuilder::new()
            .with_menu(Box::new(menu))
            .with_tooltip("Cohort")
            .with_icon(icon)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Some(tray))
    }
}
