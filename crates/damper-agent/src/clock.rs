//! The coarse clock `check` reads: one atomic load instead of a clock call.
//!
//! A thread of its own stores the system time every tick (1 ms). It is a
//! plain thread, not a task, so the agent's notion of time keeps moving even
//! when the host's async runtime is saturated: factor expiry (fail open)
//! must not depend on the runtime's health.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use damper_core::time::{Clock, Nanos, SystemClock};

struct Inner {
    now: AtomicU64,
    stop: AtomicBool,
}

/// A clock that is at most one tick behind the system clock.
#[derive(Clone)]
pub(crate) struct CoarseClock {
    inner: Arc<Inner>,
}

impl CoarseClock {
    /// Starts the ticking thread.
    pub(crate) fn start(tick: Duration) -> std::io::Result<CoarseClock> {
        let inner = Arc::new(Inner {
            now: AtomicU64::new(SystemClock.now().as_nanos()),
            stop: AtomicBool::new(false),
        });
        let ticker = inner.clone();
        std::thread::Builder::new()
            .name("damper-clock".into())
            .spawn(move || {
                while !ticker.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    ticker
                        .now
                        .store(SystemClock.now().as_nanos(), Ordering::Relaxed);
                }
            })?;
        Ok(CoarseClock { inner })
    }

    /// Stops the ticking thread (it exits within one tick).
    pub(crate) fn stop(&self) {
        self.inner.stop.store(true, Ordering::Relaxed);
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        Nanos::from_nanos(self.inner.now.load(Ordering::Relaxed))
    }
}
