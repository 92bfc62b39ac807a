//! Linux (X11): the time since the last keyboard or mouse input (the
//! MIT-SCREEN-SAVER extension every X server has) and whether the active
//! window is full screen (the window manager's EWMH hints), for the "when
//! to train" rule. Pure Rust (`x11rb`, already linked by the window
//! system), no C library; Wayland sessions answer through XWayland only for
//! X11 windows, so a native Wayland game reads as "not full screen".

use std::time::Duration;
use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::screensaver::ConnectionExt as _;
use x11rb::protocol::xproto::{Atom, AtomEnum, ConnectionExt as _, Window};
use x11rb::rust_connection::RustConnection;

pub struct X11 {
    conn: RustConnection,
    root: Window,
    idle: bool,
    active: Atom,
    state: Atom,
    fullscreen: Atom,
}

impl X11 {
    /// The session's display, if there is one to read.
    pub fn open() -> Option<Self> {
        std::env::var_os("DISPLAY")?;
        let (conn, screen) = x11rb::connect(None).ok()?;
        let root = conn.setup().roots.get(screen)?.root;
        let idle = conn
            .extension_information(x11rb::protocol::screensaver::X11_EXTENSION_NAME)
            .ok()
            .flatten()
            .is_some();
        let atom = |name: &[u8]| -> Option<Atom> {
            Some(conn.intern_atom(false, name).ok()?.reply().ok()?.atom)
        };
        Some(X11 {
            active: atom(b"_NET_ACTIVE_WINDOW")?,
            state: atom(b"_NET_WM_STATE")?,
            fullscreen: atom(b"_NET_WM_STATE_FULLSCREEN")?,
            conn,
            root,
            idle,
        })
    }

    /// Time since the last keyboard or mouse input.
    pub fn input_idle(&self) -> Option<Duration> {
        if !self.idle {
            return None;
        }
        let r = self
            .conn
            .screensaver_query_info(self.root)
            .ok()?
            .reply()
            .ok()?;
        Some(Duration::from_millis(u64::from(r.ms_since_user_input)))
    }

    /// Whether the active window is full screen; `None` without a window
    /// manager that says which window is active.
    pub fn fullscreen(&self) -> Option<bool> {
        let active = self
            .conn
            .get_property(false, self.root, self.active, AtomEnum::WINDOW, 0, 1)
            .ok()?
            .reply()
            .ok()?;
        let window = active.value32()?.next()?;
        if window == 0 {
            return Some(false);
        }
        let state = self
            .conn
            .get_property(false, window, self.state, AtomEnum::ATOM, 0, 64)
            .ok()?
            .reply()
            .ok()?;
        Some(
            state
                .value32()
                .is_some_and(|mut a| a.any(|a| a == self.fullscreen)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs an X display: run under xvfb-run (scripts/screenshots.sh installs Xvfb)"]
    fn an_x_server_reports_input_idle_time_and_no_full_screen_window_without_a_window_manager() {
        let x = X11::open().expect("DISPLAY set and reachable");
        let a = x.input_idle().expect("MIT-SCREEN-SAVER");
        std::thread::sleep(Duration::from_millis(300));
        let b = x.input_idle().unwrap();
        assert!(b >= a + Duration::from_millis(200), "{a:?} then {b:?}");
        // Xvfb alone has no window manager to name an active window.
        assert_eq!(x.fullscreen(), None);
    }
}
