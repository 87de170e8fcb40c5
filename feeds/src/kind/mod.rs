//! The kinds of feed. **A feed kind is one file**: its `[[feeds]]` settings (their keys and
//! defaults, unknown keys refused), their rules ([`FeedSettings::validate`]), and what it
//! reads — opening its stream, its lag, its oldest entry ([`crate::feed::Reader`]). Adding a
//! kind = one new file, and its variant of [`FeedKindConfig`] with the arm the compiler then
//! asks for in [`FeedKindConfig::settings`].
//!
//! Layout: [`tailable`] (a tailable cursor on a capped collection), [`changes`] (a change
//! stream on keyed collections), [`oplog`] (the same changes, read at the log level).

pub mod changes;
pub mod oplog;
pub mod tailable;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use store::Capped;

use crate::feed::Reader;

/// The capped collections a feed can follow, by name (`events`, `dead_letters`).
pub type CappedByName<'a> = &'a dyn Fn(&str) -> Option<Arc<dyn Capped>>;

/// What every feed kind's settings provide.
pub trait FeedSettings {
    /// The kind's name, as written in `kind = "..."`.
    fn kind(&self) -> &'static str;

    /// Checks what serde cannot; each problem as (key under the feed's table, e.g.
    /// `collection`, and what is wrong and how to fix it). `capped` names the capped
    /// collections there are.
    fn validate(&self, capped: &[&str]) -> Vec<(String, String)>;

    /// What a feed of these settings reads; an error says why it cannot be built.
    fn reader(&self, capped: CappedByName<'_>) -> Result<Box<dyn Reader>, String>;
}

/// The feed kinds, each with its settings (`kind = "..."` in `[[feeds]]`): the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedKindConfig {
    /// A tailable cursor on a capped collection.
    Tailable(tailable::TailableFeedConfig),
    /// A change stream on changefeed-backed collections.
    Changes(changes::ChangeFeedConfig),
    /// The op-log watcher: the same changes, read at the log level.
    Oplog(oplog::OplogFeedConfig),
}

impl FeedKindConfig {
    /// The settings, behind the trait every kind implements.
    pub fn settings(&self) -> &dyn FeedSettings {
        match self {
            FeedKindConfig::Tailable(c) => c,
            FeedKindConfig::Changes(c) => c,
            FeedKindConfig::Oplog(c) => c,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Each kind's own name is the one serde reads and writes.
    #[test]
    fn each_kind_names_itself_as_the_config_does() {
        let kinds = [
            FeedKindConfig::Tailable(tailable::TailableFeedConfig::default()),
            FeedKindConfig::Changes(changes::ChangeFeedConfig::default()),
            FeedKindConfig::Oplog(oplog::OplogFeedConfig::default()),
        ];
        for k in kinds {
            let tag = serde_json::to_value(&k).unwrap();
            let tag = tag.as_object().unwrap().keys().next().unwrap().clone();
            assert_eq!(k.settings().kind(), tag, "{k:?}");
        }
    }
}
