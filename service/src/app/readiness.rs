//! Whether a server takes work: [`Readiness`], which `GET /ready` and gRPC
//! health (SERVING / NOT_SERVING) answer.

use std::sync::Arc;

use super::Core;

/// Whether a server takes work, as `GET /ready` answers it (gRPC health
/// says the same as SERVING / NOT_SERVING).
#[derive(Debug, Default)]
pub struct Readiness(std::sync::atomic::AtomicU8);

/// A server's state, for [`Readiness`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Ready {
    /// Loading and warming the model.
    Starting = 0,
    /// Taking work.
    Serving = 1,
    /// SIGTERM: finishing the calls in flight, refusing new ones.
    Draining = 2,
    /// The encoder thread stopped (or the warm-up failed): it takes no work.
    Stopped = 3,
    /// The shared session store (`--state`) does not answer: session calls
    /// fail, stateless ones go on.
    StoreDown = 4,
}

impl Readiness {
    /// Sets the state.
    pub fn set(&self, r: Ready) {
        self.0.store(r as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets `to` if the state is still `from` (a warm-up that ends after a
    /// drain began leaves it draining).
    pub fn set_if(&self, from: Ready, to: Ready) {
        let _ = self.0.compare_exchange(
            from as u8,
            to as u8,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The state.
    pub fn get(&self) -> Ready {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Ready::Serving,
            2 => Ready::Draining,
            3 => Ready::Stopped,
            4 => Ready::StoreDown,
            _ => Ready::Starting,
        }
    }
}

impl Core {
    /// Its [`Readiness`], which the server sets.
    pub fn readiness(&self) -> &Arc<Readiness> {
        &self.readiness
    }
}
