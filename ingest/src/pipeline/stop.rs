//! The stop, in the one order that loses nothing acknowledged: the sources stop; the
//! ingester writes what is queued (bounded by `ingest.stop_flush_timeout_secs`); every feed
//! drains what is committed and checkpoints, all at once, under one deadline
//! (`ingest.stop_checkpoint_timeout_secs`); the background writers end; the store closes.
//! Each step that fails says what it cost.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::{JoinError, JoinHandle};

use crate::ingester::IngestStats;

/// Waits for the source tasks (already told to stop).
pub(super) async fn sources(tasks: Vec<(String, JoinHandle<()>)>, problems: &mut Vec<String>) {
    for (name, task) in tasks {
        if let Err(e) = task.await {
            problems.push(task_failed(&format!("source {name}"), &e));
        }
    }
}

/// Waits up to `deadline` for the ingester to write what is queued (its senders are gone);
/// aborts it past the deadline and says what was lost.
pub(super) async fn flush(
    mut ingester: JoinHandle<()>,
    deadline: Duration,
    stats: &Arc<IngestStats>,
    problems: &mut Vec<String>,
) {
    match tokio::time::timeout(deadline, &mut ingester).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(task_failed("the ingester", &e)),
        Err(_) => {
            ingester.abort();
            let queued = stats.queue_depth.load(Ordering::Relaxed).max(0);
            problems.push(format!(
                "the ingester did not flush within {} s (ingest.stop_flush_timeout_secs): the batch being written and {queued} queued records are lost (not acknowledged to any source)",
                deadline.as_secs()
            ));
        }
    }
}

/// Waits for every feed (already told to stop) to drain and checkpoint, all at once, within
/// `within`; aborts the ones still running then. Returns what went wrong.
pub(super) async fn feeds(tasks: Vec<(String, JoinHandle<()>)>, within: Duration) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + within;
    let waits = tasks.into_iter().map(|(name, mut task)| async move {
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(task_failed(&format!("feed {name}"), &e)),
            Err(_) => {
                task.abort();
                Some(format!(
                    "feed {name} did not checkpoint within {} s (ingest.stop_checkpoint_timeout_secs) and was stopped: it resumes from its previous checkpoint (events since are processed again, not lost)",
                    within.as_secs()
                ))
            }
        }
    });
    futures::future::join_all(waits)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// A task that ended by panicking (or was cancelled), in words.
pub(super) fn task_failed(what: &str, e: &JoinError) -> String {
    if e.is_panic() {
        format!("{what} panicked (see the panic message above)")
    } else {
        format!("{what} was cancelled")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds stop together under one deadline: a panicked feed and one that never stops are
    /// both reported, the stuck one is aborted, and the whole wait takes one deadline, not one
    /// per feed.
    #[tokio::test(start_paused = true)]
    async fn feeds_stop_together_and_failures_are_named() {
        let quick = tokio::spawn(async {});
        let panics = tokio::spawn(async { panic!("boom") });
        let stuck = tokio::spawn(std::future::pending::<()>());
        let stuck2 = tokio::spawn(std::future::pending::<()>());
        let started = tokio::time::Instant::now();
        let within = Duration::from_secs(5);
        let problems = feeds(
            vec![
                ("quick".into(), quick),
                ("panics".into(), panics),
                ("stuck".into(), stuck),
                ("stuck2".into(), stuck2),
            ],
            within,
        )
        .await;
        assert_eq!(
            started.elapsed(),
            within,
            "two stuck feeds cost one deadline, not two"
        );
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].starts_with("feed panics panicked"),
            "{problems:#?}"
        );
        assert!(
            problems[1].starts_with("feed stuck did not checkpoint within 5 s"),
            "{problems:#?}"
        );
        assert!(
            problems[2].starts_with("feed stuck2 did not checkpoint"),
            "{problems:#?}"
        );
    }
}
