//! The embedded engine's keys of `[store]` (`engine = "embedded"`): where its files live and
//! how much change history it keeps.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{EmbeddedOptions, EmbeddedStore};
use crate::engine::{EngineSettings, OpenWith};
use crate::{Result, Store};

/// The fewest changes the change log may keep: fewer, and a feed restarted after a few seconds
/// of a busy stream would have to resynchronise.
const MIN_OPLOG_ENTRIES: u64 = 1000;

/// `[store]` with `engine = "embedded"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedSettings {
    /// Directory of the database files (created if missing).
    pub path: PathBuf,
    /// How many entries the op log (change feed history) keeps; a feed that falls further
    /// behind must resynchronise. At least 1000.
    pub oplog_max_entries: u64,
}

impl Default for EmbeddedSettings {
    fn default() -> Self {
        EmbeddedSettings {
            path: PathBuf::from("data"),
            oplog_max_entries: EmbeddedOptions::default().oplog_max_entries,
        }
    }
}

impl EmbeddedSettings {
    /// The engine's files in `path`, other settings as default.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        EmbeddedSettings {
            path: path.into(),
            ..EmbeddedSettings::default()
        }
    }
}

impl EngineSettings for EmbeddedSettings {
    fn problems(&self) -> Vec<(&'static str, String)> {
        let mut found = Vec::new();
        if self.path.as_os_str().is_empty() {
            found.push((
                "path",
                "required for engine = \"embedded\" (a directory, e.g. \"data\")".to_owned(),
            ));
        }
        if self.oplog_max_entries < MIN_OPLOG_ENTRIES {
            found.push((
                "oplog_max_entries",
                format!(
                    "must be >= {MIN_OPLOG_ENTRIES} (got {})",
                    self.oplog_max_entries
                ),
            ));
        }
        found
    }

    fn open<'a>(&'a self, with: &'a OpenWith) -> BoxFuture<'a, Result<Arc<dyn Store>>> {
        Box::pin(async move {
            let options = EmbeddedOptions {
                oplog_max_entries: self.oplog_max_entries,
                queue_capacity: with.queue_capacity,
            };
            let store: Arc<dyn Store> =
                Arc::new(EmbeddedStore::open_async(&self.path, options).await?);
            Ok(store)
        })
    }

    fn location(&self, _database: &str) -> String {
        std::path::absolute(&self.path)
            .unwrap_or_else(|_| self.path.clone())
            .display()
            .to_string()
    }

    fn data_dir(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn use_scratch(&mut self, dir: &Path) {
        self.path = dir.to_path_buf();
    }
}
