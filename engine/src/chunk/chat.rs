//! Chat transcripts by turns. A turn is a line that opens with a speaker
//! (`name: text`, `<name> text`, or, after a timestamp, `* name action`),
//! plus the lines that continue it. A timestamp before the speaker
//! (`[15 Jan 19:14]`, `(12:04)`, `2024-01-05 12:34:56`) is skipped, so IRC
//! and chat-export logs are cut by turns as plain `name:` transcripts are. A
//! turn that asks a question and the turn after it form one group.

use super::{lines, RawChunk};

/// Longest speaker name, in bytes.
const MAX_SPEAKER_BYTES: usize = 40;
/// Most words in a speaker name (`Jesus M. Gonzalez-Barahona`, `DT (in chat)`).
const MAX_SPEAKER_WORDS: usize = 4;
/// Longest bracketed timestamp (`[Mon 15 Jan 2009 19:14:07 +0100]`), in bytes.
const MAX_STAMP_BYTES: usize = 40;

pub(super) fn chunk(text: &str, run_bytes: usize) -> Vec<RawChunk> {
    let turns = turns(text);
    // a chat no longer than one run would be one or two chunks, sent whole
    // or not at all: by turns, the packer can still choose within it
    if text.trim().len() <= run_bytes || run_bytes == 0 {
        by_turns(text, turns)
    } else {
        runs(text, &turns, run_bytes)
    }
}

/// The turns' spans: a turn runs to the line before the next turn.
fn turns(text: &str) -> Vec<(usize, usize)> {
    let mut turns: Vec<(usize, usize)> = Vec::new();
    for (s, e) in lines(text) {
        let line = &text[s..e];
        if line.trim().is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some(t) if !starts_turn(line) => t.1 = e,
            _ => turns.push((s, e)),
        }
    }
    turns
}

/// Whether a turn asks a question.
fn asks(turn: &str) -> bool {
    turn.trim_end().ends_with('?')
}

/// One turn a chunk; a question and the turn after it are one group.
fn by_turns(text: &str, turns: Vec<(usize, usize)>) -> Vec<RawChunk> {
    let mut out = Vec::new();
    let mut group = 0;
    let mut prev_question = false;
    for (s, e) in turns {
        let answers_prev = prev_question;
        if !answers_prev {
            group += 1;
        }
        out.push(turn_chunk(s, e, group, !answers_prev));
        prev_question = asks(&text[s..e]) && !answers_prev;
    }
    out
}

/// Runs of consecutive turns up to `run_bytes` each (a turn over it is a
/// run of its own), one group a run; a question opens a run, which takes
/// the turn that answers it even past the bound. Short turns (`im OOT`,
/// `F-M`) say little alone; the exchange they belong to is what the
/// receiver needs. A turn announcing a topic (`topic: Multi-memory`) opens
/// a run too, and the topic heads every run after it until the next one, so
/// a run is read under the subject it discusses.
fn runs(text: &str, turns: &[(usize, usize)], run_bytes: usize) -> Vec<RawChunk> {
    let mut out = Vec::new();
    let mut run: Option<(usize, usize)> = None;
    let (mut topic_now, mut run_topic): (Option<String>, Option<String>) = (None, None);
    let mut after_question = false;
    for &(s, e) in turns {
        let (announced, question) = (topic(&text[s..e]), asks(&text[s..e]));
        run = match run {
            Some((rs, _)) if announced.is_none() && (after_question || (e - rs <= run_bytes && !question)) => {
                Some((rs, e))
            }
            open => {
                if let Some((rs, re)) = open {
                    out.push(RawChunk { heading: run_topic.take(), ..turn_chunk(rs, re, out.len(), true) });
                }
                if let Some(t) = announced {
                    topic_now = Some(t);
                }
                run_topic.clone_from(&topic_now);
                Some((s, e))
            }
        };
        after_question = question && !after_question;
    }
    if let Some((rs, re)) = run {
        out.push(RawChunk { heading: run_topic, ..turn_chunk(rs, re, out.len(), true) });
    }
    out
}

/// Longest topic kept as a heading, in characters.
const MAX_TOPIC_CHARS: usize = 120;

