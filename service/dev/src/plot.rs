//! SVG line plots for the CLI's reports (`scd-dev eval --plot`), drawn with
//! `plotters`' SVG backend only: no bitmap backend, no system fonts (text is
//! emitted as SVG `<text>` and laid out by the viewer).

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

/// One line of a plot: its legend label and its `(x, y)` points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points in drawing order.
    pub points: Vec<(f32, f32)>,
}

/// The series of `points` (label, point), one per label in order of first
/// appearance, each with its points in the order given.
pub fn by_label<'a>(points: impl IntoIterator<Item = (&'a str, (f32, f32))>) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for (label, point) in points {
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push(point),
            None => series.push(Series { label: label.to_string(), points: vec![point] }),
        }
    }
    series
}

/// Colours of the series, in order (red for the first, SCD in `scd-dev eval`).
const COLORS: [RGBColor; 5] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// Evidence recall (y, 0–1) against reduction ratio (x, from 1×), one line
/// with point markers per series, as an SVG document.
pub fn recall_vs_reduction(title: &str, series: &[Series]) -> anyhow::Result<String> {
    let xmax = series.iter().flat_map(|s| &s.points).map(|p| p.0).fold(1.0f32, f32::max).ceil().max(2.0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (640, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(1f32..xmax, 0f32..1f32)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_labels(xmax as usize)
            .x_label_formatter(&|v| format!("{v:.0}x"))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .x_desc("reduction ratio (context tokens / sent tokens)")
            .y_desc("evidence recall")
            .draw()?;
        for (i, s) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let mut points = s.points.clone();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
                .label(s.label.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart.configure_series_labels().position(SeriesLabelPosition::LowerRight).border_style(BLACK).draw()?;
        root.present()?;
    }
    Ok(svg)
}

/// Writes [`recall_vs_reduction`] to `path`; errors name the `--plot` path.
pub fn write_recall_vs_reduction(path: &Path, title: &str, series: &[Series]) -> anyhow::Result<()> {
    let svg = recall_vs_reduction(title, series)?;
    std::fs::write(path, svg).with_context(|| format!("--plot {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_has_every_series_label_and_a_marker_per_point() {
        let series = [
            Series { label: "scd".into(), points: vec![(5.1, 0.88), (3.1, 0.95), (4.0, 0.93)] },
            Series { label: "random".into(), points: vec![(3.0, 0.33)] },
        ];
        let svg = recall_vs_reduction("hotpotqa: evidence recall vs token reduction", &series).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        for text in ["scd", "random", "hotpotqa: evidence recall vs token reduction", "evidence recall", "5x"] {
            assert!(svg.contains(&format!(">{text}</text>")) || svg.contains(&format!(">\n{text}\n</text>")), "{text}");
        }
        assert_eq!(svg.matches("<circle").count(), 4);
    }

    #[test]
    fn points_are_grouped_by_label_in_order_of_first_appearance() {
        let s = by_label([("scd", (5.0, 0.9)), ("bm25", (5.0, 0.5)), ("scd", (10.0, 0.8))]);
        let got: Vec<(&str, &[(f32, f32)])> = s.iter().map(|s| (s.label.as_str(), s.points.as_slice())).collect();
        assert_eq!(got, [("scd", &[(5.0, 0.9), (10.0, 0.8)][..]), ("bm25", &[(5.0, 0.5)][..])]);
    }

    #[test]
    fn unwritable_path_names_the_plot_flag() {
        let e = write_recall_vs_reduction(Path::new("/no/such/dir/p.svg"), "t", &[]).unwrap_err();
        assert!(format!("{e:#}").starts_with("--plot /no/such/dir/p.svg"), "{e:#}");
    }
}
