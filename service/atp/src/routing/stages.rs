//! A chosen route as executable stages ([`plan`]).

use super::constants::CASCADE_MIN_CONFIDENCE;
use super::model::{Pattern, RouteChoice};

/// What an agent contributes in a sequential stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Answers the task alone.
    Answer,
    /// Writes a draft for the next stage.
    Draft,
    /// Refines the previous stage's draft into the answer.
    Refine,
    /// One step of a pipeline: its output is the next stage's input.
    Step,
}

/// How the results of a parallel stage become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// Keep the best result (parallel-merge).
    Best,
    /// The majority answer wins (ensemble).
    MajorityVote,
}

/// One executable step of a [`Plan`].
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// Send the task (and the previous stage's output) to one agent.
    Call {
        /// The agent.
        agent: String,
        /// What it contributes.
        role: Role,
    },
    /// Send the same input to all agents at once, then merge.
    Parallel {
        /// The agents.
        agents: Vec<String>,
        /// How results are combined.
        merge: Merge,
    },
    /// Ask `agent`; stop if its confidence reaches `min_confidence`, else go
    /// on to the next stage.
    Escalate {
        /// The agent.
        agent: String,
        /// Below this the task moves on.
        min_confidence: f64,
    },
}

/// An executable route: stages run in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The route's pattern.
    pub pattern: Pattern,
    /// The stages.
    pub stages: Vec<Stage>,
}

/// The stages that execute a route: sequential calls (single, draft-refine,
/// pipeline), one parallel stage with a merge (parallel-merge) or a vote
/// (ensemble), or escalate-on-low-confidence steps ending in a call (cascade).
pub fn plan(r: &RouteChoice) -> Plan {
    let call = |agent: &String, role| Stage::Call { agent: agent.clone(), role };
    let n = r.agents.len();
    let stages = match r.pattern {
        Pattern::Single => r.agents.iter().take(1).map(|a| call(a, Role::Answer)).collect(),
        Pattern::DraftRefine => r
            .agents
            .iter()
            .enumerate()
            .map(|(i, a)| call(a, if i + 1 == n { Role::Refine } else { Role::Draft }))
            .collect(),
        Pattern::Pipeline => r.agents.iter().map(|a| call(a, Role::Step)).collect(),
        Pattern::ParallelMerge => vec![Stage::Parallel { agents: r.agents.clone(), merge: Merge::Best }],
        Pattern::Ensemble => vec![Stage::Parallel { agents: r.agents.clone(), merge: Merge::MajorityVote }],
        Pattern::Cascade => r
            .agents
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if i + 1 == n {
                    call(a, Role::Answer)
                } else {
                    Stage::Escalate { agent: a.clone(), min_confidence: CASCADE_MIN_CONFIDENCE }
                }
            })
            .collect(),
    };
    Plan { pattern: r.pattern, stages }
}
