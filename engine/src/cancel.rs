//! Cooperative cancellation: a flag the caller sets (its client went away)
//! and an optional deadline, checked by the engine between stages (chunk,
//! embed batches, score, pack) so abandoned work stops early instead of
//! holding a worker.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use scd_engine::cancel::Cancel;
//! let c = Cancel::new();
//! assert!(c.check("chunk").is_ok());
//! c.cancel();
//! assert!(c.check("embed").unwrap_err().to_string().contains("cancelled during embed"));
//! let late = Cancel::with_deadline(Instant::now() - Duration::from_millis(1));
//! assert!(late.check("score").unwrap_err().to_string().contains("deadline"));
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::{Error, Result};

/// A cancel flag shared between the caller and the work, plus a deadline.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Cancel {
    /// A token that is never cancelled until [`Cancel::cancel`] is called.
    pub fn new() -> Self {
        Self::default()
    }

    /// A token that also expires at `deadline`.
    pub fn with_deadline(deadline: Instant) -> Self {
        Self { flag: Arc::default(), deadline: Some(deadline) }
    }

    /// Marks the work as abandoned; every later [`Cancel::check`] fails.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }

    /// True once cancelled (not counting the deadline).
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// `Err` when the work should stop before `stage`:
    /// [`Error::Cancelled`] or [`Error::DeadlineExceeded`].
    pub fn check(&self, stage: &'static str) -> Result<()> {
        if self.is_cancelled() {
            return Err(Error::Cancelled { stage });
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::DeadlineExceeded { stage });
        }
        Ok(())
    }

    /// A guard that cancels this token when dropped unless disarmed: hold
    /// it in an async handler so a dropped request (client gone, deadline)
    /// stops its blocking work.
    pub fn guard(&self) -> CancelOnDrop {
        CancelOnDrop { token: self.clone(), armed: true }
    }
}

/// Cancels its token on drop unless [`CancelOnDrop::disarm`] was called.
#[derive(Debug)]
pub struct CancelOnDrop {
    token: Cancel,
    armed: bool,
}

impl CancelOnDrop {
    /// The work finished; dropping the guard no longer cancels it.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.token.cancel();
        }
    }
}
