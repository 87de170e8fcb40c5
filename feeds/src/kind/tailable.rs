//! `kind = "tailable"`: a tailable cursor on a capped collection — every new document, in
//! insertion order.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use store::{Capped, Start, Store};

use super::{CappedByName, FeedSettings};
use crate::feed::{FeedPosition, Item, Lag, Opened, Reader};

/// A `tailable` feed's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailableFeedConfig {
    /// The capped collection followed: events or dead_letters.
    #[serde(default = "default_collection")]
    pub collection: String,
}

fn default_collection() -> String {
    "events".to_owned()
}

impl Default for TailableFeedConfig {
    fn default() -> Self {
        TailableFeedConfig {
            collection: default_collection(),
        }
    }
}

impl FeedSettings for TailableFeedConfig {
    fn kind(&self) -> &'static str {
        "tailable"
    }

    fn validate(&self, capped: &[&str]) -> Vec<(String, String)> {
        if capped.contains(&self.collection.as_str()) {
            return Vec::new();
        }
        vec![(
            "collection".into(),
            format!(
                "{:?} is not a capped collection (allowed: {})",
                self.collection,
                capped.join(", ")
            ),
        )]
    }

    fn reader(&self, capped: CappedByName<'_>) -> Result<Box<dyn Reader>, String> {
        match capped(&self.collection) {
            Some(c) => Ok(Box::new(Tail::new(c))),
            None => Err(format!("no capped collection {:?}", self.collection)),
        }
    }
}

/// Reads a capped collection with a tailable cursor.
pub struct Tail(Arc<dyn Capped>);

impl Tail {
    /// Tails `capped`.
    pub fn new(capped: Arc<dyn Capped>) -> Tail {
        Tail(capped)
    }
}

#[async_trait]
impl Reader for Tail {
    fn kind(&self) -> &'static str {
        "tailable"
    }

    fn collection(&self) -> Option<&str> {
        Some(self.0.name())
    }

    fn open(&self, _store: &dyn Store, after: Option<&FeedPosition>) -> Opened {
        let start = match after {
            Some(FeedPosition::Tail(p)) => Start::After(*p),
            _ => Start::Oldest,
        };
        Opened {
            stream: self.0.tail(start).map(|r| r.map(Item::Record)).boxed(),
            read_up_to: None,
        }
    }

    async fn lag(&self, _store: &dyn Store, at: Option<&FeedPosition>) -> Lag {
        match self.0.bounds().await {
            Ok(Some(b)) => {
                let at = match at {
                    Some(FeedPosition::Tail(p)) => p.0,
                    _ => 0,
                };
                Lag::Entries(b.newest.0.saturating_sub(at))
            }
            Ok(None) => Lag::Entries(0),
            Err(_) => Lag::Unknown,
        }
    }

    async fn oldest_entry_us(&self, _store: &dyn Store) -> Option<i64> {
        let oldest = self.0.bounds().await.ok()??.oldest;
        self.0.get(oldest).await.ok()??.committed_at_us
    }
}
