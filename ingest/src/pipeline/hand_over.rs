//! The hop from a source to the ingester: one task per source pulls its records and hands
//! them over through the bounded queue, so a source faster than the store waits.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ingester::{Handed, IngestStats};
use crate::source::Source;
use crate::telemetry as t;

/// Spawns the task that reads `source` until it ends or `stop` is cancelled.
pub(super) fn spawn(
    source: Box<dyn Source>,
    tx: mpsc::Sender<Handed>,
    stats: Arc<IngestStats>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let name: Arc<str> = Arc::from(source.name());
    let read = t::register_source(&name);
    tokio::spawn(async move {
        let mut records = source.positioned();
        let mut last_us = 0i64;
        loop {
            let record = tokio::select! {
                _ = stop.cancelled() => break,
                r = records.next() => match r {
                    Some(record) => record,
                    None => {
                        tracing::info!(source = %name, "source ended");
                        break;
                    }
                },
            };
            read.increment(1);
            // Strictly increasing per source, so "the later of two records" is well defined
            // (recovery compares an event's and a dead letter's hand-over times).
            last_us = store::clock::now_us().max(last_us + 1);
            let handed = Handed {
                source: name.clone(),
                raw: record.raw,
                received_us: last_us,
                position: record.position,
            };
            stats.queue_depth.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                _ = stop.cancelled() => break,
                sent = tx.send(handed) => if sent.is_err() { break },
            }
        }
    })
}
