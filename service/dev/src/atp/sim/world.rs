//! The seeded world: agents in three tiers, their skills and outages, and
//! the tasks that arrive.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::Rng;

use super::config::ContextSample;
use super::config::SimConfig;
use super::config::PIPELINES;
use super::config::TYPES;
use scd_atp::pb::TaskType;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Tier {
    Cheap,
    Premium,
    OverAdvertiser,
}

#[derive(Debug, Clone)]
pub(super) struct Skill {
    pub(super) true_quality: f64,
    pub(super) advertised: f64,
}

#[derive(Debug, Clone)]
pub(super) struct Agent {
    pub(super) did: String,
    pub(super) tier: Tier,
    pub(super) skills: BTreeMap<i32, Skill>,
    pub(super) latency_ms: u64,
    pub(super) cost: f64,
    /// Sorted, disjoint [start, end) outages.
    pub(super) outages: Vec<(u64, u64)>,
}

impl Agent {
    fn serves(&self, t: TaskType) -> bool {
        self.skills.contains_key(&(t as i32))
    }
    pub(super) fn down_at(&self, t: u64) -> Option<(u64, u64)> {
        self.outages.iter().copied().find(|&(s, e)| s <= t && t < e)
    }
    /// The first outage starting in (t0, t1).
    pub(super) fn dies_in(&self, t0: u64, t1: u64) -> Option<u64> {
        self.outages.iter().map(|o| o.0).find(|&s| s > t0 && s < t1)
    }
    /// The time of the last heartbeat sent at or before `t` (beats at
    /// multiples of the interval while up).
    pub(super) fn last_beat(&self, t: u64, interval: u64) -> u64 {
        let at = |x: u64| x / interval * interval;
        match self.down_at(t) {
            Some((s, _)) => at(s.saturating_sub(1)),
            None => at(t),
        }
    }
    pub(super) fn back_at(&self, t: u64) -> u64 {
        self.down_at(t).map_or(t, |o| o.1)
    }
}

#[derive(Debug, Clone)]
pub(super) struct TaskSpec {
    pub(super) pipeline: usize,
    pub(super) arrival_ms: u64,
    pub(super) context_tokens: u64,
    pub(super) outputs: [u64; 4],
}

pub(super) struct World {
    pub(super) agents: Vec<Agent>,
    pub(super) tasks: Vec<TaskSpec>,
    pub(super) capable: BTreeMap<i32, Vec<usize>>,
}

pub(super) fn normal(rng: &mut StdRng) -> f64 {
    let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

pub(super) fn build_world(cfg: &SimConfig, samples: &[ContextSample], rng: &mut StdRng) -> World {
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
