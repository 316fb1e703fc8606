//! The report's figures, drawn with plotters' SVG backend into strings.
//!
//! Three chart shapes cover every figure: [`line_chart`] (time series and
//! curves against message length or streams, with log axes done by hand:
//! log2 for sizes and counts, log10 for latencies, labelled in real units),
//! [`bar_chart`] (stacked bars: per-stream throughput, CPU, disk IO) and
//! [`heatmap`] (window x streams). Text stays `<text>` elements in the SVG,
//! so no font files are needed to draw and the browser renders the labels.

use std::ops::Range;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::{Error, Result};

/// Figure size in pixels (fits a laptop screen two-thirds wide).
pub const WIDTH: u32 = 860;
pub const HEIGHT: u32 = 400;

const FONT: &str = "sans-serif";

/// Tableau 10: distinguishable, also for most colour-blind readers.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn draw_err(e: impl std::fmt::Debug) -> Error {
    Error::io("drawing a figure", std::io::Error::other(format!("{e:?}")))
}

/// How an axis maps and labels values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Axis {
    /// Plain numbers, label = value / divisor with the unit in the caption.
    Linear,
    /// log2 of a byte size, labelled 64 B, 1 KiB, ...
    Log2Bytes,
    /// log2 of a count (streams), labelled 1, 2, 4, ...
    Log2Count,
    /// log10 of a value, labelled at powers of ten.
    Log10,
}

impl Axis {
    fn map(self, v: f64) -> f64 {
        match self {
            Axis::Linear => v,
            Axis::Log2Bytes | Axis::Log2Count => v.max(1e-9).log2(),
            Axis::Log10 => v.max(1e-9).log10(),
        }
    }

    fn label(self, v: f64) -> String {
        let whole = (v - v.round()).abs() < 1e-6;
        match self {
            Axis::Linear => trim_num(v),
            _ if !whole => String::new(),
            Axis::Log2Bytes => size_label(2f64.powf(v.round())),
            Axis::Log2Count => format!("{}", 2f64.powf(v.round())),
            // Decades read as 1, 10, 100, 1k, 10k: one style per axis.
            Axis::Log10 => match 10f64.powf(v.round()) {
                p if (1000.0..1e6).contains(&p) => format!("{}k", trim_num(p / 1000.0)),
                p => trim_num(p),
            },
        }
    }

    /// Extends a mapped range so the ticks land on whole labels.
    fn pad(self, lo: f64, hi: f64) -> (f64, f64) {
        match self {
            Axis::Linear => {
                let hi = if hi <= lo { lo + 1.0 } else { hi };
                // Headroom for the legend in the upper left.
                (lo.min(0.0), hi * 1.25)
            }
            _ => {
                let (lo, hi) = (lo.floor(), hi.ceil());
                (lo - 0.3, if hi <= lo { lo + 1.3 } else { hi + 0.3 })
            }
        }
    }
}

