//! SVG plots: latency per iteration with each series' mean drawn as a dashed line (as in the
//! original MongoDB / RethinkDB posts), the latency CDF, and throughput against concurrency.
//!
//! SVG through `plotters` without its font and bitmap stack: text is left to the viewer, so
//! nothing here needs a C library or a system font, and the files stay small (each series is
//! one polyline of at most a few hundred points).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::measure::{fmt_us, quantile};
use super::{BenchError, Result};

/// Points per series in a per-iteration plot; longer runs are bucketed (each point is the
/// slowest of its bucket, so spikes stay visible).
const MAX_POINTS: usize = 600;
const SIZE: (u32, u32) = (900, 500);
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A named series of values (latencies in µs, in iteration order).
pub struct Line<'a> {
    /// Legend text.
    pub name: String,
    /// The values.
    pub values: &'a [f64],
}

/// A per-iteration line ready to draw: its points, bucket size and mean.
type Prepared = (Vec<(f64, f64)>, usize, f64);

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

fn plot_err(path: &Path) -> impl Fn(String) -> BenchError + '_ {
    move |message| BenchError::Plot {
        path: path.to_path_buf(),
        message,
    }
}

/// Latencies are plotted on a log axis: clamp at 0.1 µs so a zero is still drawable.
fn positive(v: f64) -> f64 {
    if v.is_finite() { v.max(0.1) } else { 0.1 }
}

/// The (index, value) points of a per-iteration series, bucketed to at most `MAX_POINTS`.
pub fn bucketed(values: &[f64]) -> (Vec<(f64, f64)>, usize) {
    let k = values.len().div_ceil(MAX_POINTS).max(1);
    let pts = values
        .chunks(k)
        .enumerate()
        .map(|(i, c)| {
            let max = c.iter().copied().fold(f64::MIN, f64::max);
            ((i * k) as f64, positive(max))
        })
        .collect();
    (pts, k)
}

/// The (latency, fraction at or below) points of a CDF: fine steps in the body and, on a
/// logarithmic grid, out to the 99.99th percentile, then the maximum.
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return Vec::new();
    }
    let mut qs: Vec<f64> = (0..=180).map(|j| 0.9 * j as f64 / 180.0).collect();
    qs.extend((1..=120).map(|j| 1.0 - 0.1 * 10f64.powf(-3.0 * j as f64 / 120.0)));
    qs.push(1.0);
    let mut pts: Vec<(f64, f64)> = qs
        .into_iter()
        .map(|q| (positive(quantile(&sorted, q)), q))
        .collect();
    pts.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    pts
}

fn log_range(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let lo = positive(lo) / 1.5;
    let hi = (positive(hi) * 1.5).max(lo * 10.0);
    lo..hi
}

fn area(path: &Path) -> Result<DrawingArea<SVGBackend<'_>, Shift>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| plot_err(path)(e.to_string()))?;
    Ok(root)
}

/// Latency per iteration (log scale), each series' mean as a dashed line.
pub fn iterations(path: &Path, title: &str, lines: &[Line<'_>]) -> Result<()> {
    let err = plot_err(path);
    // (points, bucket size, mean) per line.
    let prepared: Vec<Prepared> = lines
        .iter()
        .map(|l| {
            let (pts, k) = bucketed(l.values);
            let mean = l.values.iter().sum::<f64>() / l.values.len().max(1) as f64;
            (pts, k, mean)
        })
        .collect();
    let n = lines
        .iter()
        .map(|l| l.values.len())
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    let lo = prepared
        .iter()
        .flat_map(|(p, _, m)| p.iter().map(|x| x.1).chain(std::iter::once(*m)))
        .fold(f64::MAX, f64::min);
    let hi = prepared
        .iter()
        .flat_map(|(p, _, m)| p.iter().map(|x| x.1).chain(std::iter::once(*m)))
        .fold(f64::MIN, f64::max);
    let bucket = prepared.iter().map(|p| p.1).max().unwrap_or(1);
    let root = area(path)?;
    let caption = if bucket > 1 {
        format!("{title} (each point: slowest of {bucket})")
    } else {
        title.to_string()
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..n, log_range(lo, hi).log_scale())
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("iteration")
        .y_desc("latency")
        .y_label_formatter(&|v| fmt_us(*v))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, (l, (pts, _, mean))) in lines.iter().zip(&prepared).enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(1)))
            .map_err(|e| err(e.to_string()))?
            .label(format!("{} (mean {})", l.name, fmt_us(*mean)))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, positive(*mean)), (n, positive(*mean))],
                8,
                5,
                c.stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// The cumulative distribution of latencies (log x), one curve per series.
