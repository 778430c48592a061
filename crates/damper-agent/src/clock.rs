//! The coarse clock `check` reads: one atomic load instead of a clock call.
//!
//! A thread of its own stores the system time every tick (1 ms). It is a
//! plain thread, not a task, so the agent's notion of time keeps moving even
//! when the host's async runtime is saturated: factor expiry (fail open)
//! must not depend on the runtime's health.
//!
//! Every agent in a process shares one such thread (a process running many
//! agents, like `damper-load`, would otherwise wake a thread per agent every
//! millisecond). The thread holds only a weak reference and exits within a
//! tick of the last agent's clock being dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use damper_core::time::{Clock, Nanos, SystemClock};

struct Inner {
    now: AtomicU64,
}

/// The clock shared by this process's agents, while any holds it.
static SHARED: Mutex<Weak<Inner>> = Mutex::new(Weak::new());

/// How often the shared thread stores the time.
const TICK: Duration = Duration::from_millis(1);

/// A clock that is at most one tick behind the system clock.
#[derive(Clone)]
pub(crate) struct CoarseClock {
    inner: Arc<Inner>,
}

impl CoarseClock {
    /// The process's coarse clock, starting its thread if none runs.
    pub(crate) fn shared() -> std::io::Result<CoarseClock> {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(inner) = shared.upgrade() {
            return Ok(CoarseClock { inner });
        }
        let inner = Arc::new(Inner {
            now: AtomicU64::new(SystemClock.now().as_nanos()),
        });
        let ticker = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("damper-clock".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(TICK);
                    let Some(inner) = ticker.upgrade() else {
                        return;
                    };
                    inner
                        .now
                        .store(SystemClock.now().as_nanos(), Ordering::Relaxed);
                }
            })?;
        *shared = Arc::downgrade(&inner);
        Ok(CoarseClock { inner })
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        Nanos::from_nanos(self.inner.now.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_share_one_ticking_clock_that_keeps_moving() {
        let a = CoarseClock::shared().unwrap();
        let b = CoarseClock::shared().unwrap();
        assert!(Arc::ptr_eq(&a.inner, &b.inner));
        let t0 = a.now();
        drop(a);
        std::thread::sleep(Duration::from_millis(50));
        assert!(b.now() > t0, "the clock stopped while an agent held it");
    }
}
