//! An AgentNet-Bench-style simulation (paper §10): ATP against three
//! baselines on a seeded network of agents, behind `scd atp bench`.
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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use scd_atp::fault::{BreakerParams, CircuitBreakers, HealthMonitor, MISSED_HEARTBEATS};
use scd_atp::pb::{self, AgentStatus, TaskType};
use scd_atp::routing::{self, Candidate, Constraints, Observation, Repricer, RepricerParams, RoutingParams};
use scd_atp::trust::{TrustBook, TrustParams};
use scd_atp::{Error, Result};

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

const TYPES: [TaskType; 4] =
    [TaskType::CodeGeneration, TaskType::Analysis, TaskType::CreativeWriting, TaskType::DataProcessing];

/// Retries of a baseline after a failed call.
const BASELINE_RETRIES: usize = 3;
/// ATP gives up on a stage after this many failovers (never reached in
/// practice: it waits for an agent rather than drop the task).
const ATP_ATTEMPTS: usize = 64;
/// Latency of one SCD compression (warm, measured by `scd_speed`).
const SCD_MS: u64 = 20;
/// Probe → offer → contract.
const HANDSHAKE_MS: u64 = 100;
/// The planner's DID: owner (trust anchor) of the simulated trust book.
const PLANNER: &str = "did:key:zSimPlanner";
/// Simulated time 0 in Unix seconds (proof timestamps).
const EPOCH_S: i64 = 1_750_000_000;

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

/// What `scd atp bench` prints and saves.
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

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tier {
    Cheap,
    Premium,
    OverAdvertiser,
}

#[derive(Debug, Clone)]
struct Skill {
    true_quality: f64,
    advertised: f64,
}

#[derive(Debug, Clone)]
struct Agent {
    did: String,
    tier: Tier,
    skills: BTreeMap<i32, Skill>,
    latency_ms: u64,
    cost: f64,
    /// Sorted, disjoint [start, end) outages.
    outages: Vec<(u64, u64)>,
}

impl Agent {
    fn serves(&self, t: TaskType) -> bool {
        self.skills.contains_key(&(t as i32))
    }
    fn down_at(&self, t: u64) -> Option<(u64, u64)> {
        self.outages.iter().copied().find(|&(s, e)| s <= t && t < e)
    }
    /// The first outage starting in (t0, t1).
    fn dies_in(&self, t0: u64, t1: u64) -> Option<u64> {
        self.outages.iter().map(|o| o.0).find(|&s| s > t0 && s < t1)
    }
    /// The time of the last heartbeat sent at or before `t` (beats at
    /// multiples of the interval while up).
    fn last_beat(&self, t: u64, interval: u64) -> u64 {
        let at = |x: u64| x / interval * interval;
        match self.down_at(t) {
            Some((s, _)) => at(s.saturating_sub(1)),
            None => at(t),
        }
    }
    fn back_at(&self, t: u64) -> u64 {
        self.down_at(t).map_or(t, |o| o.1)
    }
}

#[derive(Debug, Clone)]
struct TaskSpec {
    pipeline: usize,
    arrival_ms: u64,
    context_tokens: u64,
    outputs: [u64; 4],
}

struct World {
    agents: Vec<Agent>,
    tasks: Vec<TaskSpec>,
    capable: BTreeMap<i32, Vec<usize>>,
}

