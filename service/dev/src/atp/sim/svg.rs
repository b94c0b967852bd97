//! The report as an SVG chart.

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

use super::report::Report;
use super::report::StrategyReport;

/// Writes [`svg`] to `path`; the error names the path.
pub fn write_svg(report: &Report, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, svg(report)?).with_context(|| format!("--plot {}", path.display()))
}

/// The report as grouped bars, one group per metric, one bar per strategy,
/// each bar relative to the largest in its group (∞ where a strategy never
/// recovers), drawn with plotters' SVG backend as the CLI's other plots are.
pub fn svg(report: &Report) -> anyhow::Result<String> {
    type Metric = (&'static str, fn(&StrategyReport) -> Option<f64>);
    let metrics: [Metric; 6] = [
        ("cost/task ($)", |r| Some(r.cost_per_task)),
        ("latency (s)", |r| Some(r.latency_s)),
        ("quality", |r| Some(r.quality)),
        ("recovery (s)", |r| r.recovery_s),
        ("tasks lost", |r| Some(r.lost as f64)),
        ("context efficiency", |r| Some(r.context_efficiency)),
    ];
    let n = report.strategies.len().max(1) as f64;
    let bar_w = 0.8 / n;
    let title = format!(
        "AgentNet-Bench-style simulation: {} agents, {} tasks (bars relative to the largest per metric)",
        report.config.agents, report.config.tasks
    );
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (860, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 14))
            .margin(12)
            .build_cartesian_2d(0f64..metrics.len() as f64, -0.12f64..1.12f64)?;
        chart.draw_series(std::iter::once(PathElement::new([(0.0, 0.0), (metrics.len() as f64, 0.0)], BLACK)))?;
        for (si, r) in report.strategies.iter().enumerate() {
            let color = COLORS[si % COLORS.len()];
            let mut bars = Vec::new();
            let mut labels = Vec::new();
            for (mi, (_, get)) in metrics.iter().enumerate() {
                let max = report.strategies.iter().filter_map(get).fold(0.0f64, f64::max);
                let x = mi as f64 + 0.1 + bar_w * si as f64;
                match get(r) {
                    Some(v) => {
                        let rel = if max > 0.0 { v / max } else { 0.0 };
                        bars.push(Rectangle::new([(x, 0.0), (x + bar_w * 0.9, rel)], color.filled()));
                        let shown = if v >= 100.0 { format!("{v:.0}") } else { format!("{v:.3}") };
                        labels.push(Text::new(shown, (x, rel + 0.05), ("sans-serif", 9)));
                    }
                    None => labels.push(Text::new("∞".to_string(), (x, 0.06), ("sans-serif", 11))),
                }
            }
            chart
                .draw_series(bars)?
                .label(r.strategy.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
            chart.draw_series(labels)?;
        }
        chart.draw_series(
            metrics
                .iter()
                .enumerate()
                .map(|(mi, (name, _))| Text::new(*name, (mi as f64 + 0.15, -0.07), ("sans-serif", 12))),
        )?;
        chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).border_style(BLACK).draw()?;
        root.present()?;
    }
    Ok(out)
}

/// Colours of the strategies, in order.
const COLORS: [RGBColor; 5] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x7f, 0x7f, 0x7f),
];