fn trim_num(v: f64) -> String {
    // Large values (a series whose unit could not be scaled) get SI
    // suffixes so the labels stay inside the label area.
    for (div, suffix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")] {
        if v.abs() >= div {
            let d = if suffix == "k" { 1e3 } else { div };
            return format!("{}{suffix}", trim_num(v / d));
        }
    }
    if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// 64 -> "64 B", 1024 -> "1 KiB", 1048576 -> "1 MiB".
pub fn size_label(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{} {}", trim_num(v), UNITS[u])
}

/// A divisor and unit for bits/s values up to `max`.
pub fn rate_unit(max: f64) -> (f64, &'static str) {
    if max >= 1e9 {
        (1e9, "Gb/s")
    } else if max >= 1e6 {
        (1e6, "Mb/s")
    } else {
        (1e3, "kb/s")
    }
}

/// A divisor and unit for bytes/s values up to `max`.
pub fn byte_rate_unit(max: f64) -> (f64, &'static str) {
    if max >= 1e9 {
        (1e9, "GB/s")
    } else if max >= 1e6 {
        (1e6, "MB/s")
    } else {
        (1e3, "kB/s")
    }
}

/// One line of a line chart, in data units (the axes map them).
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Thin dashed line for a second quantity of the same group (p99 next
    /// to p50, receiver next to sender).
    pub dashed: bool,
    pub color: usize,
    /// Dots at the data points (off for step lines and long series).
    pub markers: bool,
}

/// The chart every figure draws on: plain f64 coordinates in both axes,
/// on an SVG canvas that outlives it.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One figure as SVG text: a white `WIDTH` x `HEIGHT` canvas with a titled
/// chart over `x` x `y`, on which `draw` draws the rest. `draw` is handed
/// the canvas too: borrowing it is what ties the chart's two lifetimes.
fn figure(
    title: &str,
    x: Range<f64>,
    y: Range<f64>,
    draw: impl for<'a, 'b> FnOnce(
        &'a DrawingArea<SVGBackend<'b>, Shift>,
        &mut Chart<'a, 'b>,
    ) -> Result<()>,
) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x, y)
            .map_err(draw_err)?;
        draw(&root, &mut chart)?;
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// The legend box of the series drawn with a label.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, position: SeriesLabelPosition) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(draw_err)
}

/// The label of category `v` on an axis of categories at 0, 1, 2...; none
/// between them.
fn category_label(labels: &[String], v: f64) -> String {
    let i = v.round();
    if (v - i).abs() > 1e-6 || i < 0.0 {
        return String::new();
    }
    labels.get(i as usize).cloned().unwrap_or_default()
}

/// A line chart; empty series are left out. Returns the SVG text.
pub fn line_chart(
    title: &str,
    x: (Axis, &str),
    y: (Axis, &str),
    series: &[Series],
) -> Result<String> {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .map(|&(a, b)| (x.0.map(a), y.0.map(b)))
        .collect();
    let (xlo, xhi) = min_max(pts.iter().map(|p| p.0));
    let (ylo, yhi) = min_max(pts.iter().map(|p| p.1));
    let (xlo, xhi) = match x.0 {
        Axis::Linear => (xlo.min(0.0), if xhi > xlo { xhi } else { xlo + 1.0 }),
        a => a.pad(xlo, xhi),
    };
    let (ylo, yhi) = y.0.pad(ylo, yhi);
    figure(title, xlo..xhi, ylo..yhi, |_, chart| {
        let (xa, ya) = (x.0, y.0);
        let xfmt = move |v: &f64| xa.label(*v);
        let yfmt = move |v: &f64| ya.label(*v);
        let x_labels = match xa {
            Axis::Linear => 10,
            _ => ((xhi - xlo).ceil() as usize + 1).clamp(2, 24),
        };
        let y_labels = match ya {
            Axis::Linear => 8,
            _ => ((yhi - ylo).ceil() as usize + 1).clamp(2, 16),
        };
        chart
            .configure_mesh()
            .x_desc(x.1)
            .y_desc(y.1)
            .x_labels(x_labels)
            .y_labels(y_labels)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(draw_err)?;
        for s in series.iter().filter(|s| !s.points.is_empty()) {
            let c = color(s.color);
            let mapped: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|(a, b)| a.is_finite() && b.is_finite())
                .map(|&(a, b)| (xa.map(a), ya.map(b)))
                .collect();
            if s.dashed {
                let style = c.stroke_width(1);
                chart
                    .draw_series(DashedLineSeries::new(mapped.clone(), 6, 4, style))
                    .map_err(draw_err)?
                    .label(s.name.clone())
                    .legend(move |(lx, ly)| {
                        EmptyElement::at((lx, ly))
                            + PathElement::new(vec![(0, 0), (6, 0)], style)
                            + PathElement::new(vec![(11, 0), (18, 0)], style)
                    })
            } else {
                chart
                    .draw_series(LineSeries::new(mapped.clone(), c.stroke_width(2)))
                    .map_err(draw_err)?
                    .label(s.name.clone())
                    .legend(move |(lx, ly)| {
                        PathElement::new(vec![(lx, ly), (lx + 18, ly)], c.stroke_width(2))
                    })
            };
            if s.markers && mapped.len() <= 64 {
                let marker = if s.dashed { 2 } else { 3 };
                chart
                    .draw_series(
                        mapped
                            .iter()
                            .map(|&p| Circle::new(p, marker, c.filled()).into_dyn()),
                    )
                    .map_err(draw_err)?;
            }
        }
        if series.iter().any(|s| !s.points.is_empty()) {
            legend(chart, SeriesLabelPosition::UpperLeft)?;
        }
        Ok(())
    })
}

