//! Progress of a long command (an image import, an MCP server's first listing), for a caller
//! who asked to follow it: the steps a binder reports while it plans go to the sender the
//! caller's request set for its task, and nowhere when none was set.

use tokio::sync::mpsc::UnboundedSender;

tokio::task_local! {
    static PROGRESS: UnboundedSender<String>;
}

/// Says that `step` begins, to whoever follows this task's command.
pub(crate) fn report(step: impl Into<String>) {
    let _ = PROGRESS.try_with(|tx| tx.send(step.into()));
}

/// Runs `fut` with its reported steps sent to `tx`.
pub async fn reporting_to<F: std::future::Future>(tx: UnboundedSender<String>, fut: F) -> F::Output {
    PROGRESS.scope(tx, fut).await
}
