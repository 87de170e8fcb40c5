//! The order in which a batch's events and dead letters are written, so that a crash at any
//! moment leaves, of each source, a *prefix* of what it handed over.
//!
//! Why it matters: a restarted source resumes after the position stored with its newest stored
//! record, event or dead letter. Events and dead letters live in two collections, written by
//! two appends; if a dead letter were committed after events the source handed over *after*
//! it, a crash between the two commits would leave the dead letter out while the newer events
//! are in, and the restart would resume past the bad record: it would be lost for good (the
//! torture test, `tailrace/tests/torture.rs`, found exactly this). The other way round, a dead
//! letter committed before older events, would lose those events.
//!
//! So a batch is written in stages, in hand-over order: the events up to the first rejected
//! record, then the dead letters up to the next event, then the next events, and so on. A
//! batch without rejects is one stage (one append), as is a batch whose rejects all come after
//! its last event; only a reject followed by an event costs another commit.

use std::ops::Range;

/// One stage of a batch: these events, then these dead letters (indices into the batch's
/// events and dead letters, each in hand-over order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Stage {
    pub events: Range<usize>,
    pub letters: Range<usize>,
}

/// The stages of a batch of `events` events and dead letters whose `letters_at[i]` is the
/// number of events handed over before dead letter `i` (non-decreasing).
pub(super) fn stages(events: usize, letters_at: &[usize]) -> Vec<Stage> {
    let mut out = Vec::new();
    let (mut event, mut letter) = (0, 0);
    while event < events || letter < letters_at.len() {
        // The events handed over before the next dead letter (all the rest when none).
        let events_end = letters_at
            .get(letter)
            .copied()
            .unwrap_or(events)
            .min(events);
        // The dead letters handed over before the event after those.
        let letters_end = letter
            + letters_at[letter..]
                .iter()
                .take_while(|at| **at <= events_end)
                .count();
        out.push(Stage {
            events: event..events_end,
            letters: letter..letters_end,
        });
        (event, letter) = (events_end, letters_end);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use serde_json::{Value, json};
    use store::embedded::{EmbeddedOptions, EmbeddedStore};
    use store::{
        Bounds, Capped, CappedSpec, Document, Durability, Position, Record, RecordStream, Start,
        Store, Usage,
    };
    use tokio::sync::{Notify, mpsc};

    use super::*;
    use crate::ingester::{Handed, IngestOptions, IngestStats, Ingester, StoreHealth};
    use crate::source::Raw;

    fn stage(events: Range<usize>, letters: Range<usize>) -> Stage {
        Stage { events, letters }
    }

    #[test]
    fn stages_follow_the_hand_over_order() {
        // (events, letters_at, expected stages), by hand.
        let table: Vec<(usize, Vec<usize>, Vec<Stage>)> = vec![
            (0, vec![], vec![]),
            (5, vec![], vec![stage(0..5, 0..0)]),
            (0, vec![0, 0], vec![stage(0..0, 0..2)]),
            // Rejects after the last event: still one stage.
            (3, vec![3, 3], vec![stage(0..3, 0..2)]),
            // A reject first: its dead letter before any event.
            (2, vec![0], vec![stage(0..0, 0..1), stage(0..2, 1..1)]),
            // E E D D E D E E: three stages.
            (
                5,
                vec![2, 2, 3],
                vec![stage(0..2, 0..2), stage(2..3, 2..3), stage(3..5, 3..3)],
            ),
            // E D E D E.
            (
                3,
                vec![1, 2],
                vec![stage(0..1, 0..1), stage(1..2, 1..2), stage(2..3, 2..2)],
            ),
        ];
        for (events, letters_at, expected) in table {
            let seen = stages(events, &letters_at);
            assert_eq!(
                seen, expected,
                "{events} events, dead letters after {letters_at:?}"
            );
            // Every event and every dead letter exactly once, in order.
            let flat_events: Vec<usize> = seen.iter().flat_map(|s| s.events.clone()).collect();
            let flat_letters: Vec<usize> = seen.iter().flat_map(|s| s.letters.clone()).collect();
            assert_eq!(flat_events, (0..events).collect::<Vec<_>>());
            assert_eq!(flat_letters, (0..letters_at.len()).collect::<Vec<_>>());
        }
    }

    /// The real dead-letter collection, except that its appends never complete: the process
    /// "dies" before the dead letters commit. (A `SIGKILL` cannot be aimed at that moment; the
    /// torture test hits it by chance, this test every time.)
    struct NeverCommits {
        inner: Arc<dyn Capped>,
        reached: Arc<Notify>,
    }

    #[async_trait]
    impl Capped for NeverCommits {
        fn name(&self) -> &str {
            self.inner.name()
        }
        async fn append(&self, _: Vec<Document>, _: Durability) -> store::Result<Vec<Position>> {
            self.reached.notify_one();
            std::future::pending().await
        }
        fn tail(&self, start: Start) -> RecordStream {
            self.inner.tail(start)
        }
        async fn newest_matching(
            &self,
            filter: &store::Filter,
            limit: usize,
        ) -> store::Result<store::NewestMatching> {
            self.inner.newest_matching(filter, limit).await
        }
        async fn get(&self, position: Position) -> store::Result<Option<Record>> {
            self.inner.get(position).await
        }
        async fn latest(
            &self,
            field: &str,
            value: &Value,
            limit: usize,
        ) -> store::Result<Vec<Record>> {
            self.inner.latest(field, value, limit).await
        }
        async fn bounds(&self) -> store::Result<Option<Bounds>> {
            self.inner.bounds().await
        }
        async fn usage(&self) -> store::Result<Usage> {
            self.inner.usage().await
        }
    }

    /// Lines 1..=5 of a file, 2 and 4 not JSON; each record carries the offset after it.
    fn file_lines(after: u64) -> Vec<Handed> {
        (after + 1..=5)
            .map(|line| {
                let bytes = if line % 2 == 0 {
                    format!(r#"{{"line":{line},"cut off"#)
                } else {
                    format!(r#"{{"line":{line},"text":"ligne {line} 🦀"}}"#)
                };
                Handed {
                    source: Arc::from("replay"),
                    raw: Raw::Bytes(bytes.into_bytes()),
                    received_us: 1_700_000_000_000_000 + line as i64,
                    position: Some(json!({ "offset": line * 100 })),
                }
            })
            .collect()
    }

    fn ingester(
        events: &Arc<dyn Capped>,
        dead_letters: Arc<dyn Capped>,
        rollups: &Arc<dyn store::Keyed>,
    ) -> Ingester {
        Ingester {
            events: events.clone(),
            dead_letters,
            rollups: rollups.clone(),
            options: IngestOptions {
                batch_max_events: 256,
                batch_max_wait: Duration::from_millis(50),
                max_event_bytes: 65_536,
                rollup_fields: vec![],
                summary_fields: vec!["retweet_count".into(), "hashtags".into()],
                durability: Durability::Acknowledged,
                geo: Default::default(),
            },
            engine: "embedded",
            stats: Arc::new(IngestStats::default()),
            health: Arc::new(StoreHealth::new()),
            observer: None,
        }
    }

    /// `line` of every document of `coll`, in position order.
    async fn lines(coll: &Arc<dyn Capped>, field: &str) -> Vec<u64> {
        let Some(bounds) = coll.bounds().await.unwrap() else {
            return vec![];
        };
        let mut tail = coll.tail(Start::Oldest);
        let mut out = Vec::new();
        loop {
            let r =
                tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut tail))
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
            let line = match field {
                "line" => r.doc["line"].as_u64(),
                // A dead letter keeps the raw line: `{"line":N,...`.
                _ => r.doc["raw"].as_str().and_then(|raw| {
                    raw.strip_prefix(r#"{"line":"#)?
                        .split(',')
                        .next()?
                        .parse()
                        .ok()
                }),
            };
            out.push(line.unwrap());
            if r.position >= bounds.newest {
                return out;
            }
        }
    }

    /// Two sources hand over concurrently, so one's record may reach the queue after a later
    /// record of the other: the stored received times still only grow along the positions (a
    /// time range is a range of positions), and each source's still strictly.
    #[tokio::test]
    async fn stored_received_times_follow_the_store_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let spec = CappedSpec {
            max_docs: 1000,
            max_bytes: 1 << 24,
            indexes: vec![store::STAMP_SOURCE_PATH.into()],
        };
        let events = store.capped("events", &spec).await.unwrap();
        let letters = store.capped("dead_letters", &spec).await.unwrap();
        let rollups = store.keyed("rollups").await.unwrap();
        let (tx, rx) = mpsc::channel(64);
        let base = 1_700_000_000_000_000_i64;
        // a: 0, 2000, 4000, ... b: 1000, 3000, ... but every b reaches the queue first.
        for i in 0..20_i64 {
            for (source, at) in [("b", base + 2000 * i + 1000), ("a", base + 2000 * i)] {
                tx.send(Handed {
                    source: Arc::from(source),
                    raw: Raw::Bytes(format!(r#"{{"i":{i}}}"#).into_bytes()),
                    received_us: at,
                    position: None,
                })
                .await
                .unwrap();
            }
        }
        drop(tx);
        ingester(&events, letters, &rollups).run(rx).await;
        let mut tail = events.tail(Start::Oldest);
        let (mut last, mut by_source) = (i64::MIN, std::collections::HashMap::new());
        for _ in 0..40 {
            let r = futures::StreamExt::next(&mut tail).await.unwrap().unwrap();
            let stamp = store::Stamp::of(&r.doc).unwrap();
            assert!(
                stamp.received_us >= last,
                "{} after {last}",
                stamp.received_us
            );
            last = stamp.received_us;
            let prev = by_source.insert(stamp.source.clone(), stamp.received_us);
            assert!(
                prev < Some(stamp.received_us),
                "{} of {}",
                stamp.received_us,
                stamp.source
            );
            let ms = store::date::millis(&r.doc["_tailrace"]["received"]).unwrap();
            assert_eq!(ms, stamp.received_us.div_euclid(1000));
        }
        store.close().await.unwrap();
    }

    /// Before: events and dead letters were appended concurrently, so the events of lines 3 and
    /// 5 could commit while the dead letter of line 2 did not; the restart resumed after line 5
    /// and lines 2 and 4 were never stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_before_a_dead_letter_commits_loses_no_line() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let spec = |index: &str| CappedSpec {
            max_docs: 1000,
            max_bytes: 1 << 24,
            indexes: vec![index.into()],
        };
        let events = store
            .capped("events", &spec(store::STAMP_SOURCE_PATH))
            .await
            .unwrap();
        let letters = store.capped("dead_letters", &spec("source")).await.unwrap();
        let rollups = store.keyed("rollups").await.unwrap();

        // The first run dies before its first dead letter commits.
        let reached = Arc::new(Notify::new());
        let held = Arc::new(NeverCommits {
            inner: letters.clone(),
            reached: reached.clone(),
        });
        let (tx, rx) = mpsc::channel(16);
        for h in file_lines(0) {
            tx.send(h).await.unwrap();
        }
        let run = tokio::spawn(ingester(&events, held, &rollups).run(rx));
        tokio::time::timeout(Duration::from_secs(30), reached.notified())
            .await
            .expect("the ingester writes the dead letter of line 2");
        // The embedded engine has one writer that commits in queue order: once a write queued
        // now is done, so is every write the ingester had queued before.
        tokio::time::timeout(
            Duration::from_secs(30),
            store.save_checkpoint("barrier", json!({}), Durability::Acknowledged),
        )
        .await
        .unwrap()
        .unwrap();
        run.abort();
        assert_eq!(
            lines(&events, "line").await,
            [1],
            "a crash before the dead letter of line 2 commits leaves the lines before it, not the ones after"
        );

        // The restart resumes after the newest stored record and stores the rest once.
        let restarted = ingester(&events, letters.clone(), &rollups);
        let position = restarted.stored_position("replay").await.unwrap();
        assert_eq!(
            position,
            Some(json!({"offset": 100})),
            "resumes after line 1"
        );
        let (tx, rx) = mpsc::channel(16);
        for h in file_lines(1) {
            tx.send(h).await.unwrap();
        }
        drop(tx);
        tokio::time::timeout(Duration::from_secs(30), restarted.run(rx))
            .await
            .unwrap();
        assert_eq!(lines(&events, "line").await, [1, 3, 5], "every event once");
        assert_eq!(
            lines(&letters, "raw").await,
            [2, 4],
            "every dead letter once"
        );
    }

    /// Before: a dead-letters collection opened without the `source` index (as a library user
    /// may) made reading a source's last sequence number fail, and the ingester retried it
    /// forever without storing an event.
    #[tokio::test]
    async fn dead_letters_without_the_source_index_do_not_stop_ingestion() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let spec = |indexes: &[&str]| CappedSpec {
            max_docs: 1000,
            max_bytes: 1 << 24,
            indexes: indexes.iter().map(|i| i.to_string()).collect(),
        };
        let events = store
            .capped("events", &spec(&[store::STAMP_SOURCE_PATH]))
            .await
            .unwrap();
        let letters = store.capped("dead_letters", &spec(&[])).await.unwrap();
        let rollups = store.keyed("rollups").await.unwrap();
        let (tx, rx) = mpsc::channel(16);
        for h in file_lines(0) {
            tx.send(h).await.unwrap();
        }
        drop(tx);
        tokio::time::timeout(
            Duration::from_secs(30),
            ingester(&events, letters.clone(), &rollups).run(rx),
        )
        .await
        .expect("the ingester stores the events and ends with its input");
        assert_eq!(lines(&events, "line").await, [1, 3, 5]);
        assert_eq!(lines(&letters, "raw").await, [2, 4]);
    }
}
