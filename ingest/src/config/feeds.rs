//! `[[feeds]]`: the consumers of the store. Each kind's settings, rules and reading live in
//! its own file of the feeds crate (`feeds::kind`); this file holds the table (a name and a
//! kind) and the default list.

use serde::Serialize;

use super::entries::{self, Entry};
use super::problems::Problems;
use super::{CAPPED_COLLECTIONS, ChangeOp};
use ::feeds::kind::FeedKindConfig;
use ::feeds::kind::changes::{ChangeFeedConfig, ChangeFilterConfig};
use ::feeds::kind::tailable::TailableFeedConfig;

/// One consumer of the store: a name and what it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedConfig {
    /// Unique name, `[a-z0-9_-]+`; names its checkpoint and its metrics.
    pub name: String,
    /// How it reads, with the settings of that kind.
    pub kind: FeedKindConfig,
}

/// The default feeds: a tailable cursor on `events`, and a change feed on the per-source
/// summaries of `rollups` (one update per event).
pub fn default_feeds() -> Vec<FeedConfig> {
    vec![
        FeedConfig::tailable("tail", "events"),
        FeedConfig {
            name: "changes".into(),
            kind: FeedKindConfig::Changes(ChangeFeedConfig {
                filter: Some(ChangeFilterConfig {
                    ops: vec![ChangeOp::Insert, ChangeOp::Update],
                    key_prefix: Some("source:".to_owned()),
                }),
                ..ChangeFeedConfig::default()
            }),
        },
    ]
}

impl FeedConfig {
    /// A tailable feed of `collection`.
    pub fn tailable(name: impl Into<String>, collection: impl Into<String>) -> Self {
        FeedConfig {
            name: name.into(),
            kind: FeedKindConfig::Tailable(TailableFeedConfig {
                collection: collection.into(),
            }),
        }
    }

    /// The kind's name (`tailable`, `changes`, `oplog`).
    pub fn kind(&self) -> &'static str {
        self.kind.settings().kind()
    }

    /// Checks what serde cannot (the kind's own rules). Problems are keyed under `at`
    /// (`feeds[1]`).
    pub fn validate(&self, at: &str, p: &mut Problems) {
        for (key, message) in self.kind.settings().validate(&CAPPED_COLLECTIONS) {
            p.push(format!("{at}.{key}"), message);
        }
    }
}

impl Entry for FeedConfig {
    type Kind = FeedKindConfig;
    type Shared = entries::NoShared;
    const SHARED: &'static [&'static str] = &[];

    fn new(name: String, kind: FeedKindConfig, _: entries::NoShared) -> Self {
        FeedConfig { name, kind }
    }

    fn shared(&self) -> entries::NoShared {
        entries::NoShared {}
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &FeedKindConfig {
        &self.kind
    }
}

impl Serialize for FeedConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        entries::serialize(self, s)
    }
}
