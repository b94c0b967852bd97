//! The line grammar that reading and writing share: tags, the special
//! lines a section escapes, level words with their notes.

use std::borrow::Cow;

use super::{ANSWER_PREFIX, JSON_MARKER};

/// Longest tag name in bytes; a longer `[...]` is text.
const MAX_TAG_BYTES: usize = 64;

/// Longest value echoed back in a reason.
const MAX_ECHO_CHARS: usize = 40;

pub(super) fn non_empty(s: String) -> Option<String> {
    if s.is_empty() {
        None
    } else {
        Some(s)
    }
}

/// Byte offset of the first line that starts with `prefix`.
pub(super) fn find_line_start(text: &str, prefix: &str) -> Option<usize> {
    if text.starts_with(prefix) {
        return Some(0);
    }
    text.find(&format!("\n{prefix}")).map(|i| i + 1)
}

/// `[TAG]` at the start of `line`: the tag and the rest of the line.
pub(super) fn tag_line(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix('[')?;
    let close = rest.bytes().take(MAX_TAG_BYTES + 1).position(|b| b == b']')?;
    let tag = &rest[..close];
    let mut bytes = tag.bytes();
    let first = bytes.next()?;
    if !first.is_ascii_uppercase() || !bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
        return None;
    }
    Some((tag, &rest[close + 1..]))
}

/// A line a reader could take for a tag, the answer or a JSON marker.
pub(super) fn looks_special(line: &str) -> bool {
    line.starts_with('[') || line.starts_with(ANSWER_PREFIX) || line.starts_with(JSON_MARKER)
}

/// One more leading space on a line that (after its leading spaces) looks
/// special, so it stays text; [`unescape`] takes it off again.
pub(super) fn escape(line: &str) -> Cow<'_, str> {
    if looks_special(line.trim_start_matches(' ')) {
        Cow::Owned(format!(" {line}"))
    } else {
        Cow::Borrowed(line)
    }
}

pub(super) fn unescape(line: &str) -> &str {
    match line.strip_prefix(' ') {
        Some(rest) if looks_special(rest.trim_start_matches(' ')) => rest,
        _ => line,
    }
}

/// `completed, because ...` → the lower-cased level word and the note.
pub(super) fn level_and_note(text: &str) -> (String, Option<String>) {
    let text = text.trim();
    let end = text.find(|c: char| !(c.is_ascii_alphabetic() || c == '_')).unwrap_or(text.len());
    let note = text[end..].trim_start_matches(|c: char| c.is_whitespace() || ",;:.-\u{2014}".contains(c)).trim_end();
    (text[..end].to_ascii_lowercase(), non_empty(note.to_string()))
}

pub(super) fn echo(s: &str) -> String {
    s.chars().take(MAX_ECHO_CHARS).collect()
}
