//! The writer's state: what it knows of the journal, the collections and the keyed state,
//! and how it starts from what recovery found.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};

use super::cache::KvCache;
use super::hub::{Commit, Hub};
use crate::embedded::catalog::{self, Catalog};
use crate::embedded::format::Builder;
use crate::embedded::fs::Fs;
use crate::embedded::journal;
use crate::embedded::known::KnownKeys;
use crate::embedded::maint::Task;
use crate::embedded::recover::Recovered;
use crate::embedded::state::{self, Shared};
use crate::embedded::tree::Tree;
use crate::{Document, Filter, Result, StoreError, update};

/// The writer's own view of a capped collection.
pub(super) struct WCapped {
    pub(super) max_docs: u64,
    pub(super) max_bytes: u64,
    pub(super) indexes: Vec<String>,
    pub(super) validator: Option<Filter>,
    pub(super) oldest: u64,
    pub(super) next: u64,
    /// Sizes of positions `[oldest, next)`; `u32::MAX` where there is no document.
    pub(super) sizes: VecDeque<u32>,
    pub(super) count: u64,
    pub(super) bytes: u64,
    pub(super) newest: Arc<AtomicU64>,
    /// The last seek point added: (segment, offset).
    pub(super) last_seek: Option<(u64, u64)>,
}

pub(crate) struct Writer {
    pub(super) fs: Arc<dyn Fs>,
    pub(super) dir: PathBuf,
    pub(super) jdir: PathBuf,
    pub(super) journal: journal::Writer,
    /// The next record number.
    pub(super) lsn: u64,
    pub(super) change_next: u64,
    pub(super) tree: Arc<Tree>,
    pub(super) shared: Arc<RwLock<Shared>>,
    pub(super) catalog: Arc<Mutex<Catalog>>,
    pub(super) capped: HashMap<String, WCapped>,
    pub(super) keyed_validators: HashMap<String, Filter>,
    pub(super) cache: KvCache,
    pub(super) hub: Hub,
    pub(super) newest_op: Arc<AtomicU64>,
    /// The record being built and its bytes, kept from commit to commit for their buffers.
    pub(super) builder: Builder,
    pub(super) record: Vec<u8>,
    pub(super) maint: std::sync::mpsc::Sender<Task>,
    pub(super) memtable_bytes: u64,
    pub(super) rotate_asked: Arc<AtomicBool>,
    pub(super) last_change_seek: Option<(u64, u64)>,
    /// Which keyed documents the tree may hold: reads of the others are skipped.
    pub(super) known: KnownKeys,
    /// After a failed sync nothing more is written: what the disk holds is unknown.
    pub(super) poisoned: Option<String>,
    /// Commits written but not yet synced, in order: readers see a commit only once its
    /// record is synced (docs/RELIABILITY.md, "What a reader sees").
    pub(super) pending: Vec<Publication>,
    /// When the oldest of them was committed.
    pub(super) pending_since: Option<std::time::Instant>,
    /// The last record written, and the last one readers may see (synced): a read waits
    /// for the second to reach the first, so a caller reads its own writes.
    pub(super) written_lsn: Arc<AtomicU64>,
    pub(super) published: Arc<tokio::sync::watch::Sender<u64>>,
    /// The last change number written (shown or not): where a change stream started `Now`
    /// starts.
    pub(super) written_op: Arc<AtomicU64>,
}

/// Each document's hashes of its values of `indexes` (a missing or null value has none).
pub(crate) fn index_hashes<'a>(
    coll: &str,
    indexes: &[String],
    docs: impl Iterator<Item = &'a Arc<Document>>,
) -> Vec<Vec<u64>> {
    docs.map(|d| {
        indexes
            .iter()
            .filter_map(|f| state::value_hash(coll, f, update::get_path(d, f)))
            .collect()
    })
    .collect()
}

pub(super) fn lock_err<T>(_: T) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: "internal lock poisoned".into(),
    }
}

pub(super) fn refused(coll: &str, rule: &Filter) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: format!(
            "document failed validation: collection {coll} accepts only documents matching {}",
            rule.as_json()
        ),
    }
}

