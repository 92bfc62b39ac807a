//! Packages the `cohort` binary for Linux, Windows and macOS with the Tauri
//! bundler. `tauri.conf.json` (read with `tauri-utils`) is the one source of
//! the product's name, version, identifier, icons and per-platform settings;
//! this crate maps it onto the bundler's settings and calls
//! `tauri_bundler::bundle_project`.
//!
//! `.deb` bundles offline. AppImage, MSI/NSIS and DMG make the bundler
//! download its tools (linuxdeploy, WiX, NSIS) or need the target OS, so
//! those run on release machines (see docs/install.md).

pub mod icons;

use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use tauri_bundler::{
    AppCategory, BundleBinary, BundleSettings, DebianSettings, MacOsSettings, PackageSettings,
    PackageType, SettingsBuilder,
};
use tauri_utils::config::Config;

/// The repository root (where `tauri.conf.json` lives). Cargo names the
/// running package's folder (a direct child of the root) at run time too;
/// that one wins, because a build cache shared between checkouts can hold
/// this crate compiled in another folder.
pub fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

/// The bundler's name for each format we accept on the command line.
pub fn format(name: &str) -> Result<PackageType> {
    Ok(match name {
        "deb" => PackageType::Deb,
        "rpm" => PackageType::Rpm,
        "appimage" => PackageType::AppImage,
        "msi" => PackageType::WindowsMsi,
        "nsis" => PackageType::Nsis,
        "app" => PackageType::MacOsBundle,
        "dmg" => PackageType::Dmg,
        other => bail!("unknown format `{other}`: deb, rpm, appimage, msi, nsis, app or dmg"),
    })
}

pub fn read_config(root: &Path) -> Result<Config> {
    let p = root.join("tauri.conf.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid Tauri config", p.display()))
}

