//! What a simulation found: per strategy ([`StrategyReport`]), the whole
//! run ([`Report`]) and the ablation, with the markdown table.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::config::SimConfig;

/// One strategy's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyReport {
    /// `sequential`, `round-robin`, `broadcast` or `atp`.
    pub strategy: String,
    /// Tasks run.
    pub tasks: usize,
    /// Tasks that finished.
    pub completed: usize,
    /// Tasks lost to failures.
    pub lost: usize,
    /// Mean dollars per task (agents + tokens), over all tasks.
    pub cost_per_task: f64,
    /// Of which tokens.
    pub token_cost_per_task: f64,
    /// Mean end-to-end latency of completed tasks (s).
    pub latency_s: f64,
    /// 95th percentile of it (s).
    pub latency_p95_s: f64,
    /// Mean quality of completed tasks.
    pub quality: f64,
    /// Mean quality with lost tasks scored 0.
    pub quality_lost_as_zero: f64,
    /// Calls that failed because their agent went down.
    pub failures: usize,
    /// Mean time from a failure to the task being back where it was (s);
    /// None when no failure was recovered.
    pub recovery_s: Option<f64>,
    /// Tokens transferred / tokens of the full context over the same hops.
    pub context_efficiency: f64,
    /// Tokens transferred.
    pub tokens_sent: u64,
    /// Tokens of the full context over the same hops.
    pub tokens_full: u64,
    /// Share of calls that went to over-advertising agents.
    pub over_advertiser_share: f64,
    /// ATP: routing-table recomputations (every 60 s and on each §7.3
    /// trigger); 0 for the baselines.
    pub reprices: usize,
}

/// What `scd-dev atp bench` prints and saves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The configuration.
    pub config: SimConfig,
    /// Measured context samples drawn from.
    pub samples: usize,
    /// Their mean sent/full.
    pub sample_mean_ratio: f64,
    /// Where ATP's trust came from.
    pub trust: String,
    /// Over-advertising agents in the network.
    pub over_advertisers: usize,
    /// One entry per strategy: sequential, round-robin, broadcast, atp.
    pub strategies: Vec<StrategyReport>,
    /// The §10.3 ablation: full ATP, then ATP without each layer, then two
    /// diagnostics that split trust from repricing (see [`Report::ablation_table`]).
    pub ablation: Vec<AblationRow>,
}

/// One row of the ablation: the run, and the paper's figures for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AblationRow {
    /// The run (its `strategy` names the configuration).
    pub report: StrategyReport,
    /// The paper's §10.3 cost per task, where it has the row.
    pub paper_cost: Option<f64>,
    /// The paper's §10.3 quality (lost tasks as 0 in its fault-tolerance row).
    pub paper_quality: Option<f64>,
}

impl Report {
    /// A markdown table, one column per strategy (the paper's §10.2 layout).
    pub fn table(&self) -> String {
        let mut s = String::from("| metric |");
        for r in &self.strategies {
            let _ = write!(s, " {} |", r.strategy);
        }
        s += "\n|---|";
        s += &"---:|".repeat(self.strategies.len());
        s += "\n";
        let row = |s: &mut String, name: &str, f: &dyn Fn(&StrategyReport) -> String| {
            let _ = write!(s, "| {name} |");
            for r in &self.strategies {
                let _ = write!(s, " {} |", f(r));
            }
            s.push('\n');
        };
        row(&mut s, "cost per task ($)", &|r| format!("{:.4}", r.cost_per_task));
        row(&mut s, "of which tokens ($)", &|r| format!("{:.4}", r.token_cost_per_task));
        row(&mut s, "latency mean (s)", &|r| format!("{:.2}", r.latency_s));
        row(&mut s, "latency p95 (s)", &|r| format!("{:.2}", r.latency_p95_s));
        row(&mut s, "quality (completed)", &|r| format!("{:.3}", r.quality));
        row(&mut s, "quality (lost = 0)", &|r| format!("{:.3}", r.quality_lost_as_zero));
        row(&mut s, "failed calls", &|r| r.failures.to_string());
        row(&mut s, "fault recovery (s)", &|r| r.recovery_s.map_or("∞ (fails)".into(), |v| format!("{v:.1}")));
        row(&mut s, "tasks lost", &|r| format!("{} / {}", r.lost, r.tasks));
        row(&mut s, "context efficiency", &|r| format!("{:.2}x", r.context_efficiency));
        row(&mut s, "calls to over-advertisers", &|r| format!("{:.1} %", 100.0 * r.over_advertiser_share));
        row(&mut s, "routing recomputations", &|r| r.reprices.to_string());
        s
    }

    /// The ablation as a markdown table beside the paper's §10.3 figures.
    /// Quality counts lost tasks as 0 (as the paper does for its
    /// fault-tolerance row); the share of calls to over-advertisers shows
    /// which layer keeps ATP away from them.
    pub fn ablation_table(&self) -> String {
        let mut s = String::from(
            "| configuration | cost per task ($) | quality (lost = 0) | tasks lost | calls to over-advertisers | context efficiency | paper: cost / quality |\n|---|---:|---:|---:|---:|---:|---|\n",
        );
        for row in &self.ablation {
            let r = &row.report;
            let paper = match (row.paper_cost, row.paper_quality) {
                (Some(c), Some(q)) => format!("{c:.3} / {q:.3}"),
                _ => "–".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {:.4} | {:.3} | {} / {} | {:.1} % | {:.2}x | {paper} |",
                r.strategy,
                r.cost_per_task,
                r.quality_lost_as_zero,
                r.lost,
                r.tasks,
                100.0 * r.over_advertiser_share,
                r.context_efficiency
            );
        }
        s
    }
}
