//! The one clock and the one RFC 3339 parser of SCD's trust code, on
//! `jiff`: signed messages, the DIDWba header, A2A task timestamps and the
//! audit CLI's `--since` all read and write time through here.
//!
//! **The grammar** is RFC 3339 §5.6 `date-time`, strictly: `YYYY-MM-DD`,
//! `T` (or `t`, or a space as the RFC's note allows), `HH:MM:SS`, an
//! optional fraction of one or more digits (nanoseconds kept, the rest
//! dropped), then `Z` (or `z`) or `±HH:MM`. ASCII only. The DIDWba header's
//! [`parse_rfc3339_utc`] is narrower, as it always was: `T` or `t`, at most
//! 9 fraction digits, and an upper-case `Z`. The calendar is checked by jiff, so February 31 and a 13th
//! month are refused; a leap second (`:60`) reads as `:59`. The shape is
//! checked here first because jiff's own parser is the wider ISO 8601 /
//! Temporal grammar (it would take `+01`, a missing seconds field or a
//! `[zone]` annotation).
//!
//! ```
//! use scd_did::time::{format_rfc3339_utc, parse_rfc3339, parse_rfc3339_utc};
//!
//! assert_eq!(parse_rfc3339_utc("2026-03-27T10:30:00Z"), Ok(1_774_607_400));
//! assert_eq!(format_rfc3339_utc(1_774_607_400), "2026-03-27T10:30:00Z");
//! let t = parse_rfc3339("2026-03-27T12:30:00.250+02:00").unwrap();
//! assert_eq!(t.as_millisecond(), 1_774_607_400_250);
//! assert!(parse_rfc3339("2026-02-31T10:30:00Z").is_err());
//! ```

use std::time::SystemTime;

pub use jiff::Timestamp;

/// How far (seconds) a signed message's timestamp may be from the
/// receiver's clock, either way.
pub const MAX_CLOCK_SKEW_S: i64 = 60;

/// The wall clock now.
pub fn now() -> Timestamp {
    Timestamp::now()
}

/// Unix time now, whole seconds.
pub fn now_s() -> i64 {
    now().as_second()
}

/// Unix time now, milliseconds (0 before 1970).
pub fn now_ms() -> u64 {
    u64::try_from(now().as_millisecond()).unwrap_or(0)
}

/// Why a time does not parse. It never quotes the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// Not the RFC 3339 `date-time` shape (see the module docs).
    #[error("expected RFC 3339 like 2026-03-27T10:30:00Z")]
    Shape,
    /// The shape is right but a field is out of range (month 13, Feb 31).
    #[error("a date or time field is out of range")]
    Range,
    /// A UTC time was required and an offset was given.
    #[error("expected UTC (a trailing Z), not an offset")]
    NotUtc,
}

/// Parses an RFC 3339 `date-time` (the module's grammar).
pub fn parse_rfc3339(s: &str) -> Result<Timestamp, TimeError> {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let shaped = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && matches!(b[10], b'T' | b't' | b' ')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shaped {
        return Err(TimeError::Shape);
    }
    let mut rest = &b[19..];
    let mut frac_digits = 0;
    if let Some(frac) = rest.strip_prefix(b".") {
        frac_digits = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if frac_digits == 0 {
            return Err(TimeError::Shape);
        }
        rest = &frac[frac_digits..];
    }
    let offset_ok = match rest {
        b"Z" | b"z" => true,
        [sign, h1, h2, b':', m1, m2] => {
            matches!(sign, b'+' | b'-') && [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit())
        }
        _ => false,
    };
    if !offset_ok {
        return Err(TimeError::Shape);
    }
    // All ASCII from here on, so byte positions are character positions.
    let mut normal = s.to_string();
    if frac_digits > 9 {
        // jiff keeps nanoseconds; finer digits are dropped, not rounded
        normal.replace_range(20 + 9..20 + frac_digits, "");
    }
    normal.replace_range(10..11, "T");
    if normal.ends_with('z') {
        normal.replace_range(normal.len() - 1.., "Z");
    }
    let hour_min_sec = (&normal[11..13], &normal[14..16], &normal[17..19]);
    if hour_min_sec.0 > "23" || hour_min_sec.1 > "59" || hour_min_sec.2 > "60" {
        return Err(TimeError::Range);
    }
    normal.parse::<Timestamp>().map_err(|_| TimeError::Range)
}

/// Unix seconds of an RFC 3339 time in UTC with a `T` separator
/// (`2026-03-27T10:30:00Z`, fraction dropped), as the DIDWba header
/// carries it.
pub fn parse_rfc3339_utc(s: &str) -> Result<i64, TimeError> {
    let t = parse_rfc3339(s)?;
    let fraction = s.get(19..).and_then(|f| f.strip_prefix('.')).map_or(0, |f| f.len() - 1);
    if s.as_bytes()[10] == b' ' || fraction > 9 || s.ends_with('z') {
        return Err(TimeError::Shape);
    }
    if !s.ends_with('Z') {
        return Err(TimeError::NotUtc);
    }
    Ok(t.as_second())
}