fn normal(rng: &mut StdRng) -> f64 {
    let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn build_world(cfg: &SimConfig, samples: &[ContextSample], rng: &mut StdRng) -> World {
    let horizon = cfg.tasks as u64 * cfg.arrival_ms + 600_000;
    let agents: Vec<Agent> = (0..cfg.agents)
        .map(|i| {
            let r: f64 = rng.random();
            let tier = if r < 0.45 {
                Tier::Cheap
            } else if r < 0.80 {
                Tier::Premium
            } else {
                Tier::OverAdvertiser
            };
            let (latency_ms, cost) = match tier {
                Tier::Cheap => (rng.random_range(400..1_500), rng.random_range(0.002..0.008)),
                Tier::Premium => (rng.random_range(1_500..4_000), rng.random_range(0.015..0.040)),
                Tier::OverAdvertiser => (rng.random_range(600..2_000), rng.random_range(0.005..0.020)),
            };
            let mut skills = BTreeMap::new();
            for (ti, t) in TYPES.iter().enumerate() {
                if ti != i % 4 && rng.random::<f64>() >= 0.35 {
                    continue;
                }
                let true_quality: f64 = match tier {
                    Tier::Cheap => rng.random_range(0.82..0.92),
                    Tier::Premium => rng.random_range(0.92..0.99),
                    Tier::OverAdvertiser => rng.random_range(0.45..0.65),
                };
                let advertised = match tier {
                    Tier::OverAdvertiser => rng.random_range(0.88..0.97),
                    _ => (true_quality + 0.02 * normal(rng)).clamp(0.0, 0.999),
                };
                skills.insert(*t as i32, Skill { true_quality, advertised });
            }
            let mut outages = Vec::new();
            let mut t = 0.0;
            loop {
                t += -(1.0 - rng.random::<f64>()).ln() * cfg.mtbf_s * 1_000.0;
                if t as u64 >= horizon {
                    break;
                }
                let len = rng.random_range(20_000..90_000);
                outages.push((t as u64, t as u64 + len));
                t += len as f64;
            }
            Agent { did: format!("did:key:zSimAgent{i:03}"), tier, skills, latency_ms, cost, outages }
        })
        .collect();
    let mut capable: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for t in TYPES {
        capable.insert(t as i32, (0..agents.len()).filter(|&i| agents[i].serves(t)).collect());
    }
    let tasks = (0..cfg.tasks)
        .map(|i| TaskSpec {
            pipeline: i % PIPELINES.len(),
            arrival_ms: i as u64 * cfg.arrival_ms,
            context_tokens: samples[rng.random_range(0..samples.len())].full_tokens,
            outputs: std::array::from_fn(|_| rng.random_range(300..800)),
        })
        .collect();
    World { agents, tasks, capable }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sequential,
    RoundRobin,
    Broadcast,
    Atp(Layers),
}

/// ATP with one layer taken away (the §10.3 ablation), or all on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layers {
    /// Every layer.
    Full,
    /// No economic routing: the highest quality the planner knows (after
    /// repricing) among the available agents that pass the trust cut.
    NoRouting,
    /// No SCD: the full context each hop, no compression time.
    NoScd,
    /// No trust scoring as the paper's row has it: a uniformly random
    /// available capable agent (which takes routing away too; the
    /// `PriorTrust` diagnostic keeps routing and drops only trust).
    NoTrust,
    /// No fault tolerance: no heartbeats or breakers (dead agents are
    /// routed to), no checkpoints, a failed call loses the task (scored 0).
    NoFault,
    /// Diagnostic: routing on the advertised figures (the repricer still
    /// observes and triggers recomputation, but its figures are not used),
    /// trust on.
    NoRepricer,
    /// Diagnostic: every agent at the cold-start trust (no trust book),
    /// the repricer on.
    PriorTrust,
}

/// The paper's §10.3 (cost per task, quality) of an ablation row.
type PaperFigures = Option<(f64, f64)>;

/// The ablation's rows, in order, with the paper's §10.3 cost and quality
/// where it has the row.
const ABLATION: [(Layers, &str, PaperFigures); 7] = [
    (Layers::Full, "ATP (full)", Some((0.038, 0.886))),
    (Layers::NoRouting, "ATP − economic routing", Some((0.098, 0.889))),
    (Layers::NoScd, "ATP − SCD", Some((0.071, 0.882))),
    (Layers::NoTrust, "ATP − trust scoring (random capable agent)", Some((0.041, 0.843))),
    (Layers::NoFault, "ATP − fault tolerance", Some((0.038, 0.871))),
    (Layers::NoRepricer, "ATP − repricer (trust only)", None),
    (Layers::PriorTrust, "ATP − trust book (repricer only)", None),
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Sequential => "sequential",
            Kind::RoundRobin => "round-robin",
            Kind::Broadcast => "broadcast",
            Kind::Atp(Layers::Full) => "atp",
            Kind::Atp(l) => ABLATION.iter().find(|a| a.0 == l).map_or("atp", |a| a.1),
        }
    }

    /// ATP's layers, or None for a baseline.
    fn atp(self) -> Option<Layers> {
        match self {
            Kind::Atp(l) => Some(l),
            _ => None,
        }
    }

    /// ATP with its fault-tolerance layer (heartbeats, breakers, checkpoints).
    fn fault_tolerant(self) -> bool {
        self.atp().is_some_and(|l| l != Layers::NoFault)
    }
}

#[derive(Default)]
struct Tally {
    completed: usize,
    lost: usize,
    cost: f64,
    token_cost: f64,
    latencies_ms: Vec<f64>,
    quality_sum: f64,
    failures: usize,
    recoveries_ms: Vec<f64>,
    sent: u64,
    full: u64,
    calls: usize,
    over_calls: usize,
}

struct AtpState {
    monitor: HealthMonitor,
    breakers: CircuitBreakers,
    repricer: Repricer,
    book: TrustBook,
    /// Proofs since the routing table was last recomputed.
    pending: Vec<pb::InteractionProof>,
    /// Trust per (agent, task type) as of the last recomputation.
    trust: BTreeMap<(usize, i32), f64>,
    /// A repricing trigger fired since the last recomputation.
    stale: bool,
    nonce: u64,
    reprices: usize,
}

