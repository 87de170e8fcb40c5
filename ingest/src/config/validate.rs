//! The rules serde cannot express: ranges, combinations, unique names. Each source kind and
//! feed kind checks its own settings ([`crate::source::SourceSettings::validate`],
//! [`super::FeedConfig::validate`]); this file checks the rest and collects everything.

use std::collections::BTreeSet;

use super::problems::Problems;
use super::{Config, ConfigError, FeedConfig, SourceConfig};

/// One problem of a configuration.
pub(super) enum Problem {
    /// A broken rule at `key`.
    Rule { key: String, message: String },
    /// A `[[sources]]` / `[[feeds]]` table that could not be read, already one line.
    Unreadable(String),
}

/// A `[[sources]]` / `[[feeds]]` table as read: the entry, or why it could not be read.
pub(super) enum Loaded<T> {
    Ok(T),
    Unreadable(String),
}

impl<T> Loaded<T> {
    pub(super) fn as_ref(&self) -> Loaded<&T> {
        match self {
            Loaded::Ok(t) => Loaded::Ok(t),
            Loaded::Unreadable(e) => Loaded::Unreadable(e.clone()),
        }
    }

    pub(super) fn ok(self) -> Option<T> {
        match self {
            Loaded::Ok(t) => Some(t),
            Loaded::Unreadable(_) => None,
        }
    }
}

/// Every problem, in the order of the file: store, ingest, stats, sources, feeds.
pub(super) fn problems<'a>(
    c: &Config,
    sources: impl Iterator<Item = Loaded<&'a SourceConfig>>,
    feeds: impl Iterator<Item = Loaded<&'a FeedConfig>>,
) -> Vec<Problem> {
    let mut p = Problems::default();
    validate_store(c, &mut p);
    validate_ingest(c, &mut p);
    p.at_least("http.max_streams", c.http.max_streams as u64, 1);
    p.at_least(
        "http.stream_stall_timeout_ms",
        c.http.stream_stall_timeout_ms,
        1000,
    );
    p.at_least(
        "http.query_max_bytes",
        c.http.query_max_bytes as u64,
        1 << 20,
    );
    for (field, message) in c.stats.problems() {
        p.push(format!("stats.{field}"), message);
    }
    let mut out: Vec<Problem> = drain(&mut p);
    let mut names = BTreeSet::new();
    for (i, source) in sources.enumerate() {
        match source {
            Loaded::Ok(s) => {
                let at = format!("sources[{i}]");
                p.name(&format!("{at}.name"), &s.name, &mut names);
                s.settings().validate(&at, &mut p);
                if let Some(geo) = &s.geo {
                    geo.validate(&format!("{at}.geo"), &mut p);
                }
                out.extend(drain(&mut p));
            }
            Loaded::Unreadable(line) => out.push(Problem::Unreadable(line)),
        }
    }
    let mut names = BTreeSet::new();
    for (i, feed) in feeds.enumerate() {
        match feed {
            Loaded::Ok(f) => {
                let at = format!("feeds[{i}]");
                p.name(&format!("{at}.name"), &f.name, &mut names);
                f.validate(&at, &mut p);
                out.extend(drain(&mut p));
            }
            Loaded::Unreadable(line) => out.push(Problem::Unreadable(line)),
        }
    }
    out
}

/// The rules broken so far, as [`Problem::Rule`]s (and none left in `p`).
fn drain(p: &mut Problems) -> Vec<Problem> {
    p.take()
        .into_iter()
        .map(|(key, message)| Problem::Rule { key, message })
        .collect()
}

impl Config {
    /// Checks every rule and reports all broken ones at once, each as `key: message`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let found = problems(
            self,
            self.sources.iter().map(Loaded::Ok),
            self.feeds.iter().map(Loaded::Ok),
        );
        if found.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            problems: found
                .into_iter()
                .map(|p| match p {
                    Problem::Rule { key, message } => format!("{key}: {message}"),
                    Problem::Unreadable(line) => line,
                })
                .collect(),
        })
    }
}

