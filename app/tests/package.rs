//! The `.deb` the installer writes, checked the way a user gets it: built
//! from this test's own `cohort` binary with the Tauri bundler, unpacked
//! with `dpkg-deb -x`, and the packaged binary run.

use std::path::Path;
use std::process::Command;

#[cfg(target_os = "linux")]
#[test]
fn the_deb_installs_a_runnable_cohort_with_its_desktop_entry_and_icons() {
    let root = cohort_installer::repo_root();
    let bin = Path::new(env!("CARGO_BIN_EXE_cohort"));
    let debs =
        cohort_installer::package(&root, bin, vec![cohort_installer::format("deb").unwrap()])
            .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(debs.len(), 1);
    let deb = &debs[0];
    assert_eq!(
        deb.file_name().unwrap().to_str().unwrap(),
        format!("cohort_{version}_amd64.deb")
    );

    let dir = tempfile::tempdir().unwrap();
    let st = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(dir.path())
        .status()
        .expect("dpkg-deb is needed to unpack the package");
    assert!(st.success());
    let info = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .output()
        .unwrap();
    let control = String::from_utf8_lossy(&info.stdout);
    assert!(control.contains("Package: cohort"), "{control}");
    assert!(
        control.contains(&format!("Version: {version}")),
        "{control}"
    );
    assert!(control.contains("Depends: libc6"), "{control}");

    // The packaged binary runs.
    let out = Command::new(dir.path().join("usr/bin/cohort"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("cohort {version}")
    );

    // The desktop entry launches it, with its icon.
    let entry =
        std::fs::read_to_string(dir.path().join("usr/share/applications/Cohort.desktop")).unwrap();
    for line in [
        "Exec=cohort",
        "Icon=cohort",
        "Name=Cohort",
        "Type=Application",
    ] {
        assert!(
            entry.lines().any(|l| l == line),
            "{line} missing from:\n{entry}"
        );
    }
    for size in ["32x32", "64x64", "128x128", "256x256", "512x512"] {
        let icon = dir
            .path()
            .join(format!("usr/share/icons/hicolor/{size}/apps/cohort.png"));
        let img = image::open(&icon).unwrap_or_else(|e| panic!("{}: {e}", icon.display()));
        assert_eq!(format!("{}x{}", img.width(), img.height()), size);
    }
}