impl AtpState {
    /// Recomputes the routing inputs (§7.3): folds the pending proofs into the
    /// trust book and rescores every agent × task type.
    fn recompute(&mut self, world: &World, now: u64) {
        for p in self.pending.drain(..) {
            // Cannot fail: the simulation builds valid proofs with fresh nonces.
            let _ = self.book.add_simulated(&p);
        }
        let now_s = EPOCH_S + (now / 1_000) as i64;
        for (&t, agents) in &world.capable {
            let tt = TaskType::try_from(t).unwrap_or(TaskType::Unspecified);
            for &a in agents {
                let score = self.book.trust(&world.agents[a].did, Some(tt), now_s).score;
                self.trust.insert((a, t), score);
            }
        }
        self.stale = false;
        self.reprices += 1;
    }
}

struct Ctx<'a> {
    cfg: &'a SimConfig,
    world: &'a World,
    ratios: Vec<f64>,
    rng: StdRng,
    /// The random choices of the ablation's random-agent row.
    pick_rng: StdRng,
    tally: Tally,
    rr: BTreeMap<i32, usize>,
    atp: AtpState,
}

enum CallOutcome {
    Done { latency_ms: u64, quality: f64 },
    Failed { at_ms: u64, detected_ms: u64, progress_ms: u64, work_ms: u64 },
}

