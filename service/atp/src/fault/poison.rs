//! Poison tasks (§8.3): a task that fails on several distinct agents
//! within a window goes back to its originator.

use std::collections::{BTreeSet, HashMap};

/// Poison detection settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoisonParams {
    /// Distinct agents a task must fail on (default 3).
    pub distinct_agents: usize,
    /// Within this window (T_window, default 60 s).
    pub window_ms: u64,
}

impl Default for PoisonParams {
    /// ≥ 3 distinct agents within 60 s (§8.4).
    fn default() -> PoisonParams {
        PoisonParams { distinct_agents: 3, window_ms: 60_000 }
    }
}

/// A poison task and why (for the originator).
#[derive(Debug, Clone, PartialEq)]
pub struct Poison {
    /// The task.
    pub task_id: String,
    /// The distinct agents it failed on within the window, sorted.
    pub agents: Vec<String>,
    /// Each failure in the window, oldest first: (agent, error).
    pub errors: Vec<(String, String)>,
    /// The window.
    pub window_ms: u64,
}

impl std::fmt::Display for Poison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "poison task {}: failed on {} distinct agents within {} s; not retried",
            self.task_id,
            self.agents.len(),
            self.window_ms / 1000
        )?;
        for (agent, error) in &self.errors {
            write!(f, "; {agent}: {error}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Failure {
    agent: String,
    error: String,
    at_ms: u64,
}

/// Poison task detection (§8.4).
#[derive(Debug, Clone, Default)]
pub struct PoisonDetector {
    params: PoisonParams,
    failures: HashMap<String, Vec<Failure>>,
    poisoned: HashMap<String, Poison>,
}

impl PoisonDetector {
    /// A detector that has seen no failures.
    pub fn new(params: PoisonParams) -> PoisonDetector {
        PoisonDetector { params, ..PoisonDetector::default() }
    }

    /// Records that `task_id` failed on `did` with `error`. Returns the
    /// diagnosis once the task has failed on `distinct_agents` distinct
    /// agents within the window (and on every later call: a poison task stays
    /// poison). The same agent failing again does not count twice; failures
    /// older than the window are forgotten.
    pub fn record_failure(&mut self, task_id: &str, did: &str, error: &str, now_ms: u64) -> Option<Poison> {
        if let Some(p) = self.poisoned.get(task_id) {
            return Some(p.clone());
        }
        let window = self.params.window_ms;
        let list = self.failures.entry(task_id.to_string()).or_default();
        list.retain(|f| now_ms.saturating_sub(f.at_ms) < window);
        list.push(Failure { agent: did.to_string(), error: error.to_string(), at_ms: now_ms });
        let agents: BTreeSet<&str> = list.iter().map(|f| f.agent.as_str()).collect();
        if agents.len() < self.params.distinct_agents.max(1) {
            return None;
        }
        let poison = Poison {
            task_id: task_id.to_string(),
            agents: agents.into_iter().map(str::to_string).collect(),
            errors: list.iter().map(|f| (f.agent.clone(), f.error.clone())).collect(),
            window_ms: window,
        };
        self.failures.remove(task_id);
        tracing::warn!(task = task_id, agents = ?poison.agents, "poison task");
        self.poisoned.insert(task_id.to_string(), poison.clone());
        Some(poison)
    }

    /// The diagnostics of a task marked poison.
    pub fn poison(&self, task_id: &str) -> Option<&Poison> {
        self.poisoned.get(task_id)
    }

    /// Whether `task_id` is poison.
    pub fn is_poison(&self, task_id: &str) -> bool {
        self.poisoned.contains_key(task_id)
    }

    /// Forgets a task (it completed, or its originator gave up).
    pub fn clear(&mut self, task_id: &str) {
        self.failures.remove(task_id);
        self.poisoned.remove(task_id);
    }

    /// Drops failure records older than the window for every task.
    pub fn prune(&mut self, now_ms: u64) {
        let window = self.params.window_ms;
        self.failures.retain(|_, list| {
            list.retain(|f| now_ms.saturating_sub(f.at_ms) < window);
            !list.is_empty()
        });
    }
}
