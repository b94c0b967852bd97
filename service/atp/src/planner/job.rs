//! A task to delegate ([`Job`]) and how it ended ([`Outcome`], with the
//! stages of a composite route).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::context::{ContextFile, Task};
use crate::pb;
use crate::routing::Pattern;
use crate::work::{WorkOrder, WorkReport};

/// A task to delegate.
#[derive(Debug, Clone)]
pub struct Job {
    /// Unique id.
    pub task_id: String,
    /// What kind of work.
    pub task_type: pb::TaskType,
    /// The task as SCD sees it.
    pub task: Task,
    /// The work order (payload).
    pub order: WorkOrder,
    /// The context to draw from.
    pub context: ContextFile,
    /// Constraints.
    pub qos: pb::QoSConstraints,
}

/// How a delegated task ended (agents by DID).
#[allow(missing_docs)]
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Completed by `agent` after `failovers` failovers. Along a composite
    /// route `agent` and `report` are the answering stage's (the last to run,
    /// the best of a merge, the majority's), `quality` its measured quality,
    /// `cost` the stages' sum, `latency_ms` the route's, and `stages` each
    /// stage as it ran (empty for a single agent).
    Completed {
        agent: String,
        report: WorkReport,
        failovers: u32,
        latency_ms: u64,
        quality: f64,
        cost: f64,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        stages: Vec<StageRun>,
    },
    /// Poison: not retried.
    Poison { diagnostics: String, failovers: u32 },
    /// No agent could finish it.
    Lost { why: String, failovers: u32 },
}

/// One stage of a composite route, as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct StageRun {
    /// The stage's task id (`<task>.<stage>.<agent>`).
    pub task_id: String,
    /// Who ran it (DID).
    pub agent: String,
    /// Its self-reported quality.
    pub quality: f64,
    /// Its confidence once it had the context it asked for.
    pub confidence: f64,
    /// Submit to final result.
    pub latency_ms: u64,
    /// What it cost.
    pub cost: f64,
    /// Its simulated answer: a digest of the evidence (chunk ids) it used.
    pub answer: String,
    /// Its report.
    #[serde(skip)]
    pub report: WorkReport,
}

/// A composite route as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct PatternRun {
    /// The pattern's name.
    #[serde(serialize_with = "pattern_name")]
    pub pattern: Pattern,
    /// The route's agents (DIDs), in plan order.
    pub route: Vec<String>,
    /// The stages that ran (a cascade stops early).
    pub stages: Vec<StageRun>,
    /// The merged answer (best, majority, or the last stage's).
    pub answer: Option<String>,
}

fn pattern_name<S: serde::Serializer>(p: &Pattern, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

/// A simulated answer: agents that used the same evidence answer alike.
pub(super) fn answer_of(report: &WorkReport) -> String {
    use sha2::Digest;
    let mut ids = report.chunks.clone();
    ids.sort();
    let digest = sha2::Sha256::digest(ids.join("\n").as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The answer more than half the stages gave, if any.
pub(super) fn majority_answer(results: &[StageRun]) -> Option<String> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for r in results {
        *counts.entry(r.answer.as_str()).or_default() += 1;
    }
    counts.into_iter().find(|(_, n)| 2 * n > results.len()).map(|(a, _)| a.to_string())
}

impl Outcome {
    pub(super) fn with_failovers(self, n: u32) -> Outcome {
        match self {
            Outcome::Completed { agent, report, latency_ms, quality, cost, stages, .. } => {
                Outcome::Completed { agent, report, failovers: n, latency_ms, quality, cost, stages }
            }
            other => other,
        }
    }

    /// A composite route that ran to its end. The answering stage is the
    /// last to run along a sequence or a cascade, the best-rated of a
    /// parallel merge, and an ensemble's first voter for the majority answer
    /// (its best-rated when no majority formed).
    pub(super) fn of_route(run: PatternRun, failovers: u32, took: Duration) -> Option<Outcome> {
        let best = run.stages.iter().enumerate().max_by(|a, b| a.1.quality.total_cmp(&b.1.quality)).map(|x| x.0);
        let answering = match run.pattern {
            Pattern::ParallelMerge => best,
            Pattern::Ensemble => {
                run.answer.as_ref().and_then(|a| run.stages.iter().position(|s| &s.answer == a)).or(best)
            }
            _ => run.stages.len().checked_sub(1),
        }?;
        let s = &run.stages[answering];
        Some(Outcome::Completed {
            agent: s.agent.clone(),
            report: s.report.clone(),
            failovers,
            latency_ms: took.as_millis() as u64,
            quality: s.quality,
            cost: run.stages.iter().map(|s| s.cost).sum(),
            stages: run.stages,
        })
    }
}