pub fn cdf(path: &Path, title: &str, lines: &[Line<'_>]) -> Result<()> {
    let err = plot_err(path);
    let curves: Vec<Vec<(f64, f64)>> = lines.iter().map(|l| cdf_points(l.values)).collect();
    let lo = curves
        .iter()
        .flatten()
        .map(|p| p.0)
        .fold(f64::MAX, f64::min);
    let hi = curves
        .iter()
        .flatten()
        .map(|p| p.0)
        .fold(f64::MIN, f64::max);
    let root = area(path)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(log_range(lo, hi).log_scale(), 0f64..1.0)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("latency")
        .y_desc("fraction at or below")
        .x_label_formatter(&|v| fmt_us(*v))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, (l, pts)) in lines.iter().zip(&curves).enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(l.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Y against x (e.g. throughput against concurrency) with points joined, x on a log scale.
pub fn xy(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    lines: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let err = plot_err(path);
    let xs = lines.iter().flat_map(|l| l.1.iter().map(|p| p.0));
    let (xlo, xhi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let yhi = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(0f64, f64::max);
    let (xlo, xhi) = (xlo.max(1.0) / 1.2, (xhi.max(1.0) * 1.2).max(xlo * 2.0));
    let root = area(path)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((xlo..xhi).log_scale(), 0f64..(yhi * 1.15).max(1.0))
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| super::measure::thousands(v.round().max(0.0) as u64))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Y against time (feed lag, catch-up progress), both axes linear from 0.
pub fn timeline(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    lines: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let err = plot_err(path);
    let points = || lines.iter().flat_map(|l| l.1.iter());
    let xhi = points().map(|p| p.0).fold(0f64, f64::max).max(1e-3);
    let yhi = points().map(|p| p.1).fold(0f64, f64::max).max(1.0);
    let root = area(path)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..xhi * 1.02, 0f64..yhi * 1.1)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .y_label_formatter(&|v| super::measure::thousands(v.round().max(0.0) as u64))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Writes the per-iteration and CDF plots of a scenario (or one group of it) as
/// `<prefix>-latency.svg` and `<prefix>-cdf.svg`; returns the file names.
pub fn latency_pair(
    dir: &Path,
    prefix: &str,
    title: &str,
    lines: &[Line<'_>],
) -> Result<[String; 2]> {
    let a = format!("{prefix}-latency.svg");
    let b = format!("{prefix}-cdf.svg");
    iterations(
        &dir.join(&a),
        &format!("{title}: latency per iteration"),
        lines,
    )?;
    cdf(&dir.join(&b), &format!("{title}: latency CDF"), lines)?;
    Ok([a, b])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn long_series_are_bucketed_keeping_spikes() {
        let mut v = vec![1.0; 6000];
        v[4321] = 500.0;
        let (pts, k) = bucketed(&v);
        assert_eq!(k, 10);
        assert_eq!(pts.len(), 600);
        assert!(pts.iter().any(|p| p.1 == 500.0), "the spike survives");
    }

    #[test]
    fn cdf_is_monotone_and_ends_at_the_max() {
        let v: Vec<f64> = (1..=10_000).map(f64::from).collect();
        let pts = cdf_points(&v);
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(pts.last().unwrap(), &(10_000.0, 1.0));
        assert!(pts.len() < 400);
    }

    #[test]
    fn writes_svg_files() {
        let dir = tempfile::tempdir().unwrap();
        let a: Vec<f64> = (0..2000).map(|i| 10.0 + (i % 7) as f64).collect();
        let b = vec![100.0, 250.0, 90.0];
        let lines = [
            Line {
                name: "a".into(),
                values: &a,
            },
            Line {
                name: "b".into(),
                values: &b,
            },
        ];
        let files = latency_pair(dir.path(), "t", "test", &lines).unwrap();
        for f in files {
            let text = std::fs::read_to_string(dir.path().join(&f)).unwrap();
            assert!(
                text.starts_with("<svg"),
                "{f}: {}",
                &text[..40.min(text.len())]
            );
            assert!(text.trim_end().ends_with("</svg>"), "{f} is complete");
            assert!(text.len() < 200_000, "{f} is small: {} bytes", text.len());
        }
        xy(
            &dir.path().join("x.svg"),
            "xy",
            ("clients", "req/s"),
            &[("s".into(), vec![(1.0, 10.0), (10.0, 80.0), (300.0, 120.0)])],
        )
        .unwrap();
    }
}
