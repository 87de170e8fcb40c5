//! What a pipeline is built from, read from the configuration: the store engine
//! ([`open_store`]), its collections ([`Collections`]) and the ingester's options.

use std::sync::Arc;
use std::time::Duration;

use store::{Capped, CappedSpec, Keyed, OpenWith, STAMP_SOURCE_PATH, Store, StoreError};

use crate::config::Config;
use crate::ingester::IngestOptions;
use crate::source;

/// What can stop a pipeline from being built or started.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The store could not be opened or prepared.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A source could not be built.
    #[error(transparent)]
    Source(#[from] source::SourceError),
    /// A feed could not start.
    #[error(transparent)]
    Feed(#[from] feeds::FeedError),
    /// A feed's settings could not be turned into what it reads.
    #[error("feed {feed}: {message}")]
    FeedKind {
        /// The feed.
        feed: String,
        /// Why.
        message: String,
    },
}

/// The collections a pipeline writes and reads, opened as configured.
#[derive(Clone)]
pub struct Collections {
    /// The capped collection of events.
    pub events: Arc<dyn Capped>,
    /// The capped collection of rejected records.
    pub dead_letters: Arc<dyn Capped>,
    /// The per-key counters and the `source:<name>` summaries.
    pub rollups: Arc<dyn Keyed>,
    /// The feeds' statistics documents and the `ingest` document.
    pub stats: Arc<dyn Keyed>,
    /// The feeds' trend changes (breakouts of the rate from its bands), keyed
    /// `<feed>:rate:<second>`.
    pub trends: Arc<dyn Keyed>,
}

impl Collections {
    /// Opens (creating what is missing) the pipeline's collections in `store`.
    pub async fn open(store: &dyn Store, c: &Config) -> Result<Collections, StoreError> {
        Ok(Collections {
            events: store.capped("events", &events_spec(c)).await?,
            dead_letters: store.capped("dead_letters", &dead_letters_spec(c)).await?,
            rollups: store.keyed("rollups").await?,
            stats: store.keyed("stats").await?,
            trends: store.keyed("trends").await?,
        })
    }

    /// A capped collection a tailable feed can follow, by name.
    pub fn capped(&self, name: &str) -> Option<Arc<dyn Capped>> {
        match name {
            "events" => Some(self.events.clone()),
            "dead_letters" => Some(self.dead_letters.clone()),
            _ => None,
        }
    }
}

/// The ingester's settings from the configuration (the pipeline and `dead-letters replay`
/// must validate and write alike).
pub fn ingest_options(c: &Config) -> IngestOptions {
    IngestOptions {
        batch_max_events: c.ingest.batch_max_events,
        batch_max_wait: Duration::from_millis(c.ingest.batch_max_wait_ms),
        max_event_bytes: c.ingest.max_event_bytes as usize,
        rollup_fields: c.ingest.rollup_fields.clone(),
        summary_fields: feeds::stats::fields_read(&c.stats)
            .into_iter()
            .map(|(_, path)| path)
            .collect(),
        durability: c.store.durability,
        geo: c
            .sources
            .iter()
            .filter_map(|s| Some((s.name.clone(), s.geo_rules()?)))
            .collect(),
    }
}

/// Opens the configured engine.
pub async fn open_store(c: &Config) -> Result<Arc<dyn Store>, PipelineError> {
    let with = OpenWith {
        database: c.store.database.clone(),
        queue_capacity: c.ingest.queue_capacity,
    };
    Ok(c.store.engine.settings().open(&with).await?)
}

/// The capped `dead_letters` collection as configured (indexed by source and reason).
pub fn dead_letters_spec(c: &Config) -> CappedSpec {
    CappedSpec {
        max_docs: c.store.dead_letters.max_docs,
        max_bytes: c.store.dead_letters.max_bytes,
        indexes: vec!["source".into(), "reason".into()],
    }
}

/// The capped `events` collection as configured (bounds and indexes).
pub fn events_spec(c: &Config) -> CappedSpec {
    let mut indexes = c.store.events.indexes.clone();
    if !indexes.iter().any(|i| i == STAMP_SOURCE_PATH) {
        // Needed to recover each source's sequence number at startup.
        indexes.push(STAMP_SOURCE_PATH.into());
    }
    CappedSpec {
        max_docs: c.store.events.max_docs,
        max_bytes: c.store.events.max_bytes,
        indexes,
    }
}

/// Where the data lives, for humans.
pub fn data_location(c: &Config) -> String {
    c.store.engine.settings().location(&c.store.database)
}
