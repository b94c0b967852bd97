//! How often reports parse, as written and once rendered again.

use serde::Serialize;

use super::read::parse;
use super::report::{Format, Parsed};
use super::write::render;

/// Counts of reports that parse as written, and of their re-rendered forms
/// (which must always parse, with the same answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ParseRate {
    /// Reports seen.
    pub reports: usize,
    /// Of them, parsed as written.
    pub parsed: usize,
    /// Re-rendered reports.
    pub rendered: usize,
    /// Of them, parsed back with the same answer.
    pub render_parsed: usize,
}

impl ParseRate {
    /// Parses `text` in `format` (detected when `None`), counts it, renders
    /// the report in that same format, parses that and counts it too.
    /// Returns the first parse.
    pub fn add(&mut self, text: &str, format: Option<Format>) -> Parsed {
        let format = format.unwrap_or_else(|| Format::detect(text));
        let p = parse(text, format);
        self.reports += 1;
        self.parsed += usize::from(p.parsed);
        let answer = p.answer.as_deref().filter(|a| !a.contains('\n'));
        let back = parse(&render(&p.report, format, answer), format);
        self.rendered += 1;
        self.render_parsed += usize::from(back.parsed && back.answer.as_deref() == answer);
        p
    }

    /// Reports that parse as written / all reports (1 when none).
    pub fn parse_rate(&self) -> f64 {
        ratio(self.parsed, self.reports)
    }

    /// Re-rendered reports that parse / all re-rendered (1 when none).
    pub fn render_parse_rate(&self) -> f64 {
        ratio(self.render_parsed, self.rendered)
    }
}

fn ratio(n: usize, d: usize) -> f64 {
    if d == 0 {
        1.0
    } else {
        n as f64 / d as f64
    }
}