/// Bundles `binary` (the built `cohort`) into `formats`; the packages
/// written, under `bundle/` beside `binary`.
///
/// The bundler rewrites its input binary in place for each format (it
/// patches in the bundle type, then truncates and restores the file), and
/// Linux refuses to open a running executable for writing ("Text file
/// busy"). So it is handed a private copy in a staging folder, never the
/// `binary` that other processes (a running node, a parallel test) may be
/// executing, and the packages are moved out of the staging folder after.
pub fn package(root: &Path, binary: &Path, formats: Vec<PackageType>) -> Result<Vec<PathBuf>> {
    let out_dir = binary.parent().context("binary path has no folder")?;
    let file = binary.file_name().context("binary path has no file name")?;
    let bundle_dir = out_dir.join("bundle");
    std::fs::create_dir_all(&bundle_dir)
        .with_context(|| format!("creating {}", bundle_dir.display()))?;
    let stage = tempfile::Builder::new()
        .prefix(".stage-")
        .tempdir_in(&bundle_dir)
        .with_context(|| format!("creating a staging folder in {}", bundle_dir.display()))?;
    let copy = stage.path().join(file);
    std::fs::copy(binary, &copy)
        .with_context(|| format!("copying {} to {}", binary.display(), copy.display()))?;
    let staged = bundle_in(root, &copy, formats)?;
    let staged_bundles = stage.path().join("bundle");
    let mut written = Vec::new();
    for p in staged {
        let rel = p.strip_prefix(&staged_bundles).with_context(|| {
            format!(
                "the bundler wrote {} outside {}",
                p.display(),
                staged_bundles.display()
            )
        })?;
        let to = bundle_dir.join(rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        if to.is_dir() {
            std::fs::remove_dir_all(&to).with_context(|| format!("replacing {}", to.display()))?;
        }
        std::fs::rename(&p, &to)
            .with_context(|| format!("moving {} to {}", p.display(), to.display()))?;
        written.push(to);
    }
    Ok(written)
}

/// Runs the bundler on `binary`, which it may rewrite, in `binary`'s folder.
fn bundle_in(root: &Path, binary: &Path, formats: Vec<PackageType>) -> Result<Vec<PathBuf>> {
    let conf = read_config(root)?;
    let version = conf
        .version
        .clone()
        .context("tauri.conf.json has no version")?;
    let product = conf
        .product_name
        .clone()
        .context("tauri.conf.json has no productName")?;
    let name = binary
        .file_stem()
        .and_then(|s| s.to_str())
        .context("binary path has no file name")?
        .to_string();
    let out_dir = binary.parent().context("binary path has no folder")?;
    let b = &conf.bundle;
    // Paths in the config are relative to it, as the Tauri CLI reads them.
    let abs = |p: &str| root.join(p).display().to_string();
    let deb = &b.linux.deb;
    let settings = SettingsBuilder::new()
        .project_out_directory(out_dir)
        .package_types(formats)
        .package_settings(PackageSettings {
            product_name: product,
            version: version.clone(),
            description: b.short_description.clone().unwrap_or_default(),
            homepage: b.homepage.clone(),
            authors: b.publisher.clone().map(|p| vec![p]),
            default_run: Some(name.clone()),
        })
        .bundle_settings(BundleSettings {
            identifier: Some(conf.identifier.clone()),
            publisher: b.publisher.clone(),
            homepage: b.homepage.clone(),
            icon: Some(b.icon.iter().map(|i| abs(i)).collect()),
            copyright: b.copyright.clone(),
            license: b.license.clone(),
            category: b
                .category
                .as_deref()
                .map(|c| {
                    c.parse::<AppCategory>().map_err(|near| match near {
                        Some(n) => anyhow!("unknown bundle category `{c}`; did you mean {n}?"),
                        None => anyhow!("unknown bundle category `{c}`"),
                    })
                })
                .transpose()?,
            short_description: b.short_description.clone(),
            long_description: b.long_description.clone(),
            deb: DebianSettings {
                depends: deb.depends.clone(),
                recommends: deb.recommends.clone(),
                section: deb.section.clone(),
                priority: deb.priority.clone(),
                desktop_template: deb.desktop_template.as_ref().map(|p| root.join(p)),
                ..Default::default()
            },
            macos: MacOsSettings {
                minimum_system_version: b.macos.minimum_system_version.clone(),
                ..Default::default()
            },
            ..Default::default()
        })
        .binaries(vec![BundleBinary::new(name, true)])
        .build()
        .map_err(|e| anyhow!("bundler settings: {e}"))?;
    let bundles =
        tauri_bundler::bundle_project(&settings).map_err(|e| anyhow!("bundling failed: {e}"))?;
    let mut written = Vec::new();
    for p in bundles.into_iter().flat_map(|b| b.bundle_paths) {
        written.push(debian_name(&p, &version)?);
    }
    Ok(written)
}

/// Debian names package files after the package (lower case), not the
/// product: `Cohort_0.1.0_amd64.deb` becomes `cohort_0.1.0_amd64.deb`.
fn debian_name(p: &Path, version: &str) -> Result<PathBuf> {
    let Some(file) = p.file_name().and_then(|f| f.to_str()) else {
        return Ok(p.to_path_buf());
    };
    if !file.ends_with(".deb") {
        return Ok(p.to_path_buf());
    }
    let arch = file
        .trim_end_matches(".deb")
        .rsplit('_')
        .next()
        .unwrap_or("amd64");
    let to = p.with_file_name(format!("cohort_{version}_{arch}.deb"));
    if to != p {
        std::fs::rename(p, &to).with_context(|| format!("renaming {}", p.display()))?;
    }
    Ok(to)
}

/// Builds the `cohort` binary with cargo (`release` or debug); its path.
pub fn build_app(root: &Path, release: bool) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut c = std::process::Command::new(cargo);
    c.current_dir(root)
        .args(["build", "--locked", "-p", "cohort-app", "--bin", "cohort"]);
    if release {
        c.arg("--release");
    }
    if !c.status().context("running cargo")?.success() {
        bail!("building the cohort binary failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target
        .join(if release { "release" } else { "debug" })
        .join(format!("cohort{}", std::env::consts::EXE_SUFFIX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tauri_conf_version_and_name_match_the_workspace() {
        let c = read_config(&repo_root()).unwrap();
        assert_eq!(c.version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(c.product_name.as_deref(), Some("Cohort"));
        assert_eq!(c.identifier, "org.cohort.desktop");
        // Every icon the config names exists (`cohort-installer icons` writes them).
        for i in &c.bundle.icon {
            assert!(repo_root().join(i).is_file(), "{i} missing");
        }
        assert!(format("exe").is_err());
    }

    #[test]
    fn the_icon_set_renders_the_svg_at_every_size() {
        let svg = std::fs::read(repo_root().join("icons/icon.svg")).unwrap();
        let img = icons::render(&svg, 64).unwrap();
        assert_eq!(img.dimensions(), (64, 64));
        // Rounded corners are transparent; the centre (the shared model) is opaque.
        assert_eq!(img.get_pixel(0, 0)[3], 0);
        assert_eq!(img.get_pixel(32, 32)[3], 255);
        let icns = icons::icns(&svg).unwrap();
        assert_eq!(&icns[..4], b"icns");
        assert_eq!(
            u32::from_be_bytes(icns[4..8].try_into().unwrap()) as usize,
            icns.len()
        );
    }
}
