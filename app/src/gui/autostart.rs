//! Start with the computer: a login item through `auto-launch` (an XDG
//! autostart entry on Linux, a LaunchAgent on macOS, the Run key on
//! Windows) that opens the app minimised.

use anyhow::{Context, Result};

/// The arguments the login item starts the app with.
pub const ARGS: [&str; 2] = ["app", "--minimized"];

fn launcher(name: &str) -> Result<auto_launch::AutoLaunch> {
    let exe = std::env::current_exe().context("finding this program's path")?;
    auto_launch::AutoLaunchBuilder::new()
        .set_app_name(name)
        .set_app_path(&exe.to_string_lossy())
        .set_args(&ARGS)
        .build()
        .context("preparing the login item")
}

/// Makes the login item match `on`; nothing is written when it already does.
pub fn set(on: bool) -> Result<()> {
    set_named("Cohort", on)
}

fn set_named(name: &str, on: bool) -> Result<()> {
    let l = launcher(name)?;
    let now = l.is_enabled().context("reading the login item")?;
    match (now, on) {
        (false, true) => l.enable().context("adding the login item"),
        (true, false) => l.disable().context("removing the login item"),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "writes a login item into this user's own autostart folder (and removes it)"]
    fn the_login_item_is_added_once_and_removed() {
        let name = format!("cohort-test-{}", std::process::id());
        set_named(&name, true).unwrap();
        assert!(launcher(&name).unwrap().is_enabled().unwrap());
        // Asking again changes nothing.
        set_named(&name, true).unwrap();
        set_named(&name, false).unwrap();
        assert!(!launcher(&name).unwrap().is_enabled().unwrap());
        set_named(&name, false).unwrap();
    }
}
