//! `kind = "changes"`: a change stream on changefeed-backed collections — every insert,
//! update, replace and delete, optionally filtered. The reader is shared with
//! [`super::oplog`], which reads the same changes at the log level.

use std::collections::{BTreeSet, HashSet};

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use store::{Capabilities, Capability, ChangeFilter, ChangeOp, ChangeStart, Store};

use super::{CappedByName, FeedSettings};
use crate::feed::{FeedPosition, Item, Lag, Opened, Reader};

/// A `changes` (or `oplog`) feed's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeFeedConfig {
    /// The collections watched.
    #[serde(default = "default_collections")]
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

fn default_collections() -> Vec<String> {
    vec!["rollups".to_owned()]
}

impl Default for ChangeFeedConfig {
    fn default() -> Self {
        ChangeFeedConfig {
            collections: default_collections(),
            filter: None,
        }
    }
}

impl ChangeFeedConfig {
    /// The store's filter for these settings.
    pub fn filter(&self) -> ChangeFilter {
        ChangeFilter {
            collections: self.collections.clone(),
            ops: self
                .filter
                .as_ref()
                .map(|f| f.ops.clone())
                .unwrap_or_default(),
            key_prefix: self.filter.as_ref().and_then(|f| f.key_prefix.clone()),
            ..ChangeFilter::default()
        }
    }

    /// The rules of both change kinds.
    pub(super) fn problems(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if self.collections.is_empty() {
            p.push((
                "collections".into(),
                "must name at least one collection (e.g. [\"rollups\"])".into(),
            ));
        }
        let mut seen = BTreeSet::new();
        for (j, c) in self.collections.iter().enumerate() {
            let key = format!("collections[{j}]");
            if c.is_empty() || c.contains(['$', '\0']) {
                p.push((key, format!("{c:?} is not a collection name")));
            } else if !seen.insert(c) {
                p.push((key, format!("{c:?} is listed twice")));
            }
        }
        if let Some(filter) = &self.filter {
            let mut ops = HashSet::new();
            for (j, op) in filter.ops.iter().enumerate() {
                if !ops.insert(op) {
                    p.push((
                        format!("filter.ops[{j}]"),
                        format!("{:?} is listed twice", op.as_str()),
                    ));
                }
            }
            if filter.key_prefix.as_deref() == Some("") {
                p.push((
                    "filter.key_prefix".into(),
                    "must not be empty (leave it out to match every key)".into(),
                ));
            }
        }
        p
    }
}

impl FeedSettings for ChangeFeedConfig {
    fn kind(&self) -> &'static str {
        "changes"
    }

    fn validate(&self, _capped: &[&str]) -> Vec<(String, String)> {
        self.problems()
    }

    fn reader(&self, _capped: CappedByName<'_>) -> Result<Box<dyn Reader>, String> {
        Ok(Box::new(ChangeReader::changes(self.filter())))
    }
}

/// Reads the changes a filter admits, as a change stream or (`oplog`) at the log level.
pub struct ChangeReader {
    filter: ChangeFilter,
    log_level: bool,
}

impl ChangeReader {
    /// A change stream of what `filter` admits.
    pub fn changes(filter: ChangeFilter) -> ChangeReader {
        ChangeReader {
            filter: post_images(filter),
            log_level: false,
        }
    }

    /// The op-log watcher, reading what `filter` admits.
    pub fn oplog(filter: ChangeFilter) -> ChangeReader {
        ChangeReader {
            filter: post_images(filter),
            log_level: true,
        }
    }
}

/// `filter` without the pre-images [`Item::doc`] never reads (it takes a change's
/// post-image, a delete's pre-image), so the store neither decodes nor copies them.
fn post_images(filter: ChangeFilter) -> ChangeFilter {
    ChangeFilter {
        post_images_only: true,
        ..filter
    }
}

#[async_trait]
impl Reader for ChangeReader {
    fn kind(&self) -> &'static str {
        if self.log_level { "oplog" } else { "changes" }
    }

    fn needs(&self) -> Option<Capability> {
        Some(if self.log_level {
            Capability::Oplog
        } else {
            Capability::ChangeStreams
        })
    }

    fn instead(&self, caps: &Capabilities) -> &'static str {
        if self.log_level {
            "the oplog is local.oplog.rs of a replica-set member; on FerretDB, start it with \
             --repl-set-name and create it once: db.getSiblingDB(\"local\").createCollection(\
             \"oplog.rs\", {capped: true, size: 268435456})"
        } else if caps.oplog.is_yes() {
            "use kind = \"oplog\" (the same changes, read from this server's local.oplog.rs), \
             or run tailrace on a MongoDB replica set"
        } else {
            "run tailrace on a MongoDB replica set (a single-node one will do: mongod --replSet \
             rs0, then rs.initiate()), or drop this feed (the tailable kind works on any server)"
        }
    }

    fn open(&self, store: &dyn Store, after: Option<&FeedPosition>) -> Opened {
        let start = match after {
            Some(FeedPosition::Token(t)) => ChangeStart::After(t.clone()),
            _ => ChangeStart::Oldest,
        };
        let stream = if self.log_level {
            store.oplog(self.filter.clone(), start)
        } else {
            store.changes(self.filter.clone(), start)
        };
        let read_up_to = Some(stream.resume_cell());
        Opened {
            stream: stream.map(|c| c.map(Item::Change)).boxed(),
            read_up_to,
        }
    }

    async fn lag(&self, store: &dyn Store, at: Option<&FeedPosition>) -> Lag {
        match at {
            Some(FeedPosition::Token(t)) => match store.changes_after(t).await {
                Ok(Some(n)) => Lag::Entries(n),
                Ok(None) | Err(_) => Lag::Unknown,
            },
            Some(FeedPosition::Tail(_)) => Lag::Unknown,
            None => match store.newest_change().await {
                Ok(Some(_)) => Lag::Behind,
                Ok(None) => Lag::Entries(0),
                Err(_) => Lag::Unknown,
            },
        }
    }

    async fn oldest_entry_us(&self, store: &dyn Store) -> Option<i64> {
        store.oldest_change_at().await.ok()?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use store::Support;

    /// The startup error's advice follows what the server has: the `oplog` kind where the
    /// server has an oplog, a replica set where it has neither.
    #[test]
    fn a_change_feed_the_server_cannot_serve_is_told_what_it_can() {
        let no = || Support::No {
            reason: "probed".into(),
        };
        let mut caps = Capabilities::all();
        caps.change_streams = no();
        let changes = ChangeReader::changes(ChangeFilter::default());
        assert!(changes.instead(&caps).contains("kind = \"oplog\""));
        caps.oplog = no();
        assert!(changes.instead(&caps).contains("replica set"));
        assert!(!changes.instead(&caps).contains("kind = \"oplog\""));
        let oplog = ChangeReader::oplog(ChangeFilter::default());
        assert!(oplog.instead(&caps).contains("--repl-set-name"));
    }
}