impl Ctx<'_> {
    /// Network hop, prefill of `tokens`, and for ATP the SCD compression and
    /// the handshake.
    fn overhead_ms(&self, tokens: u64, kind: Kind) -> u64 {
        self.cfg.hop_ms
            + (tokens as f64 / 1_000.0 * self.cfg.prefill_ms_per_1k) as u64
            + match kind.atp() {
                Some(Layers::NoScd) => HANDSHAKE_MS,
                Some(_) => SCD_MS + HANDSHAKE_MS,
                None => 0,
            }
    }

    /// One call of `agent` at `t0`, receiving `tokens`, with the share
    /// `resume` of the stage already done (a checkpoint). Charges the tokens
    /// and the agent's price (pro rata for work lost to a failure).
    fn call(&mut self, agent: usize, t: TaskType, t0: u64, tokens: u64, kind: Kind, resume: f64) -> CallOutcome {
        let a = &self.world.agents[agent];
        self.tally.calls += 1;
        if a.tier == Tier::OverAdvertiser {
            self.tally.over_calls += 1;
        }
        let token_cost = tokens as f64 / 1_000.0 * self.cfg.dollars_per_1k_tokens;
        self.tally.token_cost += token_cost;
        self.tally.cost += token_cost;
        let jitter = self.rng.random_range(0.8..1.2);
        let work = (a.latency_ms as f64 * jitter * (1.0 - resume)).max(1.0) as u64;
        let overhead = self.overhead_ms(tokens, kind);
        let end = t0 + overhead + work;
        let (hb, timeout) = (self.cfg.heartbeat_ms, self.cfg.timeout_ms);
        // ATP notices by heartbeat: T_fail after the last beat before the
        // death; the baselines when the request times out.
        let detect = |died: u64| {
            if kind.fault_tolerant() {
                (a.last_beat(died, hb) + MISSED_HEARTBEATS * hb).max(died + 1)
            } else {
                died + timeout
            }
        };
        let died = if a.down_at(t0).is_some() { Some(t0) } else { a.dies_in(t0, end) };
        if let Some(died) = died {
            let progress = died.saturating_sub(t0 + overhead).min(work);
            self.tally.cost += a.cost * (1.0 - resume) * progress as f64 / work as f64;
            self.tally.failures += 1;
            return CallOutcome::Failed {
                at_ms: died,
                detected_ms: detect(died),
                progress_ms: progress,
                work_ms: work,
            };
        }
        self.tally.cost += a.cost * (1.0 - resume);
        let q = a.skills[&(t as i32)].true_quality + 0.02 * normal(&mut self.rng);
        CallOutcome::Done { latency_ms: end - t0, quality: q.clamp(0.0, 1.0) }
    }

    fn ratio(&mut self) -> f64 {
        self.ratios[self.rng.random_range(0..self.ratios.len())]
    }

    /// Baseline agent choice for a stage (None: sequential has no other).
    fn pick(&mut self, kind: Kind, t: TaskType, tried: &[usize]) -> Option<usize> {
        let cap = &self.world.capable[&(t as i32)];
        if cap.is_empty() {
            return None;
        }
        match kind {
            Kind::Sequential => {
                if tried.is_empty() {
                    cap.first().copied()
                } else {
                    None
                }
            }
            Kind::RoundRobin => {
                let i = self.rr.entry(t as i32).or_insert(0);
                let a = cap[*i % cap.len()];
                *i += 1;
                Some(a)
            }
            Kind::Broadcast => {
                let free: Vec<usize> = cap.iter().copied().filter(|a| !tried.contains(a)).collect();
                let from = if free.is_empty() { cap.clone() } else { free };
                Some(from[self.rng.random_range(0..from.len())])
            }
            // ATP routes instead (`atp_route`).
            Kind::Atp(_) => None,
        }
    }

    /// The planner's trust in agent `i` for `t` as of the last
    /// recomputation (the cold-start prior without a trust book).
    fn trust_of(&self, layers: Layers, i: usize, t: TaskType) -> f64 {
        let prior = self.atp.book.params().cold_start;
        match layers {
            Layers::PriorTrust => prior,
            _ => self.atp.trust.get(&(i, t as i32)).copied().unwrap_or(prior),
        }
    }

    /// ATP's route for one stage at `now`: the best agent (or a draft-refine
    /// pair) among those alive by heartbeat and allowed by their breakers
    /// (for an ablation, what is left without the layer taken away).
    fn atp_route(&mut self, layers: Layers, t: TaskType, now: u64, exclude: &[usize]) -> Option<Vec<usize>> {
        let hb = self.cfg.heartbeat_ms;
        let mut cands = Vec::new();
        let mut index = BTreeMap::new();
        for &i in &self.world.capable[&(t as i32)] {
            let a = &self.world.agents[i];
            let beat = a.last_beat(now, hb);
            self.atp.monitor.beat(&a.did, AgentStatus::Healthy, hb, 0.3, 0, beat);
            let unavailable = layers != Layers::NoFault
                && (self.atp.monitor.status(&a.did, now).is_none() || !self.atp.breakers.would_allow(&a.did, now));
            if exclude.contains(&i) || unavailable {
                continue;
            }
            let trust = self.trust_of(layers, i, t);
            let skill = &a.skills[&(t as i32)];
            cands.push(Candidate {
                agent: a.did.clone(),
                task_type: t,
                quality: skill.advertised,
                latency_ms: a.latency_ms,
                cost: a.cost,
                trust,
            });
            index.insert(a.did.clone(), i);
        }
        if layers == Layers::NoTrust {
            // random among the capable (and available): no trust, and with
            // it nothing to rank by
            // (its own stream: the shared one stays in step with full ATP's)
            return (!cands.is_empty()).then(|| vec![index[&cands[self.pick_rng.random_range(0..cands.len())].agent]]);
        }
        if self.atp.stale || self.atp.repricer.due(now).is_some() {
            self.atp.recompute(self.world, now);
            for c in &mut cands {
                c.trust = self.trust_of(layers, index[&c.agent], t);
            }
            // the repricer's baseline is what it has seen, whether or not
            // routing uses it (else every observation would trigger again)
            let mut seen = cands.clone();
            self.atp.repricer.apply(&mut seen);
            self.atp.repricer.repriced(now, &seen);
            if layers != Layers::NoRepricer {
                cands = seen;
            }
        } else if layers != Layers::NoRepricer {
            self.atp.repricer.apply(&mut cands);
        }
        let q = &self.cfg.qos;
        if layers == Layers::NoRouting {
            // always the highest quality the planner knows, whatever it costs
            let trusted: Vec<&Candidate> = cands.iter().filter(|c| c.trust >= q.min_trust).collect();
            let pool = if trusted.is_empty() { cands.iter().collect() } else { trusted };
            return pool
                .into_iter()
                .max_by(|a, b| a.quality.total_cmp(&b.quality).then_with(|| b.agent.cmp(&a.agent)))
                .map(|a| vec![index[&a.agent]]);
        }
        let mut c = Constraints {
            min_quality: q.min_quality,
            max_latency_ms: q.max_latency_ms,
            max_cost: q.max_cost,
            min_trust: q.min_trust,
        };
        let p = RoutingParams { beta1: q.beta1, beta2: q.beta2, transfer_latency_ms: self.cfg.hop_ms };
        // The handshake's relaxation: 3 retries, 10 % looser each.
        for _ in 0..4 {
            if let Some(r) = routing::route(&cands, t, &c, &p).first() {
                return Some(r.agents.iter().map(|d| index[d]).collect());
            }
            c.min_quality *= 0.9;
            c.min_trust *= 0.9;
            c.max_latency_ms = (c.max_latency_ms as f64 * 1.1) as u64;
            c.max_cost *= 1.1;
        }
        // Escalation: the most trusted agent available.
        cands
            .iter()
            .max_by(|a, b| a.trust.total_cmp(&b.trust).then_with(|| b.agent.cmp(&a.agent)))
            .map(|a| vec![index[&a.agent]])
    }

    fn atp_observe(&mut self, agent: usize, t: TaskType, quality: f64, latency_ms: u64, now: u64) {
        let a = &self.world.agents[agent];
        self.atp.nonce += 1;
        let proof = pb::InteractionProof {
            evaluator: Some(pb::AgentId { uuid: PLANNER.into() }),
            subject: Some(pb::AgentId { uuid: a.did.clone() }),
            task_id: format!("sim-{}", self.atp.nonce),
            task_type: t as i32,
            quality_score: quality,
            latency_ms,
            cost: a.cost,
            timestamp: Some(pb::Timestamp { seconds: EPOCH_S + (now / 1_000) as i64, nanos: 0 }),
            nonce: self.atp.nonce,
            ..Default::default()
        };
        if self.atp.repricer.observe(&Observation::from(&proof)).is_some() {
            self.atp.stale = true;
        }
        self.atp.pending.push(proof);
        self.atp.breakers.record_success(&a.did, now);
    }

    /// Runs one task; returns (latency, quality) or None if lost.
    fn task(&mut self, kind: Kind, spec: &TaskSpec) -> Option<(u64, f64)> {
        let stages = PIPELINES[spec.pipeline].1;
        let mut now = spec.arrival_ms;
        let mut quality = 1.0;
        for (i, (_, t)) in stages.iter().enumerate() {
            let t = *t;
            // The full context at this hop: the task's plus every earlier output.
            let full = spec.context_tokens + spec.outputs[..i].iter().sum::<u64>();
            let mut tried: Vec<usize> = Vec::new();
            // Share of the stage saved in checkpoints (ATP, single-agent routes).
            let mut done = 0.0;
            let (mut attempts, mut waits) = (0, 0);
            let stage_quality = loop {
                let agents = if let Some(layers) = kind.atp() {
                    match self.atp_route(layers, t, now, &tried) {
                        Some(r) => r,
                        None => {
                            // Nobody available: back-pressure, wait for the
                            // first capable agent to beat again.
                            waits += 1;
                            if waits > 100_000 {
                                return None;
                            }
                            let hb = self.cfg.heartbeat_ms;
                            let back = self.world.capable[&(t as i32)]
                                .iter()
                                .map(|&a| self.world.agents[a].back_at(now) + hb)
                                .min()?;
                            now = back.max(now + hb);
                            tried.clear();
                            continue;
                        }
                    }
                } else {
                    vec![self.pick(kind, t, &tried)?]
                };
                attempts += 1;
                if attempts > if kind.atp().is_some() { ATP_ATTEMPTS } else { BASELINE_RETRIES + 1 } {
                    return None;
                }
                let sent = match kind {
                    Kind::Sequential | Kind::RoundRobin => full,
                    // Group chat: besides the conversation so far, this
                    // stage's output also reaches the i earlier speakers (the
                    // later ones are counted in their own `full`); the last
                    // output goes back to the originator only.
                    Kind::Broadcast => full + if i < 3 { i as u64 * spec.outputs[i] } else { 0 },
                    // the ratio is drawn either way, so the random stream
                    // stays in step with full ATP's
                    Kind::Atp(Layers::NoScd) => {
                        let _ = self.ratio();
                        full
                    }
                    Kind::Atp(_) => (full as f64 * self.ratio()).round() as u64,
                };
                self.tally.sent += sent;
                self.tally.full += full;
                if kind.fault_tolerant() {
                    // The breaker of the chosen agent(s) lets the call go (a
                    // half-open one as its probe).
                    for &a in &agents {
                        let did = self.world.agents[a].did.clone();
                        self.atp.breakers.allow(&did, now);
                    }
                }
                let resume = if agents.len() == 1 { done } else { 0.0 };
                // A draft-refine pair runs its members in turn.
                let mut q_members = Vec::new();
                let mut failed = None;
                let mut t_call = now;
                for &a in &agents {
                    match self.call(a, t, t_call, sent, kind, resume) {
                        CallOutcome::Done { latency_ms, quality } => {
                            if kind.atp().is_some() {
                                self.atp_observe(a, t, quality, latency_ms, t_call);
                            }
                            t_call += latency_ms;
                            q_members.push(quality);
                        }
                        CallOutcome::Failed { at_ms, detected_ms, progress_ms, work_ms } => {
                            failed = Some((a, at_ms, detected_ms, progress_ms, work_ms));
                            break;
                        }
                    }
                }
                let Some((a, died, detected, progress, work)) = failed else {
                    now = t_call;
                    break match q_members[..] {
                        [d, r] => 1.0 - (1.0 - r) * (1.0 - routing::DRAFT_LIFT * d),
                        _ => q_members[0],
                    };
                };
                if kind == Kind::Sequential || kind == Kind::Atp(Layers::NoFault) {
                    return None;
                }
                tried.push(a);
                // Work redone on the replacement: everything for the
                // baselines, only what followed the last checkpoint for ATP.
                let redo = if kind.fault_tolerant() && agents.len() == 1 {
                    let kept = progress / self.cfg.checkpoint_ms * self.cfg.checkpoint_ms;
                    // `work` covers the (1 − done) of the stage this call had left.
                    done += (1.0 - done) * kept as f64 / work.max(1) as f64;
                    progress - kept
                } else {
                    progress
                };
                if kind.fault_tolerant() {
                    let did = self.world.agents[a].did.clone();
                    self.atp.breakers.record_failure(&did, detected);
                    self.atp.repricer.agent_failed(&did);
                    self.atp.stale = true;
                }
                let resend = self.overhead_ms(sent, kind);
                self.tally.recoveries_ms.push((detected - died + resend + redo) as f64);
                now = detected;
            };
            quality *= stage_quality;
        }
        Some((now - spec.arrival_ms, quality))
    }
}

