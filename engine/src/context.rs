//! The problem SCD solves (paper §6.2): an agent's context, the task handed
//! over, and what the receiver can take. The types live in `scd-context`,
//! shared with the service and the ATP stack; this module re-exports them.
//!
//! ```
//! use scd_engine::context::{ContextRequirement, Task};
//!
//! assert!(ContextRequirement::with_budget(0).validate(1000).is_err());
//! assert_eq!(Task::new(" Fix it ").text(), "Fix it");
//! ```

pub use scd_context::{
    check_no_nul, check_unique_keys, shown_key, shown_name, Context, ContextLimits, ContextRequirement, Field,
    FieldKind, Redacted, Task, MAX_FIELD_NAME_BYTES,
};

impl From<scd_context::Error> for crate::Error {
    fn from(e: scd_context::Error) -> Self {
        match e {
            scd_context::Error::InvalidArgument { field, message } => crate::Error::InvalidArgument { field, message },
            scd_context::Error::Read { path, source } => crate::Error::Io { path, source },
        }
    }
}
