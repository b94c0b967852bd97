//! An AgentNet-Bench-style simulation (paper §10): ATP against three
//! baselines on a seeded network of agents, behind `scd-dev atp bench`.
//!
//! **The world.** `agents` agents (default 50). Agent *i*'s main task type is
//! *i* mod 4; it also serves each other type with probability 0.35. Three
//! tiers: cheap (45 %: true quality U[0.82, 0.92), $0.002–0.008 a call,
//! 400–1,500 ms), premium (35 %: U[0.92, 0.99), $0.015–0.040,
//! 1,500–4,000 ms) and over-advertisers (20 %: true quality U[0.45, 0.65) but
//! advertising U[0.88, 0.97), $0.005–0.020, 600–2,000 ms). Honest agents
//! advertise their true quality ± 0.02. Every agent fails now and then:
//! outages start as a Poisson process (mean gap `mtbf_s`) and last
//! U[20, 90) s; a call in flight when its agent goes down is lost.
//!
//! **The tasks.** `tasks` tasks arrive every `arrival_ms`, spread evenly over
//! the paper's four pipelines of four stages, each stage mapped to a task
//! type ([`PIPELINES`]). A task starts with a context of `full_tokens` drawn
//! from the measured samples; each stage adds 300–800 output tokens. The
//! full context at hop *i* is the task context plus every earlier output.
//!
//! **A call** takes the agent's latency × U[0.8, 1.2) + prefill
//! (`prefill_ms_per_1k` per 1,000 tokens received) + a network hop, costs
//! the agent's price plus `dollars_per_1k_tokens` for the tokens it receives,
//! and yields the agent's true quality + N(0, 0.02), clamped to [0, 1]. A
//! task's quality is the product of its stage qualities (Definition 4).
//!
//! **Strategies.**
//! - *sequential*: the first capable agent (lowest index) for every stage,
//!   the full context forwarded each hop; a failure loses the task.
//! - *round-robin*: capable agents in turn, full context; a failed call is
//!   noticed after the request timeout (`timeout_ms`) and the stage is redone
//!   from scratch on the next agent (at most 3 retries).
//! - *broadcast* (AutoGen-style group chat): a uniformly chosen capable agent
//!   per stage; every message goes to every participant, so each stage sees
//!   the whole conversation and earlier speakers keep receiving; failures as
//!   round-robin.
//! - *atp*: per stage, [`scd_atp::routing::route`] over the capable agents that
//!   the [`scd_atp::fault::HealthMonitor`] (1 s heartbeats, T_fail 3 s) and the
//!   [`scd_atp::fault::CircuitBreakers`] allow, with quality, latency and cost
//!   from the [`scd_atp::routing::Repricer`] (EWMA of interaction proofs) and
//!   trust from a [`scd_atp::trust::TrustBook`] owned by the planner (Definition
//!   3 per task type, cold-start prior 0.5 below 3 proofs), fed the planner's
//!   interaction proofs and recomputed when the routing table is (every 60 s
//!   and on a repricing trigger). The proofs are not signed here (the book
//!   is filled through its crate-internal checked path; the real agent
//!   verifies both signatures). The
//!   context is SCD-compressed: each hop sends full × (sent/full) of a sample
//!   drawn from the measured ones, plus 20 ms for SCD and 100 ms for the
//!   handshake. A failure is detected by heartbeat, the task fails over to a
//!   newly routed agent with the last checkpoint (every 1 s of work), and
//!   only work since that checkpoint is redone. With no agent available the
//!   task waits for one (back-pressure), it is never dropped.
//!
//! **The ablation** (§10.3) runs ATP again on the same world, from the same
//! seed, with one layer taken away ([`Layers`]): without economic
//! routing (always the highest quality the planner knows), without SCD (the
//! full context), without trust scoring (a random available capable agent),
//! without fault tolerance (no heartbeats, breakers or checkpoints; a failed
//! call loses the task, scored 0). Two diagnostic rows split the layers that
//! keep ATP away from over-advertisers: routing on advertised figures with
//! trust on (no repricer), and the repricer with every agent at the
//! cold-start trust (no trust book: trust taken away, routing kept).
//!
//! **Metrics**, per strategy: cost per task (agents + tokens), end-to-end
//! latency, quality of completed tasks (and with lost tasks as 0), fault
//! recovery time (failure → the task is back at the progress it had; none if
//! nothing recovers), tasks lost, context efficiency (tokens transferred /
//! tokens of the full context over the same hops), and the share of calls
//! that went to over-advertisers.
//!
//! Not modelled: queueing and load (agents serve calls independently), the
//! quality effect of context compression (the SCD eval measures that), poison
//! tasks. Context efficiency is never a constant: [`run`] refuses an empty
//! sample set.

mod config;
mod ctx;
mod report;
mod run;
mod strategy;
mod svg;
#[cfg(test)]
mod tests;
mod world;

pub use config::{ContextSample, Qos, SimConfig, PIPELINES};
pub use report::{AblationRow, Report, StrategyReport};
pub use run::run;
pub use svg::{svg, write_svg};
