//! `kind = "oplog"`: the op-log watcher — the changes of some collections read at the log
//! level (the embedded engine's history, MongoDB's oplog), with the settings and the reader of
//! [`super::changes`].

use serde::{Deserialize, Serialize};

use super::changes::{ChangeFeedConfig, ChangeReader};
use super::{CappedByName, FeedSettings};
use crate::feed::Reader;

/// An `oplog` feed's settings: those of a `changes` feed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OplogFeedConfig(pub ChangeFeedConfig);

impl FeedSettings for OplogFeedConfig {
    fn kind(&self) -> &'static str {
        "oplog"
    }

    fn validate(&self, _capped: &[&str]) -> Vec<(String, String)> {
        self.0.problems()
    }

    fn reader(&self, _capped: CappedByName<'_>) -> Result<Box<dyn Reader>, String> {
        Ok(Box::new(ChangeReader::oplog(self.0.filter())))
    }
}
