//! Which records a query returns ([`AuditFilter`]).

use crate::record::{bounded_id, AuditRecord};
use crate::{Error, Result};

/// Which records a query returns; `None` matches all.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditFilter {
    /// Only this session.
    pub session: Option<String>,
    /// Only this caller.
    pub caller: Option<String>,
    /// Only records at or after this time (unix ms).
    pub since_ms: Option<u64>,
    /// Only records at or before this time (unix ms).
    pub until_ms: Option<u64>,
    /// Only records after this seq (paging).
    pub after_seq: Option<u64>,
    /// At most this many records (the oldest matching).
    pub limit: Option<usize>,
}

impl AuditFilter {
    /// Checks the time range.
    pub fn check(&self) -> Result<()> {
        if let (Some(since), Some(until)) = (self.since_ms, self.until_ms) {
            if since > until {
                return Err(Error::Invalid {
                    field: "since_ms".into(),
                    reason: format!("{since} is after until_ms {until}"),
                });
            }
        }
        Ok(())
    }

    /// The filter naming records as they are kept: its session and caller
    /// through [`bounded_id`] (a query by a long id finds its digest).
    pub(crate) fn bounded(&self) -> AuditFilter {
        let mut f = self.clone();
        f.session = f.session.as_deref().map(bounded_id);
        f.caller = f.caller.as_deref().map(bounded_id);
        f
    }

    /// Whether `r` matches (`until_ms` and paging are the query's).
    pub(crate) fn matches(&self, r: &AuditRecord) -> bool {
        self.session.as_ref().is_none_or(|s| r.session_id.as_ref() == Some(s))
            && self.caller.as_ref().is_none_or(|c| r.caller.as_ref() == Some(c))
            && self.since_ms.is_none_or(|t| r.at_ms >= t)
    }
}