/// The subject a turn announces: `topic: …` or `subject: …` (any case).
fn topic(turn: &str) -> Option<String> {
    let (who, rest) = turn.lines().next()?.trim().split_once(':')?;
    let rest = rest.trim();
    (matches!(who.trim().to_ascii_lowercase().as_str(), "topic" | "subject") && !rest.is_empty())
        .then(|| rest.chars().take(MAX_TOPIC_CHARS).collect())
}

fn turn_chunk(start: usize, end: usize, group: usize, lead: bool) -> RawChunk {
    RawChunk { start, end, heading: None, group, lead, defines: vec![], chunker: "chat", rides: false }
}

/// Whether `line` opens a turn.
fn starts_turn(line: &str) -> bool {
    let line = line.trim_start();
    let rest = strip_stamp(line);
    let stamped = rest.len() < line.len();
    if let Some(r) = rest.strip_prefix('<') {
        // `<nick> text`, IRC's usual form: a nick of one word, then a space
        // and the text (`<details>`, `<b>Note</b>: x` and `<-> y` are not)
        return r.split_once('>').is_some_and(|(nick, text)| {
            !nick.contains(char::is_whitespace)
                && is_speaker(nick)
                && text.starts_with(char::is_whitespace)
                && !text.trim().is_empty()
        });
    }
    if stamped {
        // after a timestamp: an action (`* nick waves`) or a server notice
        // (`-!- nick has joined`, `*** nick quit`) is a turn of its own
        if let Some(r) = rest.strip_prefix("* ") {
            return r.split_whitespace().next().is_some_and(is_speaker);
        }
        if rest.starts_with("-!-") || rest.starts_with("***") || rest.starts_with("--") {
            return true;
        }
    }
    // `name: text`: the colon ends the name and is followed by a space and
    // some text (a URL's `https://`, a code line's `def f(x):` or a
    // markdown link definition's `[docs]: …` is not a speaker)
    rest.split_once(':').is_some_and(|(who, after)| {
        let who = who.trim();
        after.starts_with(char::is_whitespace)
            && !after.trim().is_empty()
            && !who.starts_with('[')
            && !who.as_bytes().windows(2).any(|w| w[0].is_ascii_alphanumeric() && w[1] == b'(')
            && is_speaker(who)
    })
}

/// A speaker's name: short, at most [`MAX_SPEAKER_WORDS`] words holding a
/// letter or digit, no sentence punctuation.
fn is_speaker(who: &str) -> bool {
    who.len() <= MAX_SPEAKER_BYTES
        && who.split_whitespace().count() <= MAX_SPEAKER_WORDS
        && who.chars().any(char::is_alphanumeric)
        && who.chars().all(|c| c.is_alphanumeric() || " _-.'()|^[]{}`@".contains(c))
}

