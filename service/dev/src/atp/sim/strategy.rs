//! The strategies compared: three baselines and ATP with some of its
//! layers taken away.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Sequential,
    RoundRobin,
    Broadcast,
    Atp(Layers),
}

/// ATP with one layer taken away (the §10.3 ablation), or all on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layers {
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
pub(super) const ABLATION: [(Layers, &str, PaperFigures); 7] = [
    (Layers::Full, "ATP (full)", Some((0.038, 0.886))),
    (Layers::NoRouting, "ATP − economic routing", Some((0.098, 0.889))),
    (Layers::NoScd, "ATP − SCD", Some((0.071, 0.882))),
    (Layers::NoTrust, "ATP − trust scoring (random capable agent)", Some((0.041, 0.843))),
    (Layers::NoFault, "ATP − fault tolerance", Some((0.038, 0.871))),
    (Layers::NoRepricer, "ATP − repricer (trust only)", None),
    (Layers::PriorTrust, "ATP − trust book (repricer only)", None),
];

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Sequential => "sequential",
            Kind::RoundRobin => "round-robin",
            Kind::Broadcast => "broadcast",
            Kind::Atp(Layers::Full) => "atp",
            Kind::Atp(l) => ABLATION.iter().find(|a| a.0 == l).map_or("atp", |a| a.1),
        }
    }

    /// ATP's layers, or None for a baseline.
    pub(super) fn atp(self) -> Option<Layers> {
        match self {
            Kind::Atp(l) => Some(l),
            _ => None,
        }
    }

    /// ATP with its fault-tolerance layer (heartbeats, breakers, checkpoints).
    pub(super) fn fault_tolerant(self) -> bool {
        self.atp().is_some_and(|l| l != Layers::NoFault)
    }
}
