//! `scd handoff parse|render`: hand-off reports in the three formats
//! (`scd_engine::handoff`), read from stdin.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use scd_engine::handoff::{self, confidence_value, ConfidenceMap, Format, ParseRate, Parsed, Report};
use serde::Deserialize;

/// `scd handoff` subcommands.
#[derive(Debug, Subcommand)]
pub enum HandoffCommand {
    /// Parse a report on stdin and print JSON {"format", "parsed",
    /// "why_not", "report": {"status", "summary", "evidence", "confidence",
    /// "next", "answer_candidate", "payload"}, "answer",
    /// "current_confidence"}. A report that does not parse in the format
    /// asked for is read as freeform, and "why_not" says why.
    Parse(ParseArgs),
    /// Write the JSON `scd handoff parse` prints (stdin; only "report" is
    /// needed, "answer" is optional, unknown keys are errors) as a report.
    Render(RenderArgs),
}

/// A report format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// Free text.
    Freeform,
    /// Tagged sections [STATUS], [SUMMARY], [EVIDENCE_OR_TESTS], [CONFIDENCE], [NEXT], [ANSWER_CANDIDATE].
    #[value(name = "semi_structured")]
    SemiStructured,
    /// JSON_REPORT: {status, summary, confidence, next, payload} END_JSON_REPORT.
    #[value(name = "structured_soft")]
    StructuredSoft,
}

impl From<ReportFormat> for Format {
    fn from(f: ReportFormat) -> Self {
        match f {
            ReportFormat::Freeform => Format::Freeform,
            ReportFormat::SemiStructured => Format::SemiStructured,
            ReportFormat::StructuredSoft => Format::StructuredSoft,
        }
    }
}

/// The format to read a report as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ParseFormat {
    /// Structured if a line starts with JSON_REPORT:, semi-structured if a
    /// line starts with a standard tag, freeform otherwise.
    Auto,
    /// Free text (always parses).
    Freeform,
    /// Tagged sections.
    #[value(name = "semi_structured")]
    SemiStructured,
    /// JSON_REPORT: … END_JSON_REPORT.
    #[value(name = "structured_soft")]
    StructuredSoft,
}

impl ParseFormat {
    fn format(self) -> Option<Format> {
        match self {
            ParseFormat::Auto => None,
            ParseFormat::Freeform => Some(Format::Freeform),
            ParseFormat::SemiStructured => Some(Format::SemiStructured),
            ParseFormat::StructuredSoft => Some(Format::StructuredSoft),
        }
    }
}

/// The current_confidence each reported confidence level stands for.
#[derive(Debug, Clone, Args)]
pub struct ConfidenceArgs {
    /// current_confidence for a report of low confidence, in [0, 1].
    #[arg(long, env = "SCD_CONFIDENCE_LOW", default_value_t = ConfidenceMap::default().low)]
    confidence_low: f32,
    /// current_confidence for a report of medium confidence, in [0, 1].
    #[arg(long, env = "SCD_CONFIDENCE_MEDIUM", default_value_t = ConfidenceMap::default().medium)]
    confidence_medium: f32,
    /// current_confidence for a report of high confidence, in [0, 1].
    #[arg(long, env = "SCD_CONFIDENCE_HIGH", default_value_t = ConfidenceMap::default().high)]
    confidence_high: f32,
}

impl ConfidenceArgs {
    /// The checked map; the error names the flag.
    pub fn map(&self) -> anyhow::Result<ConfidenceMap> {
        let map =
            ConfidenceMap { low: self.confidence_low, medium: self.confidence_medium, high: self.confidence_high };
        for (flag, v) in [("low", map.low), ("medium", map.medium), ("high", map.high)] {
            anyhow::ensure!((0.0..=1.0).contains(&v), "--confidence-{flag}: must be in [0, 1], got {v}");
        }
        Ok(map)
    }
}

/// Arguments of `scd handoff parse`.
#[derive(Debug, Args)]
pub struct ParseArgs {
    /// The format to read the report as.
    #[arg(long, value_enum, default_value = "auto")]
    format: ParseFormat,
    /// JSONL of {"text", "format"} objects ("format" optional, default
    /// --format) instead of stdin: one parse result per line, then a last
    /// line {"reports", "parsed", "parse_rate", "rendered",
    /// "render_parse_rate", "why_not": {reason: count}}; the render parse
    /// rate counts each report written back in its format and parsed again.
    #[arg(long)]
    batch: Option<PathBuf>,
    #[command(flatten)]
    confidence: ConfidenceArgs,
}

