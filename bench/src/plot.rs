//! Line charts written as PNG for `docs/bench/`: tiny-skia rasterises, skrifa
//! reads the glyphs of a font egui already bundles, so a figure looks the same
//! on any machine (no system fonts) and needs no crate the workspace lacks.
//! Only the chart's layout (ranges, ticks, legend) is written here.

use anyhow::{Context, Result, bail};
use skrifa::instance::{LocationRef, Size};
use skrifa::outline::{DrawSettings, OutlinePen};
use skrifa::{FontRef, MetadataProvider};
use tiny_skia::{Color, FillRule, Paint, PathBuilder, Pixmap, Rect, Stroke, StrokeDash, Transform};

/// One line of a panel; `band` (x, low, high) shades the spread behind it.
pub struct Series {
    pub label: String,
    pub rgb: [u8; 3],
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
    pub band: Vec<(f64, f64, f64)>,
}

/// One chart: its series over shared axes, and horizontal guide lines
/// (a goal, a baseline) with their labels.
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub guides: Vec<(f64, String)>,
}

const MARGIN_LEFT: f32 = 72.0;
const MARGIN_RIGHT: f32 = 16.0;
const MARGIN_TOP: f32 = 36.0;
const MARGIN_BOTTOM: f32 = 52.0;
const TEXT: [u8; 3] = [40, 40, 40];
const GRID: [u8; 3] = [225, 225, 225];

/// The panels side by side, each `width` × `height` pixels, as PNG bytes.
pub fn render(panels: &[Panel], width: u32, height: u32) -> Result<Vec<u8>> {
    if panels.is_empty()
        || panels
            .iter()
            .any(|p| p.series.iter().all(|s| s.points.is_empty()))
    {
        bail!("a chart needs at least one point in every panel");
    }
    let font = Font::new()?;
    let mut pix = Pixmap::new(width * panels.len() as u32, height)
        .context("a chart of zero or too many pixels")?;
    pix.fill(Color::WHITE);
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(
            &mut pix,
            &font,
            panel,
            i as f32 * width as f32,
            width as f32,
            height as f32,
        );
    }
    pix.encode_png().context("encoding the chart as PNG")
}

/// Data to pixels for one panel's plot area.
struct Frame {
    x0: f32,
    y0: f32,
    w: f32,
    h: f32,
    xr: (f64, f64),
    yr: (f64, f64),
}

impl Frame {
    fn px(&self, x: f64, y: f64) -> (f32, f32) {
        let fx = (x - self.xr.0) / (self.xr.1 - self.xr.0);
        let fy = (y - self.yr.0) / (self.yr.1 - self.yr.0);
        (
            self.x0 + fx as f32 * self.w,
            self.y0 + self.h - fy as f32 * self.h,
        )
    }
}

