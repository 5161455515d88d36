//! Learning-curve PNGs for run reports: plotters draws into an RGB buffer (text through
//! ab_glyph and the DejaVu Sans font shipped in assets/fonts), png encodes it, and the file is
//! written atomically.

use std::path::Path;
use std::sync::Once;

use anyhow::Context;
use plotters::prelude::*;

/// One line of a panel.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend entry.
    pub label: String,
    /// `(x, y)` points in x order; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
}

/// One chart of a figure.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Caption.
    pub title: String,
    /// Axis descriptions.
    pub x_label: String,
    /// Axis descriptions.
    pub y_label: String,
    /// Lines.
    pub series: Vec<Series>,
}

const FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");
const PANEL_W: u32 = 640;
const HEIGHT: u32 = 420;

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is compiled in; failing to parse it would be a build defect, and plotters
        // then draws no text rather than failing.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        let pad = if lo.abs() > 1e-12 {
            0.05 * lo.abs()
        } else {
            0.5
        };
        return (lo - pad, hi + pad);
    }
    let pad = 0.05 * (hi - lo);
    (lo - pad, hi + pad)
}

/// Draws `panels` side by side into a PNG at `path`.
pub fn write_png(path: &Path, panels: &[Panel]) -> anyhow::Result<()> {
    anyhow::ensure!(!panels.is_empty(), "a figure needs at least one panel");
    register_font();
    let width = PANEL_W * panels.len() as u32;
    let mut rgb = vec![255u8; (width * HEIGHT * 3) as usize];
    draw(&mut rgb, width, panels)
        .map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, width, HEIGHT);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().context("encoding the PNG")?;
        w.write_image_data(&rgb).context("encoding the PNG")?;
    }
    diffrl_core::fs::write_atomic(path, &bytes)
        .with_context(|| format!("writing {}", path.display()))
}

fn draw(rgb: &mut [u8], width: u32, panels: &[Panel]) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::with_buffer(rgb, (width, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, panels.len()));
    for (area, p) in areas.iter().zip(panels) {
        let pts = || p.series.iter().flat_map(|s| s.points.iter());
        let (x0, x1) = range(pts().map(|q| q.0));
        let (y0, y1) = range(pts().map(|q| q.1));
        let mut chart = ChartBuilder::on(area)
            .caption(&p.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        chart
            .configure_mesh()
            .x_desc(p.x_label.as_str())
            .y_desc(p.y_label.as_str())
            .label_style(("sans-serif", 13))
            .draw()?;
        for (i, s) in p.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            let marker = points.len() <= 60;
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            if marker {
                chart.draw_series(points.iter().map(|&q| Circle::new(q, 3, color.filled())))?;
            }
        }
        if p.series.iter().any(|s| !s.label.is_empty()) {
            chart
                .configure_series_labels()
                .label_font(("sans-serif", 13))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .position(SeriesLabelPosition::LowerRight)
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_of_the_right_size_with_ink_on_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.png");
        let panels = vec![
            Panel {
                title: "loss".into(),
                x_label: "step".into(),
                y_label: "loss".into(),
                series: vec![Series {
                    label: "bc".into(),
                    points: (0..100)
                        .map(|i| (i as f64, 1.0 / (1.0 + i as f64)))
                        .collect(),
                }],
            },
            Panel {
                title: "one point, a NaN, and an empty series".into(),
                x_label: "x".into(),
                y_label: "y".into(),
                series: vec![
                    Series {
                        label: "a".into(),
                        points: vec![(1.0, 0.5), (2.0, f64::NAN)],
                    },
                    Series {
                        label: "b".into(),
                        points: vec![],
                    },
                ],
            },
        ];
        write_png(&p, &panels).unwrap();
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&p).unwrap()));
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (2 * PANEL_W, HEIGHT));
        let dark = buf.chunks(3).filter(|c| c.iter().all(|&v| v < 100)).count();
        assert!(dark > 2000, "axes and text drawn: {dark} dark pixels");
        assert!(write_png(&p, &[]).is_err());
    }
}
