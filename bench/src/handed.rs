//! What a scenario hands to the pipeline: a [`Source`] of records made in advance (the
//! pre-encoded NDJSON lines of `insert`) or on the fly (`catchup`'s load), counted as the
//! pipeline takes them, optionally for a limited time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{BoxStream, StreamExt};
use indicatif::ProgressBar;
use ingest::source::{Raw, Source};

/// The name of the scenarios' source (its events' `_tailrace.source`, its `source:` rollup).
pub const SOURCE: &str = "bench";

/// A source handing over `records` as fast as the pipeline takes them.
pub struct Records {
    records: Box<dyn Iterator<Item = Raw> + Send>,
    time_box: Option<Duration>,
    handed: Arc<AtomicU64>,
    progress: ProgressBar,
    geo: Option<ingest::geo::GeoConfig>,
}

impl Records {
    /// `records`, until they run out or (`time_box`) that long after the first was taken;
    /// `progress` advances as they are taken.
    pub fn new(
        records: impl Iterator<Item = Raw> + Send + 'static,
        time_box: Option<Duration>,
        progress: ProgressBar,
    ) -> Records {
        Records {
            records: Box::new(records),
            time_box,
            handed: Arc::new(AtomicU64::new(0)),
            progress,
            geo: None,
        }
    }

    /// Places its events by `geo`, as the pipeline places a configured source's.
    pub fn placed(mut self, geo: ingest::geo::GeoConfig) -> Records {
        self.geo = Some(geo);
        self
    }

    /// How many records the pipeline has taken, live.
    pub fn handed(&self) -> Arc<AtomicU64> {
        self.handed.clone()
    }
}

impl Source for Records {
    fn name(&self) -> &str {
        SOURCE
    }

    fn kind(&self) -> &str {
        "bench"
    }

    fn geo(&self) -> Option<ingest::geo::GeoConfig> {
        self.geo.clone()
    }

    fn records(self: Box<Self>) -> BoxStream<'static, Raw> {
        let Records {
            records,
            time_box,
            handed,
            progress,
            geo: _,
        } = *self;
        let mut started: Option<Instant> = None;
        futures::stream::iter(records)
            .take_while(move |_| {
                let t = *started.get_or_insert_with(Instant::now);
                futures::future::ready(time_box.is_none_or(|limit| t.elapsed() < limit))
            })
            .inspect(move |_| {
                let n = handed.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(1024) {
                    progress.set_position(n);
                }
            })
            .boxed()
    }
}
