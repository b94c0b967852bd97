//! The simulated work an ATP task carries: the requester's [`WorkOrder`]
//! (JSON in `TaskSubmit.payload`) and the worker's [`WorkReport`] (JSON in
//! the final `TaskResult.payload`), with their bounds. Both sides of a
//! delegation use these, so they sit below [`crate::agent`] and
//! [`crate::planner`].
//!
//! ```
//! use scd_atp::work::{WorkOrder, MAX_STEPS};
//!
//! let order = WorkOrder::parse(br#"{"title": "triage the outage", "steps": 3}"#).unwrap();
//! assert_eq!(order.steps, 3);
//! let too_long = format!(r#"{{"title": "x", "steps": {}}}"#, MAX_STEPS + 1);
//! assert!(WorkOrder::parse(too_long.as_bytes()).unwrap_err().to_string().starts_with("task.payload.steps"));
//! ```

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::{pb, Error, Result};

/// Bytes of a task payload (the work order).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Steps of one work order.
pub const MAX_STEPS: u32 = 100;
/// Needs of one work order.
pub const MAX_NEEDS: usize = 32;

/// The simulated work a task asks for: JSON in `TaskSubmit.payload`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkOrder {
    /// What to do.
    pub title: String,
    /// Checkpointed steps (1 to [`MAX_STEPS`]).
    #[serde(default = "default_steps")]
    pub steps: u32,
    /// Facts the work needs from the context (case-insensitive substrings):
    /// the worker's confidence is the share it found, and below θ it asks
    /// its requester for each missing one.
    #[serde(default)]
    pub needs: Vec<String>,
    /// A poison order: every agent fails it at step 2 with this error.
    #[serde(default)]
    pub fail: Option<String>,
}

fn default_steps() -> u32 {
    4
}

impl WorkOrder {
    /// Parses and checks a payload; the error names the field and the limit.
    pub fn parse(payload: &[u8]) -> Result<WorkOrder> {
        let invalid = |field: &str, reason: String| Error::Invalid { field: field.into(), reason };
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(invalid("task.payload", format!("{} bytes (limit {MAX_PAYLOAD_BYTES})", payload.len())));
        }
        let mut de = serde_json::Deserializer::from_slice(payload);
        let order: WorkOrder = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| invalid(&format!("task.payload.{}", e.path()), e.inner().to_string()))?;
        de.end().map_err(|e| invalid("task.payload", e.to_string()))?;
        if order.steps == 0 || order.steps > MAX_STEPS {
            return Err(invalid("task.payload.steps", format!("{} (1 to {MAX_STEPS})", order.steps)));
        }
        if order.needs.len() > MAX_NEEDS {
            return Err(invalid("task.payload.needs", format!("{} needs (limit {MAX_NEEDS})", order.needs.len())));
        }
        Ok(order)
    }
}

/// The most chunk ids a report lists: a finished job is kept with its
/// report, so a context of many chunks must not make it large.
pub const MAX_REPORT_CHUNKS: usize = 64;

/// What the worker did: JSON in the final `TaskResult.payload`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkReport {
    /// The order's title.
    pub title: String,
    /// Steps run here (not counting the ones resumed past).
    pub steps_run: u32,
    /// The step this agent resumed after (0 = from scratch).
    pub resumed_after: u32,
    /// Chunks of context it used (the first [`MAX_REPORT_CHUNKS`]).
    pub chunks: Vec<String>,
    /// Its confidence on the context it was sent, in [0, 1].
    pub confidence: f64,
    /// Its confidence after its context requests.
    pub final_confidence: f64,
    /// RequestContext calls it made.
    pub context_requests: u32,
}

/// Text as needs are matched in it: lower-cased, every run of whitespace
/// one space, trimmed.
pub fn normalize(text: &str) -> String {
    text.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>().join(" ")
}