/// Runs every strategy on the same seeded world. Fails if `samples` is empty
/// or a sample is impossible (no full tokens, or more sent than full).
pub fn run(cfg: &SimConfig, samples: &[ContextSample]) -> Result<Report> {
    if samples.is_empty() {
        return Err(Error::Invalid {
            field: "context samples".into(),
            reason:
                "none given (the simulation draws context efficiency from measured SCD transfers; at least 1 is needed)"
                    .into(),
        });
    }
    for (i, s) in samples.iter().enumerate() {
        if s.full_tokens == 0 || s.sent_tokens > s.full_tokens {
            return Err(Error::Invalid {
                field: format!("samples[{i}]"),
                reason: format!(
                    "full_tokens {} / sent_tokens {}: need full_tokens ≥ 1 and sent_tokens ≤ full_tokens",
                    s.full_tokens, s.sent_tokens
                ),
            });
        }
    }
    if cfg.agents < 4 {
        return Err(Error::Invalid {
            field: "agents".into(),
            reason: format!("{} (at least 4: one per task type)", cfg.agents),
        });
    }
    let ratios: Vec<f64> = samples.iter().map(|s| s.sent_tokens as f64 / s.full_tokens as f64).collect();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let world = build_world(cfg, samples, &mut rng);
    let strategies: Vec<StrategyReport> =
        [Kind::Sequential, Kind::RoundRobin, Kind::Broadcast, Kind::Atp(Layers::Full)]
            .into_iter()
            .enumerate()
            .map(|(k, kind)| simulate(cfg, &world, &ratios, kind, k))
            .collect();
    // every ATP variant draws from full ATP's seed, so a row differs from
    // the full one by its layer rather than by its luck (the draws stay in
    // step while the rows make the same calls, and part once they differ)
    let ablation = ABLATION
        .iter()
        .map(|&(layers, label, paper)| {
            let report = match layers {
                Layers::Full => StrategyReport { strategy: label.into(), ..strategies[3].clone() },
                _ => simulate(cfg, &world, &ratios, Kind::Atp(layers), 3),
            };
            AblationRow { paper_cost: paper.map(|p| p.0), paper_quality: paper.map(|p| p.1), report }
        })
        .collect();
    Ok(Report {
        config: cfg.clone(),
        samples: samples.len(),
        sample_mean_ratio: ratios.iter().sum::<f64>() / ratios.len() as f64,
        trust: "trust::TrustBook (Definition 3 per task type over the planner's interaction proofs, prior 0.5 below 3), recomputed with the routing table".into(),
        over_advertisers: world.agents.iter().filter(|a| a.tier == Tier::OverAdvertiser).count(),
        strategies,
        ablation,
    })
}