fn min_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo.is_finite() {
        (lo, hi)
    } else {
        (0.0, 1.0)
    }
}

/// One bar of a (stacked) bar chart: its label and one value per part.
#[derive(Debug, Clone)]
pub struct Bar {
    pub label: String,
    pub parts: Vec<f64>,
}

/// Stacked bars, one colour per part (with a legend when there is more
/// than one part). `y_label_max` hides tick labels above it (percentages:
/// the legend's headroom is not a value).
pub fn bar_chart(
    title: &str,
    (x_desc, y_desc): (&str, &str),
    part_names: &[&str],
    bars: &[Bar],
    y_label_max: Option<f64>,
) -> Result<String> {
    let n = bars.len().max(1);
    let top = bars
        .iter()
        .map(|b| b.parts.iter().sum::<f64>())
        .fold(0.0, f64::max);
    // Headroom for the legend in the upper right.
    let top = if top > 0.0 {
        top * if part_names.len() > 1 { 1.35 } else { 1.1 }
    } else {
        1.0
    };
    figure(title, -0.5f64..(n as f64 - 0.5), 0f64..top, |_, chart| {
        let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
        let xfmt = move |v: &f64| category_label(&labels, *v);
        let yfmt = move |v: &f64| match y_label_max {
            Some(max) if *v > max + 1e-9 => String::new(),
            _ => trim_num(*v),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(n.min(24) + 1)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .label_style((FONT, 12))
            .axis_desc_style((FONT, 14))
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(draw_err)?;
        let half = 0.38;
        for (p, name) in part_names.iter().enumerate() {
            let c = color(p);
            let rects = bars.iter().enumerate().filter_map(move |(i, b)| {
                let below: f64 = b.parts[..p.min(b.parts.len())].iter().sum();
                let v = b.parts.get(p).copied().unwrap_or(0.0);
                (v > 0.0).then(|| {
                    Rectangle::new(
                        [(i as f64 - half, below), (i as f64 + half, below + v)],
                        c.filled(),
                    )
                })
            });
            let drawn = chart.draw_series(rects).map_err(draw_err)?;
            if part_names.len() > 1 {
                drawn.label(name.to_string()).legend(move |(lx, ly)| {
                    Rectangle::new([(lx, ly - 5), (lx + 12, ly + 5)], c.filled())
                });
            }
        }
        if part_names.len() > 1 {
            legend(chart, SeriesLabelPosition::UpperRight)?;
        }
        Ok(())
    })
}

/// A heatmap: `values[row][col]`, rows bottom to top. Each cell shows its
/// value as text (`fmt`); colour runs from pale (0) to dark blue (max).
pub fn heatmap(
    title: &str,
    (x_desc, x_labels): (&str, &[String]),
    (y_desc, y_labels): (&str, &[String]),
    values: &[Vec<Option<f64>>],
    fmt: &dyn Fn(f64) -> String,
) -> Result<String> {
    let (nx, ny) = (x_labels.len().max(1), y_labels.len().max(1));
    let max = values
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(0.0, f64::max);
    let (xr, yr) = (-0.5f64..(nx as f64 - 0.5), -0.5f64..(ny as f64 - 0.5));
    figure(title, xr, yr, |_, chart| {
        let xfmt = |v: &f64| category_label(x_labels, *v);
        let yfmt = |v: &f64| category_label(y_labels, *v);
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(nx + 1)
            .y_labels(ny + 1)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(draw_err)?;
        let lo = (247.0, 251.0, 255.0);
        let hi = (8.0, 48.0, 107.0);
        let mut cells = Vec::new();
        let mut texts = Vec::new();
        for (r, row) in values.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                let (x, y) = (c as f64, r as f64);
                let (fill, label, dark) = match v {
                    Some(v) => {
                        let t = if max > 0.0 {
                            (v / max).clamp(0.0, 1.0)
                        } else {
                            0.0
                        };
                        let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
                        (
                            RGBColor(mix(lo.0, hi.0), mix(lo.1, hi.1), mix(lo.2, hi.2)),
                            fmt(*v),
                            t > 0.55,
                        )
                    }
                    None => (RGBColor(230, 230, 230), "-".to_string(), false),
                };
                cells.push(Rectangle::new(
                    [(x - 0.49, y - 0.49), (x + 0.49, y + 0.49)],
                    fill.filled(),
                ));
                texts.push((label, (x, y), dark));
            }
        }
        chart.draw_series(cells).map_err(draw_err)?;
        for (label, pos, dark) in texts {
            let c = if dark { WHITE } else { BLACK };
            let style = TextStyle::from((FONT, 13).into_font())
                .color(&c)
                .pos(Pos::new(HPos::Center, VPos::Center));
            chart
                .draw_series(std::iter::once(Text::new(label, pos, style)))
                .map_err(draw_err)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_in_real_units() {
        assert_eq!(size_label(64.0), "64 B");
        assert_eq!(size_label(1024.0), "1 KiB");
        assert_eq!(size_label(1536.0), "1.5 KiB");
        assert_eq!(Axis::Log2Bytes.label(20.0), "1 MiB");
        assert_eq!(Axis::Log2Bytes.label(20.5), "");
        assert_eq!(Axis::Log2Count.label(5.0), "32");
        assert_eq!(Axis::Log10.label(2.0), "100");
        assert_eq!(Axis::Log10.label(3.0), "1k");
        assert_eq!(Axis::Log10.label(-1.0), "0.1");
        assert_eq!(rate_unit(9.2e9), (1e9, "Gb/s"));
        assert_eq!(trim_num(3e9), "3G");
        assert_eq!(trim_num(250_000.0), "250k");
        assert_eq!(trim_num(10_000.0), "10k");
        assert_eq!(trim_num(12.5), "12.5");
    }

    #[test]
    fn charts_are_svg_with_drawn_elements() {
        let s = Series {
            name: "a".into(),
            points: vec![(64.0, 10.0), (1024.0, 20.0), (1048576.0, 400.0)],
            dashed: false,
            color: 0,
            markers: true,
        };
        let svg = line_chart("t", (Axis::Log2Bytes, "x"), (Axis::Log10, "y"), &[s]).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("width=\"860\""),
            "{svg}"
        );
        assert!(svg.contains("<polyline") && svg.contains("1 MiB"));
        let bars = bar_chart(
            "b",
            ("x", "y"),
            &["u", "s"],
            &[Bar {
                label: "one".into(),
                parts: vec![1.0, 2.0],
            }],
            None,
        )
        .unwrap();
        assert!(bars.matches("<rect").count() >= 3);
        let h = heatmap(
            "h",
            ("x", &["a".into(), "b".into()]),
            ("y", &["1".into()]),
            &[vec![Some(1.0), None]],
            &|v| format!("{v:.1}"),
        )
        .unwrap();
        assert!(h.contains("\n1.0\n") && h.contains("\n-\n"), "{h}");
    }
}