fn draw_panel(pix: &mut Pixmap, font: &Font, p: &Panel, left: f32, width: f32, height: f32) {
    let xs = p.series.iter().flat_map(|s| s.points.iter().map(|q| q.0));
    let ys = p
        .series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(|q| q.1)
                .chain(s.band.iter().flat_map(|b| [b.1, b.2]))
        })
        .chain(p.guides.iter().map(|g| g.0));
    let f = Frame {
        x0: left + MARGIN_LEFT,
        y0: MARGIN_TOP,
        w: width - MARGIN_LEFT - MARGIN_RIGHT,
        h: height - MARGIN_TOP - MARGIN_BOTTOM,
        xr: nice_range(xs.fold((f64::INFINITY, f64::NEG_INFINITY), grow), false),
        yr: nice_range(ys.fold((f64::INFINITY, f64::NEG_INFINITY), grow), true),
    };
    // Grid and tick labels.
    for x in ticks(f.xr) {
        let (px, _) = f.px(x, f.yr.0);
        line(pix, &[(px, f.y0), (px, f.y0 + f.h)], GRID, 1.0, false);
        font.draw(
            pix,
            &tick_label(x),
            px,
            f.y0 + f.h + 16.0,
            12.0,
            Align::Center,
            false,
        );
    }
    for y in ticks(f.yr) {
        let (_, py) = f.px(f.xr.0, y);
        line(pix, &[(f.x0, py), (f.x0 + f.w, py)], GRID, 1.0, false);
        font.draw(
            pix,
            &tick_label(y),
            f.x0 - 6.0,
            py + 4.0,
            12.0,
            Align::Right,
            false,
        );
    }
    let frame = [
        (f.x0, f.y0),
        (f.x0 + f.w, f.y0),
        (f.x0 + f.w, f.y0 + f.h),
        (f.x0, f.y0 + f.h),
        (f.x0, f.y0),
    ];
    line(pix, &frame, [150, 150, 150], 1.0, false);
    for (y, label) in &p.guides {
        let (_, py) = f.px(f.xr.0, *y);
        line(
            pix,
            &[(f.x0, py), (f.x0 + f.w, py)],
            [120, 120, 120],
            1.0,
            true,
        );
        font.draw(
            pix,
            label,
            f.x0 + f.w - 4.0,
            py - 4.0,
            11.0,
            Align::Right,
            false,
        );
    }
    for s in &p.series {
        if s.band.len() >= 2 {
            let mut pb = PathBuilder::new();
            for (i, (x, lo, _)) in s.band.iter().enumerate() {
                let (px, py) = f.px(*x, *lo);
                if i == 0 {
                    pb.move_to(px, py)
                } else {
                    pb.line_to(px, py)
                }
            }
            for (x, _, hi) in s.band.iter().rev() {
                let (px, py) = f.px(*x, *hi);
                pb.line_to(px, py);
            }
            pb.close();
            if let Some(path) = pb.finish() {
                let [r, g, b] = s.rgb;
                pix.fill_path(
                    &path,
                    &paint([r, g, b], 48),
                    FillRule::Winding,
                    Transform::identity(),
                    None,
                );
            }
        }
        let pts: Vec<(f32, f32)> = s.points.iter().map(|(x, y)| f.px(*x, *y)).collect();
        line(pix, &pts, s.rgb, 2.0, s.dashed);
        for &(x, y) in &pts {
            if let Some(r) = Rect::from_xywh(x - 2.5, y - 2.5, 5.0, 5.0) {
                pix.fill_rect(r, &paint(s.rgb, 255), Transform::identity(), None);
            }
        }
    }
    // Legend: in the corner of the plot that covers the fewest points of
    // the lines, on a white card so a line behind it does not cross the text.
    let lw = p
        .series
        .iter()
        .map(|s| font.width(&s.label, 12.0))
        .fold(0.0, f32::max)
        + 48.0;
    let lh = p.series.len() as f32 * 17.0 + 8.0;
    let samples: Vec<(f32, f32)> = p
        .series
        .iter()
        .flat_map(|s| s.points.windows(2))
        .flat_map(|w| {
            let (a, b) = (f.px(w[0].0, w[0].1), f.px(w[1].0, w[1].1));
            (0..=16).map(move |i| {
                let t = i as f32 / 16.0;
                (a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1))
            })
        })
        .collect();
    let corners = [
        (f.x0 + f.w - lw - 6.0, f.y0 + 6.0),
        (f.x0 + 6.0, f.y0 + 6.0),
        (f.x0 + f.w - lw - 6.0, f.y0 + f.h - lh - 6.0),
        (f.x0 + 6.0, f.y0 + f.h - lh - 6.0),
    ];
    let covered = |(cx, cy): (f32, f32)| {
        samples
            .iter()
            .filter(|(x, y)| (cx..cx + lw).contains(x) && (cy..cy + lh).contains(y))
            .count()
    };
    let (cx, cy) = corners
        .into_iter()
        .min_by_key(|c| covered(*c))
        .unwrap_or(corners[0]);
    if let Some(r) = Rect::from_xywh(cx, cy, lw, lh) {
        pix.fill_rect(r, &paint([255, 255, 255], 230), Transform::identity(), None);
        let edge = [
            (cx, cy),
            (cx + lw, cy),
            (cx + lw, cy + lh),
            (cx, cy + lh),
            (cx, cy),
        ];
        line(pix, &edge, GRID, 1.0, false);
    }
    for (i, s) in p.series.iter().enumerate() {
        let ly = cy + 17.0 + i as f32 * 17.0;
        line(
            pix,
            &[(cx + 8.0, ly - 4.0), (cx + 32.0, ly - 4.0)],
            s.rgb,
            2.0,
            s.dashed,
        );
        font.draw(pix, &s.label, cx + 38.0, ly, 12.0, Align::Left, false);
    }
    font.draw(
        pix,
        &p.title,
        left + width / 2.0,
        22.0,
        15.0,
        Align::Center,
        false,
    );
    font.draw(
        pix,
        &p.x_label,
        f.x0 + f.w / 2.0,
        height - 12.0,
        13.0,
        Align::Center,
        false,
    );
    font.draw(
        pix,
        &p.y_label,
        left + 18.0,
        f.y0 + f.h / 2.0,
        13.0,
        Align::Center,
        true,
    );
}

