//! Learning-curve PNGs for run reports: plotters draws into an RGB buffer (text through
//! ab_glyph and the DejaVu Sans font shipped in assets/fonts), png encodes it, and the file is
//! written atomically.

use std::path::Path;
use std::sync::Once;

use anyhow::{Context, bail};
use plotters::prelude::*;
use serde_json::Value;

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

/// The JSON lines of a metrics.jsonl (unreadable lines skipped; a missing file gives none).
pub(crate) fn metrics_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `(x, y)` from records `rec[section][x_key]`, `rec[section][y_key]`; a resumed run logs some
/// steps twice: the last record of a step wins.
pub(crate) fn curve(
    lines: &[Value],
    section: &str,
    x_key: &str,
    y_key: &str,
    f: fn(f64) -> f64,
) -> Vec<(f64, f64)> {
    let mut m = std::collections::BTreeMap::new();
    for l in lines {
        let s = &l[section];
        if let (Some(x), Some(y)) = (s[x_key].as_u64(), s[y_key].as_f64()) {
            m.insert(x, f(y));
        }
    }
    m.into_iter().map(|(x, y)| (x as f64, y)).collect()
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

/// Axis tick text: whole numbers without a fraction (20000, not 20000.0), others as plotters
/// would write them.
fn tick(v: &f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The corner of the plot whose legend box would cover the least data: points and the lines
/// between them (sampled) counted in a box of 40% x 35% of the axes at each corner; ties go
/// to the first of lower right, upper right, upper left, lower left.
fn legend_corner(series: &[Series], x: (f64, f64), y: (f64, f64)) -> SeriesLabelPosition {
    let (w, h) = ((x.1 - x.0).max(1e-12), (y.1 - y.0).max(1e-12));
    // Every point and 8 samples along every segment, in axes fractions.
    let mut samples = Vec::new();
    for s in series {
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|(a, b)| a.is_finite() && b.is_finite())
            .map(|&(a, b)| ((a - x.0) / w, (b - y.0) / h))
            .collect();
        samples.extend(pts.iter().copied());
        for pair in pts.windows(2) {
            let ((a0, b0), (a1, b1)) = (pair[0], pair[1]);
            samples.extend((1..8).map(|i| {
                let f = f64::from(i) / 8.0;
                (a0 + f * (a1 - a0), b0 + f * (b1 - b0))
            }));
        }
    }
    let covered = |right: bool, upper: bool| {
        samples
            .iter()
            .filter(|&&(a, b)| {
                (if right { a >= 0.6 } else { a <= 0.4 })
                    && (if upper { b >= 0.65 } else { b <= 0.35 })
            })
            .count()
    };
    [
        (SeriesLabelPosition::LowerRight, covered(true, false)),
        (SeriesLabelPosition::UpperRight, covered(true, true)),
        (SeriesLabelPosition::UpperLeft, covered(false, true)),
        (SeriesLabelPosition::LowerLeft, covered(false, false)),
    ]
    .into_iter()
    .min_by_key(|&(_, n)| n)
    .map_or(SeriesLabelPosition::LowerRight, |(pos, _)| pos)
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
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
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
                .position(legend_corner(&p.series, (x0, x1), (y0, y1)))
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
    fn the_legend_goes_where_the_data_is_not() {
        use SeriesLabelPosition::{LowerRight, UpperRight};
        let s = |points: Vec<(f64, f64)>| Series {
            label: "s".into(),
            points,
        };
        let at = |series: Series| legend_corner(&[series], (0.0, 10.0), (0.0, 1.0));
        // A loss falling from the upper left to the lower right: the upper right is free.
        let falling = s((0..=10)
            .map(|i| (f64::from(i), 1.0 - 0.1 * f64::from(i)))
            .collect());
        assert!(matches!(at(falling), UpperRight));
        // A success curve rising from the lower left to the upper right: the lower right is free.
        let rising = s((0..=10)
            .map(|i| (f64::from(i), 0.1 * f64::from(i)))
            .collect());
        assert!(matches!(at(rising), LowerRight));
        // Three points whose lines cross the lower right and the upper right: the lines count,
        // not only the points, so a left corner is chosen.
        let across = s(vec![(5.0, 0.0), (10.0, 0.1), (5.0, 1.0)]);
        assert!(!matches!(at(across), LowerRight | UpperRight));
    }

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

/// `diffrl plot`: learning curves of fine-tuning runs, one line per arm, averaged over its runs
/// (seeds).
#[derive(Debug, clap::Args)]
pub struct PlotArgs {
    /// LABEL=DIR[,DIR...]: the runs of one arm (folders with the metrics.jsonl of `diffrl grpo`
    /// or `diffrl ppo`), averaged iteration by iteration over the iterations all of them have.
    #[arg(required = true, value_name = "LABEL=DIRS")]
    pub arms: Vec<String>,
    /// Where the PNG goes.
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Horizontal axis: environment steps (mean over the arm's runs) or iterations.
    #[arg(long, value_enum, default_value_t = XAxis::EnvSteps)]
    pub x: XAxis,
}

/// The horizontal axis of `diffrl plot`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum XAxis {
    /// Environment steps collected so far.
    EnvSteps,
    /// Fine-tuning iterations.
    Iteration,
}

/// One arm: its label and the `train` records of each run, by iteration.
struct Arm {
    label: String,
    dirs: Vec<std::path::PathBuf>,
    runs: Vec<std::collections::BTreeMap<u64, Value>>,
}

impl Arm {
    /// (mean x, mean y) over the runs at every iteration they all have.
    fn mean_curve(&self, x: XAxis, key: &str, scale: f64) -> Vec<(f64, f64)> {
        let Some(first) = self.runs.first() else {
            return Vec::new();
        };
        let n = self.runs.len() as f64;
        first
            .keys()
            .filter(|it| self.runs.iter().all(|r| r.contains_key(it)))
            .filter_map(|it| {
                let (mut xs, mut ys) = (0.0, 0.0);
                for r in &self.runs {
                    let rec = &r[it];
                    xs += match x {
                        XAxis::EnvSteps => rec["env_steps"].as_f64()?,
                        XAxis::Iteration => *it as f64,
                    };
                    ys += rec[key].as_f64()?;
                }
                Some((xs / n, scale * ys / n))
            })
            .collect()
    }
}

/// Reads the arms, draws rollout success and mean max score (and evaluation success when the
/// runs evaluated during training) against `x`, and prints each arm's final evaluation.
pub fn plot_cmd(args: &PlotArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let mut arms = Vec::new();
    for spec in &args.arms {
        let Some((label, dirs)) = spec.split_once('=') else {
            bail!("{spec:?}: expected LABEL=DIR[,DIR...]");
        };
        let dirs: Vec<std::path::PathBuf> = dirs
            .split(',')
            .filter(|d| !d.is_empty())
            .map(Into::into)
            .collect();
        let mut runs = Vec::new();
        for dir in &dirs {
            let path = dir.join("metrics.jsonl");
            anyhow::ensure!(
                path.is_file(),
                "{}: no such file (arm {label:?})",
                path.display()
            );
            let mut by_it = std::collections::BTreeMap::new();
            for l in metrics_lines(&path) {
                if let Some(it) = l["train"]["iteration"].as_u64() {
                    // A resumed run logs some iterations twice: the last record wins.
                    by_it.insert(it, l["train"].clone());
                }
            }
            anyhow::ensure!(
                !by_it.is_empty(),
                "{}: no training iterations in it (arm {label:?})",
                path.display()
            );
            runs.push(by_it);
        }
        anyhow::ensure!(!runs.is_empty(), "{spec:?}: no run folders after '='");
        arms.push(Arm {
            label: format!(
                "{label} ({} run{})",
                runs.len(),
                if runs.len() == 1 { "" } else { "s" }
            ),
            dirs,
            runs,
        });
    }
    let x_label = match args.x {
        XAxis::EnvSteps => "environment steps (mean over runs)",
        XAxis::Iteration => "iteration",
    };
    let panel = |title: &str, key: &str, y: &str| Panel {
        title: title.into(),
        x_label: x_label.into(),
        y_label: y.into(),
        series: arms
            .iter()
            .map(|a| Series {
                label: a.label.clone(),
                points: a.mean_curve(args.x, key, 100.0),
            })
            .collect(),
    };
    write_png(
        &args.out,
        &[
            panel(
                "Training rollouts: success (stochastic chains)",
                "success_rate",
                "success % (mean over runs)",
            ),
            panel(
                "Training rollouts: mean max score",
                "mean_max_score",
                "mean max score x 100 (mean over runs)",
            ),
        ],
    )?;
    writeln!(out, "wrote {}", args.out.display())?;
    for arm in &arms {
        let last = arm.mean_curve(args.x, "success_rate", 100.0);
        let evals: Vec<Value> = arm
            .dirs
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("eval.json")).ok())
            .filter_map(|t| serde_json::from_str(&t).ok())
            .collect();
        let (k, n) = evals.iter().fold((0, 0), |(k, n), e| {
            (
                k + e["successes"].as_u64().unwrap_or(0),
                n + e["episodes"].as_u64().unwrap_or(0),
            )
        });
        let eval = if n > 0 {
            let (lo, hi) = diffrl_core::stats::wilson_interval(
                k as usize,
                n as usize,
                diffrl_core::stats::Z95,
            );
            format!(
                "; evaluation {:.1}% ({k}/{n}, Wilson 95% {:.1}-{:.1}%)",
                100.0 * k as f64 / n as f64,
                100.0 * lo,
                100.0 * hi
            )
        } else {
            String::new()
        };
        writeln!(
            out,
            "{}: last rollout success {:.1}% at {:.0} {}{eval}",
            arm.label,
            last.last().map_or(f64::NAN, |p| p.1),
            last.last().map_or(f64::NAN, |p| p.0),
            match args.x {
                XAxis::EnvSteps => "environment steps",
                XAxis::Iteration => "iterations",
            }
        )?;
    }
    Ok(())
}
