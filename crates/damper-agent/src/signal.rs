//! [`stop_signal`]: when a node should stop, and shut its agent down.

/// Listens for SIGINT and SIGTERM (Ctrl-C off Unix) from the moment it is
/// called, and completes on either: what a node awaits before
/// [`Agent::shutdown`](crate::Agent::shutdown), so the counts since the
/// last rollup reach the masters. Call it at start, not where it is
/// awaited: a handler installed only when the future is first polled
/// leaves a window in which the signal's default action kills the process
/// with its counts.
pub fn stop_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (interrupt, terminate) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => s.recv().await.map_or((), |_| ()),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = wait(interrupt) => {}
                () = wait(terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