/// Arguments of `scd handoff render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The format to write.
    #[arg(long, value_enum)]
    format: ReportFormat,
}

/// What `scd handoff render` reads: the output of `scd handoff parse`.
/// Only `report` is needed; the keys parse adds are accepted and ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenderInput {
    report: Report,
    #[serde(default)]
    answer: Option<String>,
    #[serde(default, rename = "format")]
    _format: Option<serde_json::Value>,
    #[serde(default, rename = "parsed")]
    _parsed: Option<serde_json::Value>,
    #[serde(default, rename = "why_not")]
    _why_not: Option<serde_json::Value>,
    #[serde(default, rename = "current_confidence")]
    _current_confidence: Option<serde_json::Value>,
}

/// One line of `--batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchLine {
    text: String,
    #[serde(default)]
    format: Option<String>,
}

/// `parsed` as the JSON `scd handoff parse` prints.
pub fn parsed_json(p: &Parsed, map: &ConfidenceMap) -> serde_json::Value {
    serde_json::json!({
        "format": p.format,
        "parsed": p.parsed,
        "why_not": p.why_not.as_ref().map(ToString::to_string),
        "report": p.report,
        "answer": p.answer,
        // printed as written (0.9, not the f32's 0.8999999761581421)
        "current_confidence": p.report.confidence.map(|c| confidence_value(c, map).to_string().parse::<f64>().unwrap_or_default()),
    })
}

/// Reads `render`'s input strictly: errors name the key (`report.statuz`).
pub fn read_render_input(raw: &str) -> anyhow::Result<(Report, Option<String>)> {
    let mut de = serde_json::Deserializer::from_str(raw);
    let input: RenderInput = serde_path_to_error::deserialize(&mut de).map_err(super::json_path_error)?;
    de.end().context("after the JSON object")?;
    if let Some(a) = &input.answer {
        anyhow::ensure!(!a.contains('\n'), "answer: must be one line (the scorer reads the line after Answer:)");
    }
    Ok((input.report, input.answer))
}

/// Runs `scd handoff`.
pub fn run(cmd: HandoffCommand) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match cmd {
        HandoffCommand::Parse(args) => {
            let map = args.confidence.map()?;
            let Some(batch) = &args.batch else {
                let mut text = String::new();
                std::io::stdin().read_to_string(&mut text).context("stdin: a report as UTF-8 text")?;
                let p = match args.format.format() {
                    Some(f) => handoff::parse(&text, f),
                    None => handoff::parse_auto(&text),
                };
                writeln!(stdout, "{}", parsed_json(&p, &map))?;
                return Ok(());
            };
            let f = std::fs::File::open(batch).with_context(|| format!("--batch {}", batch.display()))?;
            let mut rate = ParseRate::default();
            let mut why_not: BTreeMap<&'static str, usize> = BTreeMap::new();
            for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
                let line = line.with_context(|| format!("--batch line {}", n + 1))?;
                if line.trim().is_empty() {
                    continue;
                }
                let entry: BatchLine =
                    serde_json::from_str(&line).with_context(|| format!("--batch line {}", n + 1))?;
                let format = match entry.format.as_deref() {
                    None => args.format.format(),
                    Some("auto") => None,
                    Some(f) => Some(f.parse::<Format>().with_context(|| format!("--batch line {}", n + 1))?),
                };
                let p = rate.add(&entry.text, format);
                if let Some(w) = &p.why_not {
                    *why_not.entry(w.kind()).or_default() += 1;
                }
                let mut out = parsed_json(&p, &map);
                out["line"] = (n + 1).into();
                writeln!(stdout, "{out}")?;
            }
            let summary = serde_json::json!({
                "reports": rate.reports,
                "parsed": rate.parsed,
                "parse_rate": rate.parse_rate(),
                "rendered": rate.rendered,
                "render_parse_rate": rate.render_parse_rate(),
                "why_not": why_not,
            });
            writeln!(stdout, "{summary}")?;
        }
        HandoffCommand::Render(args) => {
            let mut raw = String::new();
            std::io::stdin().read_to_string(&mut raw).context("stdin")?;
            let (report, answer) = read_render_input(&raw)?;
            write!(stdout, "{}", handoff::render(&report, args.format.into(), answer.as_deref()))?;
        }
    }
    stdout.flush()?;
    Ok(())
}
