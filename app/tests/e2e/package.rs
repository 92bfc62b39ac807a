//! The `.deb` the installer writes, checked the way a user gets it: built
//! with the Tauri bundler from a running copy of this test's own `cohort`
//! binary, unpacked with `dpkg-deb -x`, and the packaged binary run.

use std::process::Command;

#[cfg(target_os = "linux")]
#[test]
fn the_deb_installs_a_runnable_cohort_with_its_desktop_entry_and_icons() {
    let _cores = crate::common::cores_shared();
    let root = cohort_installer::repo_root();
    // Packaged while it runs, as a release machine may still run the
    // build it packages (and this binary's other tests run theirs): the
    // bundler rewrites the file it is handed, which Linux refuses for a
    // running executable ("Text file busy"), and the running program must
    // come out of it unchanged.
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("cohort");
    std::fs::copy(env!("CARGO_BIN_EXE_cohort"), &bin).unwrap();
    let before = std::fs::read(&bin).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut running = Command::new(&bin)
        .args(["localnet", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let packaged =
        cohort_installer::package(&root, &bin, vec![cohort_installer::format("deb").unwrap()]);
    let still_running = running.try_wait().unwrap().is_none();
    let _ = running.kill();
    let _ = running.wait();
    let debs = packaged.unwrap();
    assert!(still_running, "the binary stopped while it was packaged");
    assert!(
        std::fs::read(&bin).unwrap() == before,
        "packaging changed the binary it was given"
    );
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
