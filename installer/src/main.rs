//! `cohort-installer`: packages the app, or regenerates the icon set.

use anyhow::{Context, Result, bail};
use cohort_installer::{build_app, format, icons, package, repo_root};
use std::path::PathBuf;

const USAGE: &str = "\
Usage:
  cohort-installer [--formats deb[,rpm,appimage,msi,nsis,app,dmg]] [--binary PATH] [--release]
      builds the cohort binary (or takes PATH) and writes the packages with the Tauri
      bundler, under the binary's folder in bundle/. Default: --formats deb
  cohort-installer icons
      regenerates icons/*.png, icon.ico and icon.icns from icons/icon.svg
";

fn main() {
    if let Err(e) = run(std::env::args().skip(1).collect()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let root = repo_root();
    if args.first().map(String::as_str) == Some("icons") {
        for p in icons::generate(&root.join("icons"))? {
            println!("wrote {}", p.display());
        }
        return Ok(());
    }
    let mut formats = vec!["deb".to_string()];
    let mut binary = None;
    let mut release = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--formats" => {
                let v = it.next().context("--formats needs a value")?;
                formats = v.split(',').map(|s| s.trim().to_string()).collect();
            }
            "--binary" => binary = Some(PathBuf::from(it.next().context("--binary needs a path")?)),
            "--release" => release = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    let formats = formats
        .iter()
        .map(|f| format(f))
        .collect::<Result<Vec<_>>>()?;
    let binary = match binary {
        Some(b) if b.is_file() => b,
        Some(b) => bail!("no binary at {}", b.display()),
        None => build_app(&root, release)?,
    };
    for p in package(&root, &binary, formats)? {
        println!("wrote {}", p.display());
    }
    Ok(())
}