/// Chunks read in order ([`reading_text`]): their text, and where each sits in it.
#[derive(Debug, Default)]
pub struct Reading<'c> {
    /// The chunks' [`normalize`]d text in reading order: neighbours
    /// one space apart, others a line apart.
    pub text: String,
    /// Each chunk's byte range in `text`.
    spans: Vec<(std::ops::Range<usize>, &'c pb::ContextChunk)>,
}

impl<'c> Reading<'c> {
    /// Whether `need` (already [`normalize`]d) is in the text.
    pub fn holds(&self, need: &str) -> bool {
        !need.is_empty() && self.text.contains(need)
    }

    /// The chunks that hold `need`'s first occurrence (two or more when it
    /// straddles a chunk boundary); empty when it is not there.
    pub fn holding(&self, need: &str) -> Vec<&'c pb::ContextChunk> {
        let Some(at) = self.text.find(need).filter(|_| !need.is_empty()) else { return Vec::new() };
        let end = at + need.len();
        self.spans.iter().filter(|(r, _)| r.start < end && at < r.end).map(|&(_, c)| c).collect()
    }
}

/// `chunks` as a reader has them: in the context's reading order (whatever
/// order they arrived in) and joined, so that a need which
/// straddles the boundary of two neighbouring chunks is found in the pair
/// (chunks that are not neighbours are a line apart).
pub fn reading_text<'c>(chunks: impl IntoIterator<Item = &'c pb::ContextChunk>) -> Reading<'c> {
    let mut ordered: Vec<&pb::ContextChunk> = chunks.into_iter().collect();
    // `index` is the chunk's place in the whole context's reading order
    ordered.sort_by_key(|c| c.index);
    ordered.dedup_by(|a, b| a.chunk_id == b.chunk_id);
    let mut reading = Reading::default();
    let mut last: Option<&pb::ContextChunk> = None;
    for c in ordered {
        let text = normalize(&String::from_utf8_lossy(&c.data));
        if let Some(prev) = last {
            // neighbours read on; anything else is apart (a normalized need
            // holds no line break, so it never spans one)
            let next = prev.field == c.field && prev.index + 1 == c.index;
            reading.text.push(if next { ' ' } else { '\n' });
        }
        last = Some(c);
        let start = reading.text.len();
        reading.text.push_str(&text);
        reading.spans.push((start..reading.text.len(), c));
    }
    reading
}