fn validate_store(c: &Config, p: &mut Problems) {
    let s = &c.store;
    for (key, message) in s.engine.settings().problems() {
        p.push(format!("store.{key}"), message);
    }
    if s.database.is_empty() {
        p.push("store.database", "must not be empty");
    } else if s.database.len() >= 64 || s.database.chars().any(|c| "/\\. \"$\0".contains(c)) {
        p.push(
            "store.database",
            format!(
                "{:?} is not a database name (under 64 bytes, none of / \\ . space \" $)",
                s.database
            ),
        );
    }
    p.at_least("store.events.max_docs", s.events.max_docs, 1);
    p.at_least("store.events.max_bytes", s.events.max_bytes, 4096);
    p.field_paths("store.events.indexes", &s.events.indexes);
    p.at_least("store.dead_letters.max_docs", s.dead_letters.max_docs, 1);
    p.at_least(
        "store.dead_letters.max_bytes",
        s.dead_letters.max_bytes,
        4096,
    );
}

fn validate_ingest(c: &Config, p: &mut Problems) {
    let i = &c.ingest;
    if !(1..=10_000).contains(&i.batch_max_events) {
        p.push(
            "ingest.batch_max_events",
            format!("must be in 1..=10000 (got {})", i.batch_max_events),
        );
    }
    if i.queue_capacity < i.batch_max_events {
        p.push(
            "ingest.queue_capacity",
            format!(
                "must be >= ingest.batch_max_events = {} (got {})",
                i.batch_max_events, i.queue_capacity
            ),
        );
    }
    p.at_least("ingest.max_event_bytes", i.max_event_bytes, 64);
    p.at_least(
        "ingest.stop_flush_timeout_secs",
        i.stop_flush_timeout_secs,
        1,
    );
    p.at_least(
        "ingest.stop_checkpoint_timeout_secs",
        i.stop_checkpoint_timeout_secs,
        1,
    );
    if i.max_event_bytes > c.store.events.max_bytes {
        p.push(
            "ingest.max_event_bytes",
            format!(
                "must be <= store.events.max_bytes = {} (got {}): a larger event could never be stored",
                c.store.events.max_bytes, i.max_event_bytes
            ),
        );
    }
    p.field_paths("ingest.rollup_fields", &i.rollup_fields);
    for (j, field) in i.rollup_fields.iter().enumerate() {
        if field == "source" {
            p.push(
                format!("ingest.rollup_fields[{j}]"),
                "\"source\" would count its values under keys source:<value>, which are the per-source summaries' keys; count another field",
            );
        }
    }
    // The `source:<name>` rollup of each source is updated once per event with `$inc count`
    // and `$set` of the stamp and of every field the statistics read: a field the update also
    // writes (or one inside another) would make every later update of it fail.
    let own = [
        ("count", "the rollup's event counter"),
        ("_id", "the rollup's key"),
        (store::STAMP_FIELD, "the ingest stamp"),
    ];
    let stats = ::feeds::stats::fields_read(&c.stats);
    for (key, path) in &stats {
        for (field, what) in own {
            if overlaps(path, field) {
                p.push(
                    format!("stats.{key}"),
                    format!(
                        "{path:?} collides with `{field}`, {what}, in each source:<name> rollup (both are written on every event); choose another field"
                    ),
                );
            }
        }
    }
    for (i, (key, path)) in stats.iter().enumerate() {
        for (earlier_key, earlier) in &stats[..i] {
            if overlaps(path, earlier) {
                p.push(
                    format!("stats.{key}"),
                    format!(
                        "{path:?} and stats.{earlier_key} {earlier:?} nest one inside the other: both are copied into each source:<name> rollup, so one would overwrite the other's parent; choose fields side by side"
                    ),
                );
            }
        }
    }
}

/// Whether one dotted path is the other or lies inside it (`a` and `a.b`).
fn overlaps(a: &str, b: &str) -> bool {
    let inside = |inner: &str, outer: &str| {
        inner == outer
            || (inner.starts_with(outer) && inner.as_bytes().get(outer.len()) == Some(&b'.'))
    };
    inside(a, b) || inside(b, a)
}