fn grow((lo, hi): (f64, f64), v: f64) -> (f64, f64) {
    if v.is_finite() {
        (lo.min(v), hi.max(v))
    } else {
        (lo, hi)
    }
}

/// The data's range widened to whole tick steps (and a little air on y).
fn nice_range((lo, hi): (f64, f64), pad: bool) -> (f64, f64) {
    let (mut lo, mut hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, lo + 0.5)
    };
    if pad {
        let air = (hi - lo) * 0.05;
        (lo, hi) = (lo - air, hi + air);
    }
    let step = tick_step(hi - lo);
    ((lo / step).floor() * step, (hi / step).ceil() * step)
}

/// 1, 2 or 5 times a power of ten, for about five ticks over `span`.
fn tick_step(span: f64) -> f64 {
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn ticks((lo, hi): (f64, f64)) -> Vec<f64> {
    let step = tick_step(hi - lo);
    let n = ((hi - lo) / step).round() as i64;
    (0..=n).map(|i| lo + i as f64 * step).collect()
}

fn tick_label(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        // Enough decimals to tell neighbouring ticks apart.
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

fn paint(rgb: [u8; 3], alpha: u8) -> Paint<'static> {
    let mut p = Paint::default();
    p.set_color_rgba8(rgb[0], rgb[1], rgb[2], alpha);
    p.anti_alias = true;
    p
}

fn line(pix: &mut Pixmap, pts: &[(f32, f32)], rgb: [u8; 3], width: f32, dashed: bool) {
    let mut pb = PathBuilder::new();
    for (i, &(x, y)) in pts.iter().enumerate() {
        if i == 0 {
            pb.move_to(x, y)
        } else {
            pb.line_to(x, y)
        }
    }
    let Some(path) = pb.finish() else { return };
    let stroke = Stroke {
        width,
        dash: if dashed {
            StrokeDash::new(vec![6.0, 4.0], 0.0)
        } else {
            None
        },
        ..Stroke::default()
    };
    pix.stroke_path(
        &path,
        &paint(rgb, 255),
        &stroke,
        Transform::identity(),
        None,
    );
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Center,
    Right,
}

/// Text from egui's bundled Ubuntu Light, drawn as filled glyph outlines.
struct Font {
    face: FontRef<'static>,
}

impl Font {
    fn new() -> Result<Self> {
        let face = FontRef::new(epaint_default_fonts::UBUNTU_LIGHT)
            .context("reading the bundled Ubuntu Light font")?;
        Ok(Self { face })
    }

    fn width(&self, text: &str, px: f32) -> f32 {
        let metrics = self
            .face
            .glyph_metrics(Size::new(px), LocationRef::default());
        let map = self.face.charmap();
        text.chars()
            .map(|c| {
                metrics
                    .advance_width(map.map(c).unwrap_or_default())
                    .unwrap_or(0.0)
            })
            .sum()
    }

    /// `text` with its baseline at `y`; `vertical` turns it to read upward
    /// (a y-axis label), centred on (x, y).
    #[allow(clippy::too_many_arguments)]
    fn draw(
        &self,
        pix: &mut Pixmap,
        text: &str,
        x: f32,
        y: f32,
        px: f32,
        align: Align,
        vertical: bool,
    ) {
        let metrics = self
            .face
            .glyph_metrics(Size::new(px), LocationRef::default());
        let map = self.face.charmap();
        let outlines = self.face.outline_glyphs();
        let mut pen = Pen {
            pb: PathBuilder::new(),
            dx: 0.0,
        };
        for c in text.chars() {
            let gid = map.map(c).unwrap_or_default();
            if let Some(glyph) = outlines.get(gid) {
                let settings = DrawSettings::unhinted(Size::new(px), LocationRef::default());
                // A glyph that fails to draw is left out; the rest still reads.
                let _ = glyph.draw(settings, &mut pen);
            }
            pen.dx += metrics.advance_width(gid).unwrap_or(0.0);
        }
        let w = pen.dx;
        let shift = match align {
            Align::Left => 0.0,
            Align::Center => -w / 2.0,
            Align::Right => -w,
        };
        let Some(path) = pen.pb.finish() else { return };
        let t = if vertical {
            Transform::from_translate(x, y)
                .pre_rotate(-90.0)
                .pre_translate(shift, px * 0.35)
        } else {
            Transform::from_translate(x + shift, y)
        };
        pix.fill_path(&path, &paint(TEXT, 255), FillRule::Winding, t, None);
    }
}

/// Glyph outlines into one path; font units point up, pixels down.
struct Pen {
    pb: PathBuilder,
    dx: f32,
}

impl OutlinePen for Pen {
    fn move_to(&mut self, x: f32, y: f32) {
        self.pb.move_to(x + self.dx, -y);
    }
    fn line_to(&mut self, x: f32, y: f32) {
        self.pb.line_to(x + self.dx, -y);
    }
    fn quad_to(&mut self, cx: f32, cy: f32, x: f32, y: f32) {
        self.pb.quad_to(cx + self.dx, -cy, x + self.dx, -y);
    }
    fn curve_to(&mut self, c0x: f32, c0y: f32, c1x: f32, c1y: f32, x: f32, y: f32) {
        self.pb
            .cubic_to(c0x + self.dx, -c0y, c1x + self.dx, -c1y, x + self.dx, -y);
    }
    fn close(&mut self) {
        self.pb.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panel() -> Panel {
        Panel {
            title: "Validation loss".into(),
            x_label: "step".into(),
            y_label: "loss".into(),
            series: vec![Series {
                label: "AdamW".into(),
                rgb: [200, 0, 0],
                dashed: false,
                points: vec![(0.0, 3.0), (100.0, 2.0), (200.0, 1.5)],
                band: vec![(0.0, 2.9, 3.1), (100.0, 1.9, 2.1), (200.0, 1.4, 1.6)],
            }],
            guides: vec![(2.5, "goal".into())],
        }
    }

    fn red_in(pix: &Pixmap, x: f32, y: f32) -> bool {
        let (cx, cy) = (x.round() as i64, y.round() as i64);
        (-2..=2).any(|dx| {
            (-2..=2).any(|dy| {
                pix.pixel((cx + dx) as u32, (cy + dy) as u32)
                    .is_some_and(|p| p.red() > 150 && p.green() < 60 && p.blue() < 60)
            })
        })
    }

    #[test]
    fn a_chart_draws_its_points_where_the_axes_put_them_and_its_title_in_ink() {
        let (w, h) = (480, 320);
        let png = render(&[panel(), panel()], w, h).unwrap();
        let pix = Pixmap::decode_png(&png).unwrap();
        assert_eq!((pix.width(), pix.height()), (2 * w, h));
        // The y range widens 1.4..3.1 by 5% and rounds out to whole ticks.
        let f = Frame {
            x0: MARGIN_LEFT,
            y0: MARGIN_TOP,
            w: w as f32 - MARGIN_LEFT - MARGIN_RIGHT,
            h: h as f32 - MARGIN_TOP - MARGIN_BOTTOM,
            xr: (0.0, 200.0),
            yr: nice_range((1.4, 3.1), true),
        };
        for (x, y) in [(0.0, 3.0), (100.0, 2.0), (200.0, 1.5)] {
            let (px, py) = f.px(x, y);
            assert!(
                red_in(&pix, px, py),
                "no marker at ({x}, {y}) = ({px}, {py})"
            );
            assert!(red_in(&pix, px + w as f32, py), "second panel, ({x}, {y})");
        }
        // Far from the line, inside the plot: no red.
        let (px, py) = f.px(180.0, 2.9);
        assert!(!red_in(&pix, px, py));
        // The title is drawn in dark ink around its centre line.
        let ink = (0..w)
            .flat_map(|x| (8..28).map(move |y| (x, y)))
            .filter(|&(x, y)| pix.pixel(x, y).is_some_and(|p| p.red() < 120))
            .count();
        assert!(ink > 50, "only {ink} dark pixels in the title row");
    }

    #[test]
    fn ticks_are_round_numbers_that_cover_the_data() {
        assert_eq!(tick_step(1.7), 0.5);
        assert_eq!(tick_step(2000.0), 500.0);
        let (lo, hi) = nice_range((1.4, 3.1), true);
        assert!(lo <= 1.4 && hi >= 3.1);
        let t = ticks((lo, hi));
        assert_eq!(*t.first().unwrap(), lo);
        assert!((t.last().unwrap() - hi).abs() < 1e-9);
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(1500.0), "1500");
    }

    #[test]
    fn a_panel_with_nothing_to_draw_is_an_error_not_a_blank_image() {
        let mut p = panel();
        p.series[0].points.clear();
        assert!(render(&[p], 200, 100).is_err());
    }
}