/// `line` without a leading timestamp: a bracketed one holding a digit
/// (`[15 Jan 19:14]`, `(12:04:33)`), or up to two date and time words
/// (`2024-01-05 12:34:56`, `12:34`, `2024-01-05T12:34:56Z`) and what
/// separates them from the speaker.
fn strip_stamp(line: &str) -> &str {
    for (open, close) in [('[', ']'), ('(', ')')] {
        if let Some(r) = line.strip_prefix(open) {
            return match r.find(close) {
                Some(i)
                    if i <= MAX_STAMP_BYTES
                        && r[..i].contains(|c: char| c.is_ascii_digit())
                        && r[..i].contains(':') =>
                {
                    r[i + 1..].trim_start()
                }
                _ => line,
            };
        }
    }
    let mut rest = line;
    for _ in 0..2 {
        let word = rest.split_whitespace().next().unwrap_or("");
        let stamp = word.len() >= 4
            && word.chars().next().is_some_and(|c| c.is_ascii_digit())
            && word.chars().all(|c| c.is_ascii_digit() || "-:./TZ+,".contains(c))
            && word.contains([':', '-', '/', '.']);
        if !stamp {
            break;
        }
        rest = rest[word.len()..].trim_start();
    }
    if rest.len() == line.len() {
        return line;
    }
    // a lone `|` or `-` between the time and the speaker
    rest.strip_prefix("| ").or_else(|| rest.strip_prefix("- ")).map_or(rest, str::trim_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(text: &str) -> Vec<&str> {
        chunk(text, 0).iter().map(|c| &text[c.start..c.end]).collect()
    }

    #[test]
    fn question_keeps_its_answer() {
        let text = "user: hi\nuser: where is the log?\nagent: in /var/log\nsee there\nuser: thanks";
        let c = chunk(text, 0);
        assert_eq!(c.len(), 4);
        assert_eq!(c[1].group, c[2].group);
        assert!(c[1].lead && !c[2].lead);
        assert!(text[c[2].start..c[2].end].ends_with("see there"));
        assert_ne!(c[2].group, c[3].group);
    }

    #[test]
    fn timestamped_irc_lines_are_turns() {
        let text = "[15 Jan 19:14] quigleymd: hows thurs look for you?\n\
                    [15 Jan 19:14] stickster: Maybe everyone can do Friday\n\
                    [15 Jan 19:14] quigleymd: im OOT\n\
                    [15 Jan 19:14] * stickster is open to suggestions\n\
                    [19:20] <jsmith> take note\n\
                    2009-01-15 19:21:07 plarsen: lol\n\
                    2009-01-15T19:22:00Z -!- nombyte has quit";
        let t = turns(text);
        assert_eq!(t.len(), 7, "{t:?}");
        assert!(t[3].ends_with("open to suggestions"));
        let c = chunk(text, 0);
        assert_eq!(c[0].group, c[1].group, "the question and its answer");
        assert_ne!(c[1].group, c[2].group);
    }

    #[test]
    fn named_speakers_with_initials_and_notes_are_turns() {
        let t = turns(
            "Jesus M. Gonzalez-Barahona: This is cool.\nDT (in chat): Do annotations have to be valid?\n\
             AR: It has to be a valid token.",
        );
        assert_eq!(t.len(), 3, "{t:?}");
    }

    #[test]
    fn continuation_lines_are_not_turns() {
        // a URL, a long sentence with a colon, a bullet, a bracket with no
        // time, code, a link definition, HTML and a label with no text after
        // it continue the turn above them
        let t = turns(
            "alice: see the docs\nhttps://example.org/a: here\nNote that the default value is: none\n\
             * a bullet\n[see above] for more\ndef f(x):\n    for i in range(10): print(i)\n\
             [docs]: https://example.org\n<details>\n<b>Note</b>: html\n<-> an arrow\n<see note 3> later\n\
             Steps to reproduce:\nWARNING:",
        );
        assert_eq!(t.len(), 1, "{t:?}");
    }

    #[test]
    fn runs_hold_consecutive_turns_up_to_the_bound_and_a_question_opens_one_with_its_answer() {
        let text = "a: one two\nb: three four\nc: five six\nd: seven?\ne: eight nine ten eleven\nf: twelve";
        let c = chunk(text, 24);
        let runs: Vec<&str> = c.iter().map(|c| &text[c.start..c.end]).collect();
        assert_eq!(
            runs,
            ["a: one two\nb: three four", "c: five six", "d: seven?\ne: eight nine ten eleven", "f: twelve"]
        );
        assert!(c.iter().all(|c| c.lead));
        assert_eq!(c.iter().map(|c| c.group).collect::<Vec<_>>(), [0, 1, 2, 3]);
        // a bound under every turn: each turn a run, a question still with its answer
        assert_eq!(chunk(text, 1).len(), 5);
        // a chat no longer than a run is cut by turns
        let short = "a: where is it?\nb: in the log\nc: thanks";
        let c = chunk(short, 1000);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].group, c[1].group);
        assert_ne!(c[1].group, c[2].group);
    }

    #[test]
    fn a_topic_opens_a_run_and_heads_the_runs_after_it() {
        let text = "a: hello all\nTopic: Multi-memory\nb: is it ready\nc: yes, in two engines\nd: more and more\n\
                    topic: Threads\ne: shared memory";
        let c = chunk(text, 40);
        let runs: Vec<(&str, Option<&str>)> = c.iter().map(|c| (&text[c.start..c.end], c.heading.as_deref())).collect();
        assert_eq!(
            runs,
            [
                ("a: hello all", None),
                ("Topic: Multi-memory\nb: is it ready", Some("Multi-memory")),
                ("c: yes, in two engines\nd: more and more", Some("Multi-memory")),
                ("topic: Threads\ne: shared memory", Some("Threads")),
            ]
        );
        assert_eq!(topic("subject:   "), None);
        assert_eq!(topic("topic is: x"), None);
        assert_eq!(topic(&format!("topic: {}", "é".repeat(500))).unwrap().chars().count(), MAX_TOPIC_CHARS);
    }
}
