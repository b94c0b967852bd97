//! Log chunks in packing: by value for their tokens (`log_size_weight`),
//! in a first answer and a follow-up, which log leads come by closure, and
//! the entry after a higher-scored one (`follow_weight`).

use super::tests::{compress_within, follow_up, opts, prose, scd_scoring};
use super::*;
use crate::context::{Field, FieldKind};

/// A context of one log field, `app.log`.
fn app_log(log: &str) -> Context {
    Context { fields: vec![Field { kind: FieldKind::Log, ..prose("app.log", log) }] }
}

/// A log whose first chunk is a run of four noisy `upload` lines that
/// scores above its short error line (with the hash encoder).
fn upload_log() -> Context {
    let noise: String = (0..4)
        .map(|i| format!("INFO upload worker {i} polled the upload queue for upload jobs and found the upload queue idle again\n"))
        .collect();
    let filler: String = (0..12).map(|i| format!("DEBUG gc cycle {i} freed {} MiB\n", i * 3)).collect();
    let log = format!("{noise}{filler}ERROR upload stopped: the volume that holds the spool reached its quota\n");
    app_log(&log)
}

fn with_log_size_weight(w: f32) -> Scd {
    scd_scoring(ScoringConfig { log_size_weight: w, ..Default::default() })
}

/// `log_size_weight` packs log chunks by value for their tokens: a run of
/// noise that scores above a short line, but costs several times its
/// tokens, no longer takes the room the line needs. The scores reported
/// are the same either way.
#[test]
fn a_long_log_run_no_longer_takes_the_room_of_a_short_line_that_scored_a_little_lower() {
    const BUDGET: usize = 100;
    let run = |w: f32| compress_within(&with_log_size_weight(w), "why did the upload queue stop", upload_log(), BUDGET);
    let (off, on) = (run(0.0), run(1.5));
    let ex = off.explanation.as_ref().unwrap();
    let score = |id: &str| {
        let held = ex.dropped.iter().find(|d| d.id == id).map(|d| d.score);
        ex.selected.iter().find(|c| c.id == id).map(|c| c.score).or(held).unwrap()
    };
    // the run of noise (its four lines one chunk) scores above the error line
    assert!(score("app.log#0") > score("app.log#4"), "the run of noise scores higher");
    let ids = |o: &Compressed| o.chunks.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&off), ["app.log#0"], "by score alone the run takes the room");
    assert!(ids(&on).contains(&"app.log#4".to_string()), "by value for the tokens the line goes in: {:?}", ids(&on));
    assert!(!ids(&on).contains(&"app.log#0".to_string()), "{:?}", ids(&on));
    let sent = |o: &Compressed, id: &str| o.chunks.iter().find(|c| c.id == id).map(|c| c.score);
    assert_eq!(sent(&off, "app.log#0"), Some(score("app.log#0")), "the score reported is the score");
    assert!(on.text.contains("reached its quota"), "{}", on.text);
}

/// A follow-up packs log chunks by value for their tokens too.
#[test]
fn a_follow_up_packs_log_chunks_by_value_for_their_tokens() {
    let more = |w: f32| {
        let scd = with_log_size_weight(w);
        let req = CompressRequest {
            task: Task::new("why did the upload queue stop"),
            context: upload_log(),
            // too small for any chunk: the session opens with nothing sent
            requirement: ContextRequirement::with_budget(5),
            session: Some(SessionRequest::default()),
        };
        let out = scd.compress_opts(&req, &opts("cl100k", false), &Cancel::new()).unwrap();
        let first: Vec<String> = out.chunks.iter().map(|c| c.id.clone()).collect();
        assert!(first.is_empty(), "{first:?}");
        let m =
            scd.request_more(&follow_up(&out.session.unwrap(), "why did the upload queue stop", Some(100))).unwrap();
        assert!(m.sent_tokens <= 100, "{m:?}");
        m.chunks.iter().map(|c| c.id.clone()).collect::<Vec<_>>()
    };
    let (off, on) = (more(0.0), more(1.5));
    assert!(off.contains(&"app.log#0".to_string()) && !off.contains(&"app.log#4".to_string()), "{off:?}");
    assert!(on.contains(&"app.log#4".to_string()) && !on.contains(&"app.log#0".to_string()), "{on:?}");
}