/// One strategy on `world`, its random draws seeded by `k` (a strategy's
/// place in the table).
fn simulate(cfg: &SimConfig, world: &World, ratios: &[f64], kind: Kind, k: usize) -> StrategyReport {
    let mut ctx = Ctx {
        cfg,
        world,
        ratios: ratios.to_vec(),
        rng: StdRng::seed_from_u64(cfg.seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(k as u64 + 1))),
        pick_rng: StdRng::seed_from_u64(cfg.seed ^ 0x5eed_f00d),
        tally: Tally::default(),
        rr: BTreeMap::new(),
        atp: AtpState {
            monitor: HealthMonitor::new(),
            breakers: CircuitBreakers::new(BreakerParams { failures_to_open: 3, cool_down_ms: 30_000 }),
            repricer: Repricer::new(RepricerParams::default()),
            book: TrustBook::new(TrustParams::default(), PLANNER),
            pending: Vec::new(),
            trust: BTreeMap::new(),
            stale: true,
            nonce: 0,
            reprices: 0,
        },
    };
    let mut qualities = Vec::with_capacity(world.tasks.len());
    for spec in &world.tasks {
        match ctx.task(kind, spec) {
            Some((latency, q)) => {
                ctx.tally.completed += 1;
                ctx.tally.latencies_ms.push(latency as f64);
                ctx.tally.quality_sum += q;
                qualities.push(q);
            }
            None => {
                ctx.tally.lost += 1;
                qualities.push(0.0);
            }
        }
    }
    let t = &mut ctx.tally;
    let n = world.tasks.len().max(1) as f64;
    t.latencies_ms.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let report = StrategyReport {
        strategy: kind.name().into(),
        tasks: world.tasks.len(),
        completed: t.completed,
        lost: t.lost,
        cost_per_task: t.cost / n,
        token_cost_per_task: t.token_cost / n,
        latency_s: mean(&t.latencies_ms) / 1_000.0,
        latency_p95_s: t
            .latencies_ms
            .get(((t.latencies_ms.len().max(1) - 1) as f64 * 0.95).round() as usize)
            .map_or(0.0, |v| v / 1_000.0),
        quality: if t.completed == 0 { 0.0 } else { t.quality_sum / t.completed as f64 },
        quality_lost_as_zero: mean(&qualities),
        failures: t.failures,
        recovery_s: if t.recoveries_ms.is_empty() { None } else { Some(mean(&t.recoveries_ms) / 1_000.0) },
        context_efficiency: if t.full == 0 { 0.0 } else { t.sent as f64 / t.full as f64 },
        tokens_sent: t.sent,
        tokens_full: t.full,
        over_advertiser_share: if t.calls == 0 { 0.0 } else { t.over_calls as f64 / t.calls as f64 },
        reprices: ctx.atp.reprices,
    };
    tracing::debug!(strategy = kind.name(), "simulated");
    report
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Synthetic samples: contexts of 2k–12k tokens, SCD keeping 10–40 %.
    fn samples(n: usize, seed: u64) -> Vec<ContextSample> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let full = rng.random_range(2_000..12_000u64);
                let sent = (full as f64 * rng.random_range(0.1..0.4)) as u64;
                ContextSample { full_tokens: full, sent_tokens: sent }
            })
            .collect()
    }

    fn small(seed: u64) -> SimConfig {
        SimConfig { tasks: 2_000, seed, ..SimConfig::default() }
    }

    fn by<'a>(r: &'a Report, name: &str) -> &'a StrategyReport {
        r.strategies.iter().find(|s| s.strategy == name).unwrap()
    }

    #[test]
    fn same_seed_same_report_other_seed_other_report() {
        let s = samples(50, 1);
        let a = run(&small(3), &s).unwrap();
        let b = run(&small(3), &s).unwrap();
        assert_eq!(a, b);
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        let c = run(&small(4), &s).unwrap();
        assert_ne!(a.strategies, c.strategies);
    }

    #[test]
    fn atp_loses_no_task_under_failures_while_sequential_does() {
        // Frequent outages: every agent down about once every 2 minutes.
        let cfg = SimConfig { mtbf_s: 120.0, ..small(5) };
        let r = run(&cfg, &samples(50, 2)).unwrap();
        let (seq, atp) = (by(&r, "sequential"), by(&r, "atp"));
        assert!(seq.lost > 0, "{seq:?}");
        assert_eq!(seq.recovery_s, None);
        assert!(atp.failures > 0, "failures were injected on ATP's calls too: {atp:?}");
        assert_eq!(atp.lost, 0, "{atp:?}");
        assert_eq!(atp.completed, cfg.tasks);
        assert!(atp.recovery_s.is_some());
    }

    #[test]
    fn atp_context_efficiency_is_the_samples_mean_ratio() {
        let s = samples(200, 9);
        let r = run(&small(6), &s).unwrap();
        let mean = s.iter().map(|x| x.sent_tokens as f64 / x.full_tokens as f64).sum::<f64>() / s.len() as f64;
        assert!((r.sample_mean_ratio - mean).abs() < 1e-12);
        let atp = by(&r, "atp");
        // ~8,000 hops drawing ratios in [0.1, 0.4) (sd ≈ 0.087): the weighted
        // mean's standard error is ≈ 0.001; allow 0.01.
        assert!((atp.context_efficiency - mean).abs() < 0.01, "{} vs {mean}", atp.context_efficiency);
        // The baselines forward the full context (broadcast more).
        assert_eq!(by(&r, "sequential").context_efficiency, 1.0);
        assert_eq!(by(&r, "round-robin").context_efficiency, 1.0);
        assert!(by(&r, "broadcast").context_efficiency > 1.0);
        // A different sample set moves ATP's figure with it.
        let half: Vec<ContextSample> =
            s.iter().map(|x| ContextSample { sent_tokens: x.sent_tokens / 2, ..*x }).collect();
        let r2 = run(&small(6), &half).unwrap();
        assert!((by(&r2, "atp").context_efficiency - r2.sample_mean_ratio).abs() < 0.01);
        assert!(by(&r2, "atp").context_efficiency < atp.context_efficiency * 0.6);
    }

    #[test]
    fn empty_or_impossible_samples_are_refused() {
        let e = run(&small(1), &[]).unwrap_err();
        assert!(matches!(&e, Error::Invalid { field, .. } if field == "context samples"), "{e}");
        assert_eq!(
            e.to_string(),
            "context samples: none given (the simulation draws context efficiency from measured SCD transfers; at least 1 is needed)"
        );
        let bad =
            [ContextSample { full_tokens: 100, sent_tokens: 50 }, ContextSample { full_tokens: 10, sent_tokens: 11 }];
        assert_eq!(
            run(&small(1), &bad).unwrap_err().to_string(),
            "samples[1]: full_tokens 10 / sent_tokens 11: need full_tokens ≥ 1 and sent_tokens ≤ full_tokens"
        );
        let zero = [ContextSample { full_tokens: 0, sent_tokens: 0 }];
        assert!(run(&small(1), &zero).is_err());
        let e = run(&SimConfig { agents: 3, ..small(1) }, &samples(5, 1)).unwrap_err();
        assert_eq!(e.to_string(), "agents: 3 (at least 4: one per task type)");
    }

    /// What keeps ATP away from over-advertisers is the repricer (observed
    /// quality replaces the advertised one), not the trust book: with the
    /// trust cut at the cold-start prior and over-advertisers' true quality
    /// above it, trust alone never turns them away. BENCHMARKS.md says so;
    /// if trust starts to steer, this test and that sentence change together.
    #[test]
    fn the_repricer_not_trust_steers_atp_away_from_over_advertisers() {
        let r = run(&small(8), &samples(50, 3)).unwrap();
        assert!(r.over_advertisers > 0);
        let (rr, atp) = (by(&r, "round-robin"), by(&r, "atp"));
        assert!(rr.over_advertiser_share > 0.05, "{rr:?}");
        assert!(atp.over_advertiser_share < rr.over_advertiser_share / 3.0, "{atp:?} vs {rr:?}");
        assert!(atp.quality > rr.quality);
        let repricer_only = row(&r, "ATP − trust book (repricer only)");
        assert!(repricer_only.over_advertiser_share < rr.over_advertiser_share / 3.0, "{repricer_only:?}");
        let trust_only = row(&r, "ATP − repricer (trust only)");
        assert!(trust_only.over_advertiser_share > 0.05, "{trust_only:?}");
        assert!(trust_only.quality < atp.quality);
    }

    fn row<'a>(r: &'a Report, name: &str) -> &'a StrategyReport {
        &r.ablation.iter().find(|a| a.report.strategy == name).unwrap().report
    }

    #[test]
    fn the_ablation_takes_each_layer_away() {
        // frequent outages, so that fault tolerance has work to do
        let cfg = SimConfig { mtbf_s: 120.0, ..small(5) };
        let r = run(&cfg, &samples(50, 2)).unwrap();
        let names: Vec<&str> = r.ablation.iter().map(|a| a.report.strategy.as_str()).collect();
        assert_eq!(names, ABLATION.map(|a| a.1));
        let full = row(&r, "ATP (full)");
        assert_eq!(full, &StrategyReport { strategy: "ATP (full)".into(), ..by(&r, "atp").clone() });
        assert_eq!(r.ablation[0].paper_cost, Some(0.038));
        // without SCD the whole context goes, and its tokens cost more
        let no_scd = row(&r, "ATP − SCD");
        assert_eq!(no_scd.context_efficiency, 1.0);
        assert!(no_scd.token_cost_per_task > 2.0 * full.token_cost_per_task, "{no_scd:?} vs {full:?}");
        // without economic routing, the best quality whatever it costs
        let no_routing = row(&r, "ATP − economic routing");
        assert!(no_routing.cost_per_task > full.cost_per_task, "{no_routing:?} vs {full:?}");
        // without trust, a random capable agent: over-advertisers get calls
        let no_trust = row(&r, "ATP − trust scoring (random capable agent)");
        assert!(no_trust.over_advertiser_share > 0.05, "{no_trust:?}");
        assert!(no_trust.quality_lost_as_zero < full.quality_lost_as_zero);
        // without fault tolerance, a failed call loses its task
        let no_fault = row(&r, "ATP − fault tolerance");
        assert!(no_fault.failures > 0 && no_fault.lost > 0, "{no_fault:?}");
        assert_eq!(no_fault.recovery_s, None);
        assert_eq!(full.lost, 0);
        assert!(no_fault.quality_lost_as_zero < full.quality_lost_as_zero);
    }

    #[test]
    fn table_and_svg_show_every_strategy() {
        let r = run(&SimConfig { tasks: 200, ..small(2) }, &samples(10, 4)).unwrap();
        let t = r.table();
        assert!(t.starts_with("| metric | sequential | round-robin | broadcast | atp |"), "{t}");
        assert!(t.contains("| context efficiency |"));
        let a = r.ablation_table();
        assert_eq!(a.lines().count(), 2 + ABLATION.len(), "{a}");
        assert!(a.contains("| ATP − fault tolerance |") && a.contains("| 0.038 / 0.871 |"), "{a}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.svg");
        write_svg(&r, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for s in ["sequential", "round-robin", "broadcast", "atp"] {
            // plotters puts each text on its own line inside <text>
            assert!(svg.contains(&format!(">\n{s}\n</text>")), "{s}");
        }
        let missing = dir.path().join("no/such/dir/sim.svg");
        let err = format!("{:#}", write_svg(&r, &missing).unwrap_err());
        assert!(err.starts_with(&format!("--plot {}", missing.display())), "{err}");
    }

    /// Prints the default-size table (10,000 tasks) with synthetic samples:
    /// `cargo test -p scd-atp --release sim::tests::print_table -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn print_table() {
        let r = run(&SimConfig::default(), &samples(200, 11)).unwrap();
        println!("{}", r.table());
        println!("{}", r.ablation_table());
        println!("{}", serde_json::to_string_pretty(&r).unwrap());
    }
}
