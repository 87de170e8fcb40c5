//! `[[feeds]]`: the consumers of the store, one settings type per kind.

use std::collections::{BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use super::entries::{self, Entry};
use super::validate::Problems;
use super::{CAPPED_COLLECTIONS, ChangeOp, FeedKind};

/// One consumer of the store: a name and what it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedConfig {
    /// Unique name, `[a-z0-9_-]+`; names its checkpoint and its metrics.
    pub name: String,
    /// How it reads, with the settings of that kind.
    pub kind: FeedKindConfig,
}

/// How a feed reads the store, with the settings of each kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedKindConfig {
    /// A tailable cursor on a capped collection.
    Tailable(TailableFeedConfig),
    /// A change stream on changefeed-backed collections.
    Changes(ChangeFeedConfig),
    /// The op-log watcher: the same changes, read at the log level.
    Oplog(ChangeFeedConfig),
}

/// A `tailable` feed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailableFeedConfig {
    /// The capped collection followed: events or dead_letters.
    #[serde(default = "default_tailable_collection")]
    pub collection: String,
}

/// A `changes` or `oplog` feed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeFeedConfig {
    /// The collections watched.
    #[serde(default = "default_change_collections")]
    pub collections: Vec<String>,
    /// Which changes are delivered; absent = all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<ChangeFilterConfig>,
}

/// Selects the changes a change/oplog feed delivers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChangeFilterConfig {
    /// Kinds of change delivered (insert, update, replace, delete); empty = all.
    #[serde(default)]
    pub ops: Vec<ChangeOp>,
    /// Only changes of documents whose key starts with this; absent = all keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
}

fn default_tailable_collection() -> String {
    "events".to_owned()
}

fn default_change_collections() -> Vec<String> {
    vec!["rollups".to_owned()]
}

/// The default feeds: a tailable cursor on `events`, and a change feed on the per-source
/// summaries of `rollups` (one update per event).
pub fn default_feeds() -> Vec<FeedConfig> {
    vec![
        FeedConfig::tailable("tail", "events"),
        FeedConfig {
            name: "changes".into(),
            kind: FeedKindConfig::Changes(ChangeFeedConfig {
                collections: default_change_collections(),
                filter: Some(ChangeFilterConfig {
                    ops: vec![ChangeOp::Insert, ChangeOp::Update],
                    key_prefix: Some("source:".to_owned()),
                }),
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

    /// The kind, without its settings.
    pub fn kind(&self) -> FeedKind {
        match &self.kind {
            FeedKindConfig::Tailable(_) => FeedKind::Tailable,
            FeedKindConfig::Changes(_) => FeedKind::Changes,
            FeedKindConfig::Oplog(_) => FeedKind::Oplog,
        }
    }

    /// Checks what serde cannot: allowed collections, duplicates, empty prefixes. Problems
    /// are keyed under `at` (`feeds[1]`).
    pub fn validate(&self, at: &str, p: &mut Problems) {
        match &self.kind {
            FeedKindConfig::Tailable(t) => {
                if !CAPPED_COLLECTIONS.contains(&t.collection.as_str()) {
                    p.push(
                        format!("{at}.collection"),
                        format!(
                            "{:?} is not a capped collection (allowed: {})",
                            t.collection,
                            CAPPED_COLLECTIONS.join(", ")
                        ),
                    );
                }
            }
            FeedKindConfig::Changes(c) | FeedKindConfig::Oplog(c) => c.validate(at, p),
        }
    }
}

impl ChangeFeedConfig {
    fn validate(&self, at: &str, p: &mut Problems) {
        if self.collections.is_empty() {
            p.push(
                format!("{at}.collections"),
                "must name at least one collection (e.g. [\"rollups\"])",
            );
        }
        let mut seen = BTreeSet::new();
        for (j, c) in self.collections.iter().enumerate() {
            let key = format!("{at}.collections[{j}]");
            if c.is_empty() || c.contains(['$', '\0']) {
                p.push(key, format!("{c:?} is not a collection name"));
            } else if !seen.insert(c) {
                p.push(key, format!("{c:?} is listed twice"));
            }
        }
        if let Some(filter) = &self.filter {
            let mut ops = HashSet::new();
            for (j, op) in filter.ops.iter().enumerate() {
                if !ops.insert(op) {
                    p.push(
                        format!("{at}.filter.ops[{j}]"),
                        format!("{:?} is listed twice", op.as_str()),
                    );
                }
            }
            if filter.key_prefix.as_deref() == Some("") {
                p.push(
                    format!("{at}.filter.key_prefix"),
                    "must not be empty (leave it out to match every key)",
                );
            }
        }
    }
}

impl Entry for FeedConfig {
    type Kind = FeedKindConfig;

    fn new(name: String, kind: FeedKindConfig) -> Self {
        FeedConfig { name, kind }
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