/// A log run too long for one chunk is cut into pieces of one group, the
/// first its lead; that piece is no header, so sending a later piece does
/// not bring it by closure (a 455-token progress line once came with the
/// line after it). An error line still comes with its frames (below).
#[test]
fn the_first_piece_of_a_long_log_run_does_not_come_with_a_later_one() {
    let progress: String = (0..90).map(|i| format!("Receiving objects: {i}% ({i}0/900)   ")).collect();
    let log = format!(
        "{progress}\nINFO fetch done\nINFO the mirror sync wrote the index of the mirror sync\nINFO mirror sync index flushed\n\
         DEBUG mirror sync index 1 checked\nDEBUG mirror sync index 2 checked\nDEBUG mirror sync index 3 checked\n"
    );
    let all =
        compress_within(&with_log_size_weight(0.0), "did the mirror sync write its index", app_log(&log), 100_000);
    let ex = all.explanation.unwrap();
    let why = |id: &str| ex.selected.iter().find(|c| c.id == id).unwrap();
    // the progress line is cut in two: the first piece leads the run's group
    assert!(why("app.log#0").lead && !why("app.log#1").lead && why("app.log#0").tokens > 400);
    assert!(why("app.log#1").order < why("app.log#0").order, "the later piece scores higher");
    assert!(!why("app.log#0").by_closure, "the first piece came on its own score, not with the later one");
}

/// An error line leads its frames' group: when the frames are sent (here
/// they hold the task's words, and no severity lifts the line), the line
/// comes with them by closure.
#[test]
fn an_error_line_comes_by_closure_with_its_frames() {
    let log = "INFO start\nINFO ready\nERROR request failed\n  at mirror.sync.index.write(index.rs:12)\n  \
               at mirror.sync.index.flush(index.rs:40)\nINFO done\nINFO idle\n";
    let scoring = ScoringConfig { severity_weight: 0.0, exception_weight: 0.0, ..Default::default() };
    let out = compress_within(&scd_scoring(scoring), "mirror sync index write flush", app_log(log), 100_000);
    let ex = out.explanation.unwrap();
    let why = |id: &str| ex.selected.iter().find(|c| c.id == id).unwrap();
    let (line, frames) = (why("app.log#1"), why("app.log#2"));
    assert!(line.lead && !frames.lead, "the error line leads, its frames follow");
    assert!(frames.order < line.order, "the frames score higher: {} {}", frames.score, line.score);
    assert!(line.by_closure, "the line came with its frames");
}

/// A log where an error line names the task's subject, the entry after it
/// (what the error caused) names little of it, and a line elsewhere shares
/// a word or two.
fn crash_log(caused: &str, distractor: &str) -> Context {
    let served: String = (0..8).map(|i| format!("INFO request {i} served in {} ms\n", 10 + i)).collect();
    let log = format!(
        "{served}ERROR payment worker crashed: the payment database refused the connection\n{caused}\n\
         {served}{distractor}\n{served}"
    );
    app_log(&log)
}

const GAVE_UP: &str = "INFO supervisor gave up after 3 restarts; the queue is no longer drained";

/// `follow_weight`: the entry after an error line (what it caused) names
/// little of the task and scores below a line elsewhere that shares a word;
/// following the error, it goes in ahead of that line at the default and
/// not at 0.
#[test]
fn the_entry_after_an_error_line_gains_a_share_of_its_score() {
    const BUDGET: usize = 80;
    let run = |f: f32| {
        let scd = scd_scoring(ScoringConfig { follow_weight: f, ..Default::default() });
        let context = crash_log(GAVE_UP, "INFO payment retries configured");
        compress_within(&scd, "why did the payment worker stop", context, BUDGET)
    };
    let (off, on) = (run(0.0), run(ScoringConfig::default().follow_weight));
    let (caused, other) = ("supervisor gave up", "payment retries configured");
    assert!(off.text.contains(other) && !off.text.contains(caused), "{}", off.text);
    assert!(on.text.contains(caused) && !on.text.contains(other), "{}", on.text);
    assert!(on.text.contains("ERROR payment worker crashed"), "{}", on.text);
}

/// A follow-up packs by the same values: the entry after the error line
/// goes in ahead of a line elsewhere that scores above it, at the default
/// and not at 0. (A follow-up's candidates are those scoring 0 or more,
/// whatever their value: the entry here scores above 0.)
#[test]
fn a_follow_up_packs_the_entry_after_an_error_line_the_same_way() {
    let more = |f: f32| {
        let scd = scd_scoring(ScoringConfig { follow_weight: f, ..Default::default() });
        let task = "why did the payment worker stop";
        let req = CompressRequest {
            task: Task::new(task),
            context: crash_log(
                "INFO the worker supervisor gave up after 3 restarts",
                "INFO payment worker retries configured",
            ),
            // too small for any chunk: the session opens with nothing sent
            requirement: ContextRequirement::with_budget(5),
            session: Some(SessionRequest::default()),
        };
        let out = scd.compress_opts(&req, &opts("cl100k", false), &Cancel::new()).unwrap();
        assert!(out.chunks.is_empty(), "{:?}", out.chunks);
        let m = scd.request_more(&follow_up(&out.session.unwrap(), task, Some(80))).unwrap();
        assert!(m.sent_tokens <= 80, "{m:?}");
        m.text
    };
    let (off, on) = (more(0.0), more(ScoringConfig::default().follow_weight));
    let (caused, other) = ("supervisor gave up", "retries configured");
    assert!(off.contains(other) && !off.contains(caused), "{off}");
    assert!(on.contains(caused) && !on.contains(other), "{on}");
}
