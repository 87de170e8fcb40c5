//! Rollup retention: per-value counters of keys not counted for `ingest.rollup_idle_ttl_secs`
//! are removed, so `rollups` does not grow without bound on a long-tail stream (millions of
//! distinct hashtags a day). Each removal is published as a delete, so change feeds see it.
//! The `source:<name>` summaries are not per-value counters and are kept.

use std::sync::Arc;
use std::time::Duration;

use store::clock::now_us;
use store::{Durability, Keyed};
use tokio_util::sync::CancellationToken;

use crate::telemetry as t;

/// Keys removed per store request (a bounded transaction; repeated while there are more).
const BATCH: usize = 10_000;

/// Removes idle counters of `fields` every so often, until `stop`. `idle` of zero keeps
/// everything (then this returns at once).
pub async fn sweep_rollups(
    rollups: Arc<dyn Keyed>,
    fields: Vec<String>,
    idle: Duration,
    durability: Durability,
    stop: CancellationToken,
) {
    if idle.is_zero() || fields.is_empty() {
        return;
    }
    // Often enough that a key outlives its idle time by at most a tenth of it.
    let every = (idle / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let before = now_us() - i64::try_from(idle.as_micros()).unwrap_or(i64::MAX);
        for field in &fields {
            let prefix = format!("{field}:");
            loop {
                match rollups.expire(&prefix, before, BATCH, durability).await {
                    Ok(n) => {
                        t::rollups_expired(field, n);
                        if (n as usize) < BATCH || stop.is_cancelled() {
                            break;
                        }
                    }
                    Err(e) => {
                        t::Problem {
                            component: "retention",
                            error_type: "store_write",
                            detail: &format!("could not remove idle rollup keys of {field} ({e}); trying again later"),
                        }
                        .warn();
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use futures::StreamExt;
    use store::embedded::{EmbeddedOptions, EmbeddedStore};
    use store::{ChangeFilter, ChangeOp, ChangeStart, KeyUpdate, Store, Update};

    use super::*;

    #[tokio::test]
    async fn idle_counters_go_recent_ones_and_summaries_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let rollups = store.keyed("rollups").await.unwrap();
        let d = Durability::Acknowledged;
        let up = |k: &str| KeyUpdate::new(k, Update::inc("count", 1));
        rollups
            .update(vec![up("hashtags:old"), up("lang:old"), up("source:s")], d)
            .await
            .unwrap();
        // Real time must pass for a key to become idle: the store keeps real write times.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        rollups.update(vec![up("hashtags:new")], d).await.unwrap();
        let mut changes = rollups.changes(ChangeFilter::default(), ChangeStart::Now);
        let stop = CancellationToken::new();
        let task = tokio::spawn(sweep_rollups(
            rollups.clone(),
            vec!["hashtags".into(), "lang".into()],
            Duration::from_secs(1),
            d,
            stop.clone(),
        ));
        let mut deleted = Vec::new();
        while deleted.len() < 2 {
            let c = tokio::time::timeout(Duration::from_secs(10), changes.next())
                .await
                .expect("the idle keys are removed within a sweep")
                .unwrap()
                .unwrap();
            assert_eq!(c.op, ChangeOp::Delete, "{c:?}");
            deleted.push(c.key);
        }
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        deleted.sort();
        assert_eq!(deleted, ["hashtags:old", "lang:old"]);
        let left: Vec<String> = rollups
            .scan("")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(
            left,
            ["hashtags:new", "source:s"],
            "what was counted lately, and the summary whatever its age"
        );
    }
}
