//! Chat chunks in packing: a run that follows a higher-scored run of its
//! field gains a share of the difference (`follow_weight`).

use super::tests::{compress_within, hash_scd, prose};
use super::*;
use crate::context::{Field, FieldKind};

/// A channel where the lunch is raised in one run (the task's words), the
/// day is settled in the run after it (none of them), and a run of other
/// chatter elsewhere shares a few of the task's words.
fn lunch_chat() -> Context {
    let raised = "alice: we should get together for lunch with the group next week\n\
                  bob: lunch sounds great, which day works for the lunch?\n\
                  alice: maybe everyone can do the lunch on friday\n\
                  bob: im out of town friday to monday\n\
                  alice: thursday could work for the lunch too then\n";
    let settled = "alice: shall I pencil in thursday?\nbob: definitely, pencil it in\n\
                   alice: done, I will tell the others tonight\nbob: great see you there\n";
    let filler: String = (0..6)
        .map(|i| format!("carol: the build {i} went green again after the cache fix, nothing else to report\n"))
        .collect();
    let chatter = "dave: which day is the group photo?\nerin: no idea\n";
    let text = format!("{raised}{settled}{filler}{chatter}");
    Context { fields: vec![Field { kind: FieldKind::Chat, ..prose("irc", &text) }] }
}

fn with_follow_weight(f: f32) -> Scd {
    let mut cfg =
        ScdConfig { scoring: ScoringConfig { follow_weight: f, ..Default::default() }, ..ScdConfig::default() };
    cfg.prepare.chunk.chat_run_bytes = 300;
    hash_scd(cfg)
}

/// The run that settles the day repeats few of the task's words and scores
/// below an unrelated question elsewhere; following the run that raised
/// the lunch, it goes in ahead of that question at the default weight. The
/// scores reported are the same either way.
#[test]
fn the_run_after_a_high_scored_run_gains_a_share_of_its_score() {
    const BUDGET: usize = 150;
    let task = "did they settle on a day for the group lunch";
    let run = |f: f32| compress_within(&with_follow_weight(f), task, lunch_chat(), BUDGET);
    let (off, on) = (run(0.0), run(ScoringConfig::default().follow_weight));
    let ex = off.explanation.as_ref().unwrap();
    let score = |id: &str| {
        let held = ex.dropped.iter().find(|d| d.id == id).map(|d| d.score);
        ex.selected.iter().find(|c| c.id == id).map(|c| c.score).or(held).unwrap()
    };
    let (raised, settled, question) = (score("irc#1"), score("irc#2"), score("irc#5"));
    assert!(raised > question && question > settled, "{raised} {question} {settled}");
    assert!(off.text.contains("which day is the group photo") && !off.text.contains("pencil"), "{}", off.text);
    assert!(on.text.contains("shall I pencil in thursday?") && !on.text.contains("group photo"), "{}", on.text);
    let sent = |o: &Compressed, id: &str| o.chunks.iter().find(|c| c.id == id).map(|c| c.score);
    assert_eq!(sent(&on, "irc#2"), Some(settled), "the score reported is the score");
}

/// A short chat (cut by turns): a question that names the task, its answer
/// that names little of it, and a note elsewhere that shares a few words.
fn short_chat() -> Context {
    let chat = "user: why did the nightly payment export fail last night?\nagent: the disk was full, so it stopped\n";
    let note = "The payment export runs nightly at two.";
    Context { fields: vec![Field { kind: FieldKind::Chat, ..prose("chat", chat) }, prose("notes", note)] }
}

/// An answer in a short chat cut by turns waits at its own score (the
/// packing queue's rule for answers): its question does not lift it, even
/// at the largest weight, so the note that scores above it goes first.
#[test]
fn a_chat_answer_is_not_lifted_by_its_question() {
    let task = "why did the nightly payment export fail";
    let out = compress_within(&with_follow_weight(1.0), task, short_chat(), 100_000);
    let ex = out.explanation.unwrap();
    let why = |id: &str| ex.selected.iter().find(|c| c.id == id).unwrap();
    let (question, answer, note) = (why("chat#0"), why("chat#1"), why("notes#0"));
    assert!(question.lead && !answer.lead, "a question and its answer");
    assert!(question.score > note.score && note.score > answer.score, "{question:?} {note:?} {answer:?}");
    assert!(note.order < answer.order, "the answer was lifted past the note: {note:?} {answer:?}");
}
