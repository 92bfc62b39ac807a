//! Windows and macOS readings for the "when to train" rule: time since the
//! last keyboard or mouse input (`user-idle`), the power source
//! (`starship-battery`) and, on Windows, the shell's own "a full-screen
//! program is in front" state. Linux reads X11 (`x11.rs`) and sysfs
//! (`sensors.rs`) instead. A reading the system refuses is `None`, and the
//! rule that needs it never pauses.

use std::time::Duration;

/// Time since the last keyboard or mouse input in this session.
pub fn input_idle() -> Option<Duration> {
    Some(user_idle::UserIdle::get_time().ok()?.duration())
}

/// On battery when some battery is discharging; a machine whose power
/// source can be read and that has no battery (a desktop) is on the mains.
pub fn on_battery() -> Option<bool> {
    use starship_battery::State;
    let batteries = starship_battery::Manager::new().ok()?.batteries().ok()?;
    let mut discharging = false;
    for b in batteries.flatten() {
        discharging |= b.state() == State::Discharging;
    }
    Some(discharging)
}

/// Whether a full-screen program (a game on Direct3D or any other API, a
/// video, a presentation) is in front: the state Windows itself consults
/// before it shows a notification.
#[cfg(windows)]
pub fn fullscreen() -> Option<bool> {
    use windows_sys::Win32::UI::Shell::{
        QUNS_BUSY, QUNS_PRESENTATION_MODE, QUNS_RUNNING_D3D_FULL_SCREEN,
        SHQueryUserNotificationState,
    };
    let mut state = 0;
    // SAFETY: the call's one argument is an out-parameter it writes before
    // returning; `state` outlives the call.
    let hr = unsafe { SHQueryUserNotificationState(&mut state) };
    (hr >= 0).then_some(matches!(
        state,
        QUNS_BUSY | QUNS_RUNNING_D3D_FULL_SCREEN | QUNS_PRESENTATION_MODE
    ))
}

/// macOS offers no public "a full-screen program is in front" query; the
/// settings screen lists full-screen windows among the rules that cannot
/// act here.
#[cfg(not(windows))]
pub fn fullscreen() -> Option<bool> {
    None
}
