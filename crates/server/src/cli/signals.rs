//! `fenced serve`'s signals: SIGTERM and SIGINT caught on a thread of their own, and the
//! grace period after which a shutdown that hangs exits the process anyway.

use std::time::Duration;

use anyhow::Context;

/// How long the graceful shutdown after SIGTERM or an interrupt may take before the process
/// exits anyway (status 1).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug)]
pub enum Signal {
    Term,
    Interrupt,
}

/// Wait for SIGTERM or SIGINT on a thread of its own, with a runtime of its own: a hung apply
/// (a poisoned log entry) holds a worker of the node's runtime and the state lock the others
/// then wait for, so a handler there would never run. The first signal is sent on the
/// returned channel (the graceful shutdown); if the process still runs [`SHUTDOWN_GRACE`]
/// later, it logs so and exits with status 1.
pub fn watch_signals() -> anyhow::Result<tokio::sync::oneshot::Receiver<Signal>> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal thread's runtime")?;
    let (mut term, mut interrupt) = {
        let _in = rt.enter();
        (
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        )
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("fenced-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                let signal = tokio::select! {
                    _ = term.recv() => Signal::Term,
                    _ = interrupt.recv() => Signal::Interrupt,
                };
                let _ = tx.send(signal);
                tokio::time::sleep(SHUTDOWN_GRACE).await;
                tracing::error!(
                    grace_s = SHUTDOWN_GRACE.as_secs(),
                    "{signal:?}: the graceful shutdown did not finish within {} s (is apply \
                     stuck? /health names the entry); exiting now",
                    SHUTDOWN_GRACE.as_secs()
                );
                std::process::exit(1);
            })
        })
        .context("starting the signal thread")?;
    Ok(rx)
}
