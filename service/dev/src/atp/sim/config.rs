//! What a simulation is asked: its settings ([`SimConfig`]), the measured
//! SCD transfers it draws from ([`ContextSample`]), the pipelines and the
//! fixed costs of the model.

use serde::{Deserialize, Serialize};

use scd_atp::pb::TaskType;

/// One measured SCD transfer: the full context and what SCD sent of it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ContextSample {
    /// Tokens of the full context.
    pub full_tokens: u64,
    /// Tokens SCD sent.
    pub sent_tokens: u64,
}

/// The simulation's knobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Agents in the network.
    pub agents: usize,
    /// Tasks to run.
    pub tasks: usize,
    /// Seed of every random draw.
    pub seed: u64,
    /// Time between task arrivals.
    pub arrival_ms: u64,
    /// Mean time between an agent's outages.
    pub mtbf_s: f64,
    /// Price of tokens sent to an agent.
    pub dollars_per_1k_tokens: f64,
    /// Latency of reading 1,000 tokens of context.
    pub prefill_ms_per_1k: f64,
    /// One network hop.
    pub hop_ms: u64,
    /// Baselines notice a dead agent after this long.
    pub timeout_ms: u64,
    /// ATP heartbeat interval (T_fail = 3 ×).
    pub heartbeat_ms: u64,
    /// ATP checkpoint interval (of work).
    pub checkpoint_ms: u64,
    /// ATP per-stage QoS.
    pub qos: Qos,
}

/// ATP's per-stage constraints and objective weights (serde form of
/// [`Constraints`] and [`RoutingParams`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Qos {
    /// q_min.
    pub min_quality: f64,
    /// l_max.
    pub max_latency_ms: u64,
    /// c_max.
    pub max_cost: f64,
    /// Trust cut.
    pub min_trust: f64,
    /// β1.
    pub beta1: f64,
    /// β2.
    pub beta2: f64,
}

impl Default for SimConfig {
    /// 50 agents, 10,000 tasks (one every 100 ms), an outage per agent every
    /// 10 min on average, $0.002 per 1k tokens, 0.1 ms per token of prefill,
    /// 50 ms hops, 10 s timeouts, 1 s heartbeats, 1 s checkpoints; ATP asks
    /// each stage for quality ≥ 0.8 within 8 s and $0.10 from agents with
    /// trust ≥ 0.5 (the cold-start prior), β1 = 0.2 $/quality, β2 = 1e-6 $/ms.
    fn default() -> SimConfig {
        SimConfig {
            agents: 50,
            tasks: 10_000,
            seed: 7,
            arrival_ms: 100,
            mtbf_s: 600.0,
            dollars_per_1k_tokens: 0.002,
            prefill_ms_per_1k: 100.0,
            hop_ms: 50,
            timeout_ms: 10_000,
            heartbeat_ms: 1_000,
            checkpoint_ms: 1_000,
            qos: Qos {
                min_quality: 0.8,
                max_latency_ms: 8_000,
                max_cost: 0.10,
                min_trust: 0.5,
                beta1: 0.2,
                beta2: 1e-6,
            },
        }
    }
}

/// The four AgentNet-Bench pipelines (§10.1) with each stage's task type.
pub const PIPELINES: [(&str, [(&str, TaskType); 4]); 4] = [
    (
        "code generation",
        [
            ("planning", TaskType::Analysis),
            ("coding", TaskType::CodeGeneration),
            ("review", TaskType::Analysis),
            ("testing", TaskType::CodeGeneration),
        ],
    ),
    (
        "research synthesis",
        [
            ("search", TaskType::DataProcessing),
            ("extraction", TaskType::DataProcessing),
            ("analysis", TaskType::Analysis),
            ("writing", TaskType::CreativeWriting),
        ],
    ),
    (
        "customer service escalation",
        [
            ("triage", TaskType::DataProcessing),
            ("specialist", TaskType::Analysis),
            ("resolution", TaskType::CreativeWriting),
            ("qa", TaskType::Analysis),
        ],
    ),
    (
        "data pipeline",
        [
            ("ingestion", TaskType::DataProcessing),
            ("cleaning", TaskType::DataProcessing),
            ("analysis", TaskType::Analysis),
            ("visualization", TaskType::CodeGeneration),
        ],
    ),
];

pub(super) const TYPES: [TaskType; 4] =
    [TaskType::CodeGeneration, TaskType::Analysis, TaskType::CreativeWriting, TaskType::DataProcessing];

/// Retries of a baseline after a failed call.
pub(super) const BASELINE_RETRIES: usize = 3;
/// ATP gives up on a stage after this many failovers (never reached in
/// practice: it waits for an agent rather than drop the task).
pub(super) const ATP_ATTEMPTS: usize = 64;
/// Latency of one SCD compression (warm, measured by `scd_speed`).
pub(super) const SCD_MS: u64 = 20;
/// Probe → offer → contract.
pub(super) const HANDSHAKE_MS: u64 = 100;
/// The planner's DID: owner (trust anchor) of the simulated trust book.
pub(super) const PLANNER: &str = "did:key:zSimPlanner";
/// Simulated time 0 in Unix seconds (proof timestamps).
pub(super) const EPOCH_S: i64 = 1_750_000_000;
