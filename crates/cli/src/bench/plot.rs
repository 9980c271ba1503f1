//! PNG line plots (plotters, bitmap backend only). Text needs a font: one is looked for on the
//! system at run time (`TANDEM_PLOT_FONT`, then common DejaVu/Liberation paths) and registered
//! with plotters' ab_glyph renderer; with none found (or `TANDEM_PLOT_FONT=none`) the plot is
//! drawn without any text.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial Unicode.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers a system font once; false when none could be read.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let env = std::env::var("TANDEM_PLOT_FONT").ok();
        if env.as_deref() == Some("none") {
            return false;
        }
        for p in env.iter().map(String::as_str).chain(FONT_PATHS.iter().copied()) {
            if let Ok(bytes) = std::fs::read(p) {
                // plotters keeps fonts for the life of the process: leaking one file is that.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        eprintln!("plot: no usable font found (set TANDEM_PLOT_FONT to a .ttf); drawing without text");
        false
    })
}

/// One line of points, with an optional label at each point (e.g. the setting it came from).
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub point_labels: Vec<String>,
}

/// One panel of a figure.
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const COLORS: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44), RGBColor(255, 127, 14)];

/// Draws the panels side by side into a PNG.
pub fn draw(path: &Path, panels: &[Panel]) -> Result<()> {
    let text = font_ready();
    let width = 640 * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (width, 480)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (area, p) in areas.iter().zip(panels) {
        draw_panel(area, p, text).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_panel(area: &Area, p: &Panel, text: bool) -> Result<(), Box<dyn std::error::Error>> {
    let pts = p.series.iter().flat_map(|s| s.points.iter()).filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1, y1) = (0.0, 1.0, 1.0);
    }
    let pad = ((x1 - x0) * 0.08).max(1e-9);
    let (x0, x1, y1) = ((x0 - pad).max(0.0), x1 + pad, if y1 > 0.0 { y1 * 1.15 } else { 1.0 });

    let mut b = ChartBuilder::on(area);
    b.margin(16).x_label_area_size(if text { 40 } else { 8 }).y_label_area_size(if text { 64 } else { 8 });
    if text {
        b.caption(&p.title, ("sans-serif", 20));
    }
    let mut chart = b.build_cartesian_2d(x0..x1, 0f64..y1)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(&p.x_label).y_desc(&p.y_label).label_style(("sans-serif", 13));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    for (i, s) in p.series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let line = chart.draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))?;
        if text {
            line.label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        }
        chart.draw_series(s.points.iter().map(|&(x, y)| Circle::new((x, y), 4, c.filled())))?;
        if text {
            for (&(x, y), l) in s.points.iter().zip(&s.point_labels) {
                chart.draw_series(std::iter::once(Text::new(
                    l.clone(),
                    (x, y),
                    ("sans-serif", 12).into_font().color(&c),
                )))?;
            }
        }
    }
    if text && p.series.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    Ok(())
}