/// The requester's own measure of a finished order, in [0, 1]: the share of
/// its steps that the worker's verified checkpoints showed done
/// (`steps_seen`, the highest step number), times the share of its needs
/// for which the report cites chunks *the requester sent* (`sent`) that
/// hold it (read together, so a need across two neighbouring chunks counts
/// when both are cited), out of the needs that could be found (those in
/// `findable`, [`normalize`]d text the worker could have had: the whole
/// shareable context, never a withheld field, or only what was sent when
/// the requester had no budget left to send more). The worker's
/// self-reported quality and confidence take no part: a subject does not
/// rate itself.
pub fn assess(
    order: &WorkOrder,
    steps_seen: u32,
    cited: &[String],
    sent: &[pb::ContextChunk],
    findable: &[String],
) -> f64 {
    let completeness = f64::from(steps_seen.min(order.steps)) / f64::from(order.steps.max(1));
    let cited: HashSet<&str> = cited.iter().take(MAX_REPORT_CHUNKS).map(String::as_str).collect();
    let cited = reading_text(sent.iter().filter(|c| cited.contains(c.chunk_id.as_str())));
    let needs: Vec<String> = order
        .needs
        .iter()
        .map(|n| normalize(n))
        .filter(|n| !n.is_empty() && findable.iter().any(|t| t.contains(n.as_str())))
        .collect();
    let found = needs.iter().filter(|n| cited.holds(n)).count();
    let coverage = if needs.is_empty() { 1.0 } else { found as f64 / needs.len() as f64 };
    completeness * coverage
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(id: &str, text: &str) -> pb::ContextChunk {
        pb::ContextChunk { chunk_id: id.into(), data: text.as_bytes().to_vec(), ..Default::default() }
    }

    #[test]
    fn the_requester_measures_steps_and_cited_needs_itself() {
        let order = WorkOrder {
            title: "t".into(),
            steps: 4,
            needs: vec!["Retry".into(), "idempotency".into(), "nowhere".into()],
            fail: None,
        };
        let sent = [chunk("a#0", "the retry policy"), chunk("b#0", "an Idempotency key")];
        let findable = vec!["the retry policy an idempotency key".to_string()];
        let cite = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // all steps, both findable needs cited ("nowhere" is in no text: not counted)
        assert_eq!(assess(&order, 4, &cite(&["a#0", "b#0"]), &sent, &findable), 1.0);
        // half the steps seen
        assert_eq!(assess(&order, 2, &cite(&["a#0", "b#0"]), &sent, &findable), 0.5);
        // one need's chunk not cited
        assert_eq!(assess(&order, 4, &cite(&["a#0"]), &sent, &findable), 0.5);
        // citing a chunk the requester never sent earns nothing
        assert_eq!(assess(&order, 4, &cite(&["a#0", "forged#9"]), &sent, &findable), 0.5);
        // a need in the context but never asked for counts against the worker
        assert_eq!(assess(&order, 4, &cite(&["a#0"]), &sent[..1], &findable), 0.5);
        // a checkpoint past the order's steps does not lift it above 1
        assert_eq!(assess(&order, 99, &cite(&["a#0", "b#0"]), &sent, &findable), 1.0);
        // only the first MAX_REPORT_CHUNKS cited ids count, however many are listed
        let mut many: Vec<String> = (0..MAX_REPORT_CHUNKS).map(|i| format!("pad#{i}")).collect();
        many.extend(cite(&["a#0", "b#0"]));
        assert_eq!(assess(&order, 4, &many, &sent, &findable), 0.0);
        let no_needs = WorkOrder { needs: vec![], ..order };
        assert_eq!(assess(&no_needs, 3, &[], &[], &[]), 0.75);
    }

    fn at(id: &str, field: &str, index: u32, text: &str) -> pb::ContextChunk {
        pb::ContextChunk { index, field: field.into(), ..chunk(id, text) }
    }

    /// A need cut by a chunk boundary is held by the neighbouring pair, in
    /// whatever order they arrived, and cited only when both are; chunks
    /// that are not neighbours do not run together.
    #[test]
    fn a_need_across_a_chunk_boundary_counts_when_both_halves_are_cited() {
        let order = WorkOrder { title: "t".into(), steps: 1, needs: vec!["Retry  Policy".into()], fail: None };
        let findable = vec![normalize("the\nretry policy doubles")];
        // the second half arrived first (an adaptive answer, say)
        let sent = [at("a#1", "a", 4, "policy doubles"), at("a#0", "a", 3, "the retry")];
        let reading = reading_text(&sent);
        assert_eq!(reading.text, "the retry policy doubles");
        let holding: Vec<&str> = reading.holding("retry policy").iter().map(|c| c.chunk_id.as_str()).collect();
        assert_eq!(holding, ["a#0", "a#1"]);
        let cite = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(assess(&order, 1, &cite(&["a#0", "a#1"]), &sent, &findable), 1.0);
        assert_eq!(assess(&order, 1, &cite(&["a#0"]), &sent, &findable), 0.0);
        // not neighbours (another field between, or a gap): a line apart
        let apart = [at("a#0", "a", 3, "the retry"), at("b#0", "b", 4, "policy doubles")];
        assert!(!reading_text(&apart).holds("retry policy"));
        let gap = [at("a#0", "a", 3, "the retry"), at("a#2", "a", 5, "policy doubles")];
        assert!(reading_text(&gap).holding("retry policy").is_empty());
        // a need only in a withheld field is not findable: it does not count
        assert_eq!(assess(&order, 1, &[], &[], &[normalize("shareable text")]), 1.0);
    }
}
