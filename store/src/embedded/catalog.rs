//! `catalog.json`: what exists (collections, their kind, limits, indexes and validation rule)
//! and what the released journal segments no longer say (each capped collection's positions,
//! the change log's and the journal's numbers as they were when the oldest segment went).
//! Rewritten whole, atomically (a temporary file, synced, renamed, the directory synced),
//! when a collection is created or changed and when segments are released: rarely.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::fs::Fs;
use super::journal::io_error;
use crate::{Result, StoreError};

pub(crate) const FILE: &str = "catalog.json";
/// The layout's version: a directory written by a later, different layout is refused.
pub(crate) const VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    Capped,
    Keyed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Collection {
    pub kind: Kind,
    /// Indexed fields (capped): every one ever asked for, so every document is indexed by all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indexes: Vec<String>,
    #[serde(default)]
    pub max_docs: u64,
    #[serde(default)]
    pub max_bytes: u64,
    /// Documents that do not match this filter are refused (MongoDB's query validators).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validator: Option<serde_json::Value>,
    /// Capped: the next position, the oldest retained one, and the first position still in a
    /// journal segment (those below live in the tree), as of the last release.
    #[serde(default)]
    pub next_pos: u64,
    #[serde(default)]
    pub oldest_pos: u64,
    #[serde(default)]
    pub journal_from: u64,
}

impl Collection {
    pub fn new(kind: Kind) -> Self {
        Collection {
            kind,
            indexes: Vec::new(),
            max_docs: 0,
            max_bytes: 0,
            validator: None,
            next_pos: 1,
            oldest_pos: 1,
            journal_from: 1,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Catalog {
    pub version: u32,
    pub collections: BTreeMap<String, Collection>,
    /// The oldest journal segment kept; older ones were released.
    pub first_segment: u64,
    /// The next journal record number, change sequence number and the oldest change still in
    /// the journal, as of the last release.
    pub next_lsn: u64,
    pub next_change: u64,
    pub first_change: u64,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            version: VERSION,
            collections: BTreeMap::new(),
            first_segment: 1,
            next_lsn: 1,
            next_change: 1,
            first_change: 1,
        }
    }
}

impl Catalog {
    /// Reads the catalog of `dir`; `None` when there is none (a new directory).
    pub fn load(fs: &dyn Fs, dir: &Path) -> Result<Option<Catalog>> {
        let path = dir.join(FILE);
        let text = match fs.read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(format!("reading {}", path.display()), e)),
        };
        let c: Catalog = serde_json::from_slice(&text).map_err(|e| StoreError::Engine {
            engine: "embedded",
            message: format!("{} is damaged: {e}", path.display()),
        })?;
        if c.version != VERSION {
            return Err(StoreError::Incompatible {
                collection: "*".into(),
                problem: format!(
                    "{} was written by a storage layout version {} this tailrace does not read (it reads {VERSION})",
                    path.display(),
                    c.version
                ),
            });
        }
        Ok(Some(c))
    }

    /// Writes the catalog into `dir`, atomically.
    pub fn save(&self, fs: &dyn Fs, dir: &Path) -> Result<()> {
        let path = dir.join(FILE);
        let text = serde_json::to_vec_pretty(self)?;
        super::fs::write_atomic(fs, &path, &text)
            .map_err(|e| io_error(format!("writing {}", path.display()), e))
    }
}
