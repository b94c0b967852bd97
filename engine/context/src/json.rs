//! Duplicate keys in a JSON document.
//!
//! `serde_json` keeps the *last* of two equal keys when it builds a
//! [`serde_json::Value`], so `{"name": "api_keys", "confidential": true,
//! "confidential": false}` read into a `Value` and then into a [`crate::Field`]
//! is a public field. The typed parse ([`crate::Context::from_json`]) refuses
//! it (`duplicate field`), but every network surface reads its body into a
//! `Value` first. [`check_unique_keys`] walks the raw text once, without
//! building values, and refuses a document in which any object repeats a key;
//! every surface calls it on the bytes it received before parsing them.
//!
//! ```
//! use scd_context::check_unique_keys;
//!
//! check_unique_keys(br#"{"fields": [{"name": "a", "confidential": true}]}"#).unwrap();
//! let dup = br#"{"fields": [{"name": "a", "confidential": true, "confidential": false}]}"#;
//! let e = check_unique_keys(dup).unwrap_err().to_string();
//! assert_eq!(e, "fields[0].confidential: duplicate key; each key may appear once in an object");
//! ```

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::{Error, Result};

/// The longest key an error names; a longer one (or one with characters
/// other than ASCII letters, digits, `_` and `-`) is shown by its size only,
/// since a key of a client's object could be content.
pub const MAX_ECHOED_KEY_BYTES: usize = 40;

/// `Err` naming the path of the first key that appears twice in one object
/// (`fields[0].confidential`), anywhere in `json`. A text that is not JSON
/// is `Ok`: the caller's own parse says what is wrong with it.
pub fn check_unique_keys(json: &[u8]) -> Result<()> {
    let walk = Walk { path: RefCell::new(Vec::new()), found: RefCell::new(None) };
    let mut de = serde_json::Deserializer::from_slice(json);
    match (&walk).deserialize(&mut de) {
        Ok(()) => Ok(()),
        Err(_) => walk.found.into_inner().map_or(Ok(()), Err),
    }
}

/// How an error shows a key: itself when short and plain, else its size.
pub fn shown_key(key: &str) -> Cow<'_, str> {
    let plain = key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain && !key.is_empty() && key.len() <= MAX_ECHOED_KEY_BYTES {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("<{}-byte key>", key.len()))
    }
}

/// The longest name or id (a field name, a session id, a tokenizer) an
/// error quotes.
pub const MAX_ECHOED_NAME_BYTES: usize = 64;

/// How an error shows a name or id a request gave: quoted when it is at
/// most [`MAX_ECHOED_NAME_BYTES`] with no control characters, else by its
/// size only (a 5,000-byte "id" is more likely content than an id).
pub fn shown_name(name: &str) -> String {
    if name.len() <= MAX_ECHOED_NAME_BYTES && !name.chars().any(char::is_control) {
        format!("{name:?}")
    } else {
        format!("<a {}-byte name>", name.len())
    }
}

enum Seg {
    Key(String),
    Index(usize),
}

/// The walk's state: where it is, and the duplicate it found.
struct Walk {
    path: RefCell<Vec<Seg>>,
    found: RefCell<Option<Error>>,
}

impl Walk {
    fn duplicate(&self, key: &str) -> Error {
        let mut at = String::new();
        for seg in self.path.borrow().iter() {
            match seg {
                Seg::Key(k) if at.is_empty() => at.push_str(k),
                Seg::Key(k) => {
                    at.push('.');
                    at.push_str(k);
                }
                Seg::Index(i) => at.push_str(&format!("[{i}]")),
            }
        }
        if !at.is_empty() {
            at.push('.');
        }
        at.push_str(&shown_key(key));
        Error::invalid(at, "duplicate key; each key may appear once in an object")
    }
}

impl<'de> DeserializeSeed<'de> for &Walk {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for &Walk {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let mut i = 0;
        loop {
            self.path.borrow_mut().push(Seg::Index(i));
            let more = seq.next_element_seed(self)?;
            self.path.borrow_mut().pop();
            if more.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let mut seen: HashSet<Cow<'de, str>> = HashSet::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if seen.contains(&key) {
                *self.found.borrow_mut() = Some(self.duplicate(&key));
                return Err(de::Error::custom("duplicate key"));
            }
            self.path.borrow_mut().push(Seg::Key(shown_key(&key).into_owned()));
            let value = map.next_value_seed(self);
            self.path.borrow_mut().pop();
            value?;
            seen.insert(key);
        }
        Ok(())
    }
}

/// A key, borrowed from the input when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> std::result::Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E>(self, s: &str) -> std::result::Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        check_unique_keys(json.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn a_repeated_key_is_refused_at_any_depth_and_named_by_its_path() {
        const WHY: &str = ": duplicate key; each key may appear once in an object";
        let flip = r#"{"fields": [{"name": "k", "content": "s", "confidential": true, "confidential": false}]}"#;
        assert_eq!(err(flip), format!("fields[0].confidential{WHY}"));
        assert_eq!(err(r#"{"a": 1, "a": 1}"#), format!("a{WHY}"));
        let deep = r#"{"params": {"message": {"parts": [{"text": "x"}, {"data": {"budget": 1, "budget": 2}}]}}}"#;
        assert_eq!(err(deep), format!("params.message.parts[1].data.budget{WHY}"));
        // an escaped key equals its plain spelling
        assert_eq!(err(r#"{"confidential": true, "confidentia\u006c": false}"#), format!("confidential{WHY}"));
        // equal keys in different objects are fine, as are arrays of anything
        check_unique_keys(br#"{"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}], "c": [1, "x", null, true, 2.5, -3]}"#)
            .unwrap();
    }

    #[test]
    fn a_key_that_could_be_content_is_shown_by_its_size() {
        let secret = "sk_live SECRET 4242";
        let e = err(&format!(r#"{{"m": {{"{secret}": 1, "{secret}": 2}}}}"#));
        assert_eq!(e, "m.<19-byte key>: duplicate key; each key may appear once in an object");
        let long = "k".repeat(MAX_ECHOED_KEY_BYTES + 1);
        let e = err(&format!(r#"{{"{long}": {{"a": 1, "a": 2}}}}"#));
        assert_eq!(e, "<41-byte key>.a: duplicate key; each key may appear once in an object");
    }

    #[test]
    fn a_name_is_quoted_only_when_short_and_printable() {
        assert_eq!(shown_name("gpt-5"), "\"gpt-5\"");
        assert_eq!(shown_name(&"x".repeat(5000)), "<a 5000-byte name>");
        assert_eq!(shown_name("a\nb"), "<a 3-byte name>");
        assert_eq!(shown_name(&"x".repeat(MAX_ECHOED_NAME_BYTES)).len(), MAX_ECHOED_NAME_BYTES + 2);
    }

    #[test]
    fn text_that_is_not_json_is_left_to_the_callers_parse() {
        for bad in ["", "{", r#"{"a": 1,}"#, "nope", r#"{"a": 1} trailing"#] {
            check_unique_keys(bad.as_bytes()).unwrap();
        }
        // a duplicate before a syntax error is still a duplicate
        assert!(err(r#"{"a": 1, "a": 2, "#).starts_with("a: duplicate key"));
    }
}