/// `YYYY-MM-DDTHH:MM:SSZ` of Unix seconds `s` (clamped to jiff's range,
/// years -9999 to 9999).
pub fn format_rfc3339_utc(s: i64) -> String {
    let t = Timestamp::from_second(s).unwrap_or(if s < 0 { Timestamp::MIN } else { Timestamp::MAX });
    format!("{:.0}", t)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of `t` (milliseconds, UTC).
pub fn format_rfc3339_ms(t: SystemTime) -> String {
    let t = Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH);
    format!("{:.3}", t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn rfc3339_round_trips_and_matches_known_dates() {
        assert_eq!(parse_rfc3339_utc("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_rfc3339_utc("2026-03-27T10:30:00Z"), Ok(1_774_607_400));
        assert_eq!(parse_rfc3339_utc("2000-02-29T23:59:59.123456789Z"), Ok(951_868_799));
        assert_eq!(parse_rfc3339_utc("2026-03-27t10:30:00Z"), Ok(1_774_607_400));
        assert_eq!(parse_rfc3339_utc("2016-12-31T23:59:60Z"), Ok(1_483_228_799), "a leap second reads as :59");
        assert_eq!(format_rfc3339_utc(1_774_607_400), "2026-03-27T10:30:00Z");
        for s in [0, 1, 951_868_799, NOW, 4_102_444_800, -86_400] {
            assert_eq!(parse_rfc3339_utc(&format_rfc3339_utc(s)), Ok(s), "{s}");
        }
        assert_eq!(parse_rfc3339_utc("2026-03-27T10:30:00+00:00"), Err(TimeError::NotUtc));
        for (bad, why) in [
            ("", TimeError::Shape),
            ("2026-03-27T10:30:00", TimeError::Shape),
            ("2026-03-27 10:30:00Z", TimeError::Shape),
            ("2026-03-27T10:30:00z", TimeError::Shape),
            ("2026-13-27T10:30:00Z", TimeError::Range),
            ("2025-02-29T10:30:00Z", TimeError::Range),
            ("2026-02-31T10:30:00Z", TimeError::Range),
            ("2026-03-27T24:00:00Z", TimeError::Range),
            ("2026-03-27T10:30:00.Z", TimeError::Shape),
            ("2026-03-27T10:30:00.1234567890Z", TimeError::Shape),
            ("1800000000", TimeError::Shape),
            ("२०२६-03-27T10:30:00Z", TimeError::Shape),
        ] {
            assert_eq!(parse_rfc3339_utc(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn offsets_and_fractions_parse_and_jiffs_wider_grammar_does_not() {
        let t = parse_rfc3339("2025-12-01T00:00:00.123Z").unwrap();
        assert_eq!(t.as_millisecond(), 1_764_547_200_123);
        assert_eq!(parse_rfc3339("2025-12-01T01:00:00.123+01:00"), Ok(t));
        assert_eq!(parse_rfc3339("2025-11-30 23:00:00.123-01:00"), Ok(t));
        assert_eq!(parse_rfc3339("2025-12-01t00:00:00.123z"), Ok(t));
        // RFC 3339 allows any number of fraction digits: past nanoseconds they are dropped
        let fine = parse_rfc3339("2025-12-01T00:00:00.1234567891234Z").unwrap();
        assert_eq!(fine.subsec_nanosecond(), 123_456_789);
        assert_eq!(format_rfc3339_ms(SystemTime::try_from(t).unwrap()), "2025-12-01T00:00:00.123Z");
        // Temporal forms jiff alone would take, and multi-byte input that
        // must never be sliced through.
        for bad in [
            "2025-12-01T00:00:00+01",
            "2025-12-01T00:00Z",
            "2025-12-01T00:00:00Z[UTC]",
            "2025-12-01T00:00:00+0100",
            "2025-12-01T00:00:00+aé00",
            "2025-12-01T00:00:00+é:00",
            "2025-12-01T00:00:00.1é",
            "2025-12-01T00:00:0é+00:00",
            "2025-12-01T00:00:00+-1:00",
            "ééééééééééééééééééééé",
        ] {
            assert_eq!(parse_rfc3339(bad), Err(TimeError::Shape), "{bad}");
        }
    }

    #[test]
    fn the_clock_agrees_with_the_system_clock() {
        let sys = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
        assert!((now_s() - sys).abs() <= 1);
        assert!(((now_ms() / 1000) as i64 - sys).abs() <= 1);
    }
}