/// What the writer shares with the rest of the engine.
pub(crate) struct Links {
    /// The live broadcast to tails and change streams.
    pub hub: Hub,
    /// The newest change number shown to readers.
    pub newest_op: Arc<AtomicU64>,
    /// The maintenance thread's queue (flushes, index files).
    pub maint: std::sync::mpsc::Sender<Task>,
    /// Set by maintenance to have the memtable sealed after the next commit.
    pub rotate_asked: Arc<AtomicBool>,
}

impl Writer {
    pub(crate) fn new(
        r: Recovered,
        links: Links,
        memtable_bytes: u64,
        known_keys_min: usize,
    ) -> Result<Writer> {
        let Links {
            hub,
            newest_op,
            maint,
            rotate_asked,
        } = links;
        let catalog = r.catalog.lock().map_err(lock_err)?.clone();
        let mut capped = HashMap::new();
        for (name, (oldest, next, sizes, last_seek)) in r.capped {
            let entry = catalog.collections.get(&name);
            let validator = entry
                .and_then(|c| c.validator.as_ref())
                .map(Filter::parse)
                .transpose()
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            let (count, bytes) = state::retained(&sizes);
            capped.insert(
                name,
                WCapped {
                    max_docs: entry.map_or(u64::MAX, |c| c.max_docs),
                    max_bytes: entry.map_or(u64::MAX, |c| c.max_bytes),
                    indexes: entry.map(|c| c.indexes.clone()).unwrap_or_default(),
                    validator,
                    oldest,
                    next,
                    sizes,
                    count,
                    bytes,
                    newest: Arc::new(AtomicU64::new(next.saturating_sub(1))),
                    last_seek,
                },
            );
        }
        let mut keyed_validators = HashMap::new();
        for (name, c) in &catalog.collections {
            if c.kind == catalog::Kind::Keyed
                && let Some(v) = &c.validator
            {
                keyed_validators.insert(
                    name.clone(),
                    Filter::parse(v).map_err(|e| StoreError::Invalid(e.to_string()))?,
                );
            }
        }
        Ok(Writer {
            fs: r.fs,
            jdir: r.dir.join(journal::DIR),
            dir: r.dir,
            journal: r.journal,
            lsn: r.lsn,
            change_next: r.change_next,
            tree: r.tree,
            shared: r.shared,
            catalog: r.catalog,
            capped,
            keyed_validators,
            cache: KvCache::new(),
            hub,
            newest_op,
            builder: Builder::new(),
            record: Vec::new(),
            maint,
            memtable_bytes,
            rotate_asked,
            last_change_seek: r.last_change_seek,
            known: KnownKeys::new(known_keys_min),
            poisoned: None,
            pending: Vec::new(),
            pending_since: None,
            written_lsn: Arc::new(AtomicU64::new(r.lsn.saturating_sub(1))),
            published: Arc::new(tokio::sync::watch::Sender::new(r.lsn.saturating_sub(1))),
            written_op: Arc::new(AtomicU64::new(r.change_next.saturating_sub(1))),
        })
    }

    /// The last record written, and the last one readers see (see [`Writer::pending`]).
    pub(crate) fn visibility(
        &self,
    ) -> (
        Arc<AtomicU64>,
        Arc<tokio::sync::watch::Sender<u64>>,
        Arc<AtomicU64>,
    ) {
        (
            self.written_lsn.clone(),
            self.published.clone(),
            self.written_op.clone(),
        )
    }
}

/// What a commit shows readers once its record is synced.
#[derive(Default)]
pub(super) struct Publication {
    /// Its record (or, with none, the last one before it).
    pub(super) lsn: u64,
    /// The appended collections' positions and sizes after it.
    pub(super) views: Vec<(String, ViewUpdate)>,
    /// The keyed state's writes up to this sequence number.
    pub(super) tree_seqno: Option<u64>,
    /// The change numbers it made, `[first, next)`.
    pub(super) changes: Option<(u64, u64)>,
    /// What the live broadcast sends, and its stored bytes.
    pub(super) commit: Option<(Commit, u64)>,
}

/// A capped collection as readers see it after a commit.
pub(super) struct ViewUpdate {
    pub(super) oldest: u64,
    pub(super) next: u64,
    pub(super) count: u64,
    pub(super) bytes: u64,
}
