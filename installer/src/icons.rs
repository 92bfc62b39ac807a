//! The icon set, generated from `icons/icon.svg`: PNGs from 32 to 512 px
//! (and 128@2x), `icon.ico` (16–256) and `icon.icns` (16–1024), the
//! sizes Linux, Windows and macOS bundles ask for.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// (file name, pixels)
pub const PNGS: &[(&str, u32)] = &[
    ("32x32.png", 32),
    ("64x64.png", 64),
    ("128x128.png", 128),
    ("128x128@2x.png", 256),
    ("256x256.png", 256),
    ("512x512.png", 512),
];

/// Renders the SVG at `size`×`size`, RGBA.
pub fn render(svg: &[u8], size: u32) -> Result<image::RgbaImage> {
    let tree = resvg::usvg::Tree::from_data(svg, &resvg::usvg::Options::default())
        .context("icons/icon.svg is not valid SVG")?;
    let mut pix = resvg::tiny_skia::Pixmap::new(size, size).context("icon size")?;
    let s = size as f32 / tree.size().width().max(tree.size().height());
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::from_scale(s, s),
        &mut pix.as_mut(),
    );
    // tiny-skia holds premultiplied alpha; PNG wants straight alpha.
    let mut rgba = Vec::with_capacity((size * size * 4) as usize);
    for p in pix.pixels() {
        let c = p.demultiply();
        rgba.extend_from_slice(&[c.red(), c.green(), c.blue(), c.alpha()]);
    }
    image::RgbaImage::from_raw(size, size, rgba).context("icon buffer")
}

fn png(img: &image::RgbaImage) -> Result<Vec<u8>> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)?;
    Ok(out.into_inner())
}

/// An ICNS file: the container is a header and typed chunks, each chunk a
/// PNG for one size (what macOS has read since 10.7).
pub fn icns(svg: &[u8]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    for (kind, size) in [
        (b"icp4", 16),
        (b"icp5", 32),
        (b"icp6", 64),
        (b"ic07", 128),
        (b"ic08", 256),
        (b"ic09", 512),
        (b"ic10", 1024),
    ] {
        let data = png(&render(svg, size)?)?;
        body.extend_from_slice(kind);
        body.extend_from_slice(&((data.len() + 8) as u32).to_be_bytes());
        body.extend_from_slice(&data);
    }
    let mut out = b"icns".to_vec();
    out.extend_from_slice(&((body.len() + 8) as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Writes the whole set next to the source; the files written.
pub fn generate(dir: &Path) -> Result<Vec<PathBuf>> {
    let src = dir.join("icon.svg");
    let svg = std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
    let mut written = Vec::new();
    for (name, size) in PNGS {
        let p = dir.join(name);
        render(&svg, *size)?
            .save(&p)
            .with_context(|| format!("writing {}", p.display()))?;
        written.push(p);
    }
    let ico = dir.join("icon.ico");
    let frames = [16, 24, 32, 48, 64, 128, 256]
        .into_iter()
        .map(|s| {
            let img = render(&svg, s)?;
            image::codecs::ico::IcoFrame::as_png(
                img.as_raw(),
                s,
                s,
                image::ExtendedColorType::Rgba8,
            )
            .map_err(anyhow::Error::from)
        })
        .collect::<Result<Vec<_>>>()?;
    let f = std::fs::File::create(&ico).with_context(|| format!("writing {}", ico.display()))?;
    image::codecs::ico::IcoEncoder::new(f).encode_images(&frames)?;
    written.push(ico);
    let icns_path = dir.join("icon.icns");
    std::fs::write(&icns_path, icns(&svg)?)?;
    written.push(icns_path);
    if written.is_empty() {
        bail!("no icons written");
    }
    Ok(written)
}
