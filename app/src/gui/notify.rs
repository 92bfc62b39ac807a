//! Desktop notifications for what a user away from the window would want to
//! hear (paid, job ended, convicted, stopped on an error), through
//! `notify-rust` (the freedesktop notification service over D-Bus on Linux,
//! the system's own elsewhere). Shown only while the window is not in front:
//! in front, the app says it itself.

use super::model::Alert;

pub struct Notifier {
    /// Whether to hand alerts to the desktop at all (off in tests and in
    /// the tour).
    desktop: bool,
    /// Every alert seen, and whether the user was away from the window
    /// (so it is for the desktop), the newest 32.
    pub sent: Vec<(Alert, bool)>,
}

impl Notifier {
    pub fn new(desktop: bool) -> Self {
        Self {
            desktop,
            sent: Vec::new(),
        }
    }

    /// Shows `a` on the desktop unless the window is in front.
    pub fn alert(&mut self, a: Alert, window_in_front: bool) {
        let away = !window_in_front;
        if self.desktop && away {
            let (title, body) = (a.title.clone(), a.body.clone());
            // The call waits on D-Bus: off the UI thread.
            let _ = std::thread::Builder::new()
                .name("cohort-notify".into())
                .spawn(move || {
                    if let Err(e) = notify_rust::Notification::new()
                        .appname("Cohort")
                        .summary(&title)
                        .body(&body)
                        .show()
                    {
                        tracing::warn!("desktop notification not shown: {e}");
                    }
                });
        }
        self.sent.push((a, away));
        if self.sent.len() > 32 {
            self.sent.remove(0);
        }
    }
}
