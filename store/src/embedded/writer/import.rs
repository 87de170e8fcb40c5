//! The conversion of an earlier layout: documents, changes, keyed documents and checkpoints
//! imported as they were, with their positions and sequence numbers.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::cache::Kv;
use super::core::{Writer, lock_err};
use super::ops::Docs;
use super::stage::{Group, StagedChange};
use crate::embedded::state;
use crate::embedded::tree;
use crate::{ChangeOp, Document, Result, StoreError, update};

/// A change of an earlier layout's log: operation, collection, key, before and after.
pub(crate) type ImportedChange = (ChangeOp, String, String, Option<Kv>, Option<Kv>);

impl Writer {
    /// Imports documents of a capped collection at the positions they had (the conversion of
    /// an earlier layout): positions between the collection's next one and `first` hold no
    /// document. One record, committed at `ts`.
    pub(crate) fn import_capped(
        &mut self,
        coll: &str,
        first: u64,
        docs: Vec<(Document, String)>,
        ts: i64,
    ) -> Result<()> {
        let c = self.capped.get_mut(coll).ok_or_else(|| {
            StoreError::Invalid(format!("capped collection {coll} was not opened"))
        })?;
        if first < c.next {
            return Err(StoreError::Invalid(format!(
                "importing {coll} at position {first}, below its next position {}",
                c.next
            )));
        }
        if c.count == 0 {
            c.sizes.clear();
            c.oldest = first;
        } else {
            for _ in c.next..first {
                c.sizes.push_back(u32::MAX);
            }
        }
        c.next = first;
        let (oldest, next) = (c.oldest, c.next);
        if let Ok(mut shared) = self.shared.write()
            && let Some(v) = shared.capped.get_mut(coll)
        {
            v.oldest = oldest;
            v.next = next;
            v.journal_from = v.journal_from.min(first).max(1);
        }
        let indexes = self
            .capped
            .get(coll)
            .map(|c| c.indexes.clone())
            .unwrap_or_default();
        let hashes = docs
            .iter()
            .map(|(d, _)| {
                indexes
                    .iter()
                    .filter_map(|f| state::value_hash(coll, f, update::get_path(d, f)))
                    .collect()
            })
            .collect();
        let (docs, bodies): (Vec<Document>, Vec<Vec<u8>>) = docs
            .into_iter()
            .map(|(d, body)| (d, body.into_bytes()))
            .unzip();
        let docs = Docs::from(docs.into_iter().map(Arc::new).collect::<Arc<[_]>>());
        let group = Group {
            appends: vec![(coll.to_owned(), docs, bodies, hashes)],
            ..Group::default()
        };
        self.write_and_apply(group, ts, false)
    }

    /// Imports changes with the sequence numbers they had, from `first_seq` on (the
    /// conversion of an earlier layout): into the change log only, not into the keyed state
    /// (which is imported as it is now). One record, committed at `ts`.
    pub(crate) fn import_changes(
        &mut self,
        first_seq: u64,
        ts: i64,
        changes: Vec<ImportedChange>,
    ) -> Result<()> {
        if first_seq < self.change_next {
            return Err(StoreError::Invalid(format!(
                "importing changes from {first_seq}, below the next sequence number {}",
                self.change_next
            )));
        }
        let empty = self.newest_op.load(Ordering::Acquire) == 0;
        self.change_next = first_seq;
        if let Ok(mut shared) = self.shared.write() {
            shared.change_next = first_seq;
            if empty {
                shared.change_first = first_seq;
            }
        }
        let group = Group {
            changes: changes
                .into_iter()
                .map(|(op, coll, key, before, after)| StagedChange {
                    op,
                    coll,
                    key,
                    before,
                    after,
                })
                .collect(),
            ..Group::default()
        };
        self.write_and_apply(group, ts, false)
    }

    /// Imports a keyed document as it is now, written at `ts` (the conversion of an earlier
    /// layout): into the keyed state, without a change.
    pub(crate) fn import_kv(&mut self, coll: &str, key: &str, json: &str, ts: i64) {
        if !tree::fits(coll, key) {
            crate::telemetry::Problem {
                error_type: "key_too_long",
                detail: &format!(
                    "converting: {coll}/{:?}… has a key of {} bytes, more than the keyed state holds; the document is left out",
                    key.chars().take(24).collect::<String>(),
                    key.len()
                ),
            }
            .warn();
            return;
        }
        let seqno = self.lsn.saturating_sub(1);
        self.tree.insert(
            tree::time_key(coll, tree::bucket(ts), key),
            Vec::new(),
            seqno,
        );
        self.tree.insert(
            tree::doc_key(coll, key),
            tree::value(ts, json.as_bytes()),
            seqno,
        );
        self.known.written(coll, key);
        self.tree.publish(seqno);
    }

    /// Imports a feed's checkpoint (the conversion of an earlier layout).
    pub(crate) fn import_checkpoint(&mut self, feed: &str, body: &str) {
        let seqno = self.lsn.saturating_sub(1);
        self.tree
            .insert(tree::checkpoint_key(feed), body.as_bytes().to_vec(), seqno);
        self.tree.publish(seqno);
    }

    /// Makes the next change's sequence number at least `seq` (the conversion of an earlier
    /// layout, whose newest changes may have been trimmed), durably (in the catalog).
    pub(crate) fn continue_changes_at(&mut self, seq: u64) -> Result<()> {
        if seq <= self.change_next {
            return Ok(());
        }
        let empty = self.newest_op.load(Ordering::Acquire) == 0;
        self.change_next = seq;
        self.newest_op.store(seq - 1, Ordering::Release);
        if let Ok(mut shared) = self.shared.write() {
            shared.change_next = seq;
            if empty {
                shared.change_first = seq;
            }
        }
        let mut catalog = self.catalog.lock().map_err(lock_err)?;
        catalog.next_change = catalog.next_change.max(seq);
        if empty {
            catalog.first_change = seq;
        }
        catalog.save(&*self.fs, &self.dir)
    }

    /// Makes a capped collection's next position at least `pos` (as above), durably.
    pub(crate) fn continue_positions_at(&mut self, coll: &str, pos: u64) -> Result<()> {
        let Some(c) = self.capped.get_mut(coll) else {
            return Ok(());
        };
        if pos <= c.next {
            return Ok(());
        }
        if c.count == 0 {
            c.sizes.clear();
            c.oldest = pos;
        } else {
            for _ in c.next..pos {
                c.sizes.push_back(u32::MAX);
            }
        }
        c.next = pos;
        c.newest.store(pos - 1, Ordering::Release);
        let (oldest, next) = (c.oldest, c.next);
        if let Ok(mut shared) = self.shared.write()
            && let Some(v) = shared.capped.get_mut(coll)
        {
            v.oldest = oldest;
            v.next = next;
        }
        let mut catalog = self.catalog.lock().map_err(lock_err)?;
        if let Some(entry) = catalog.collections.get_mut(coll) {
            entry.next_pos = entry.next_pos.max(next);
            if entry.oldest_pos < oldest {
                entry.oldest_pos = oldest;
            }
            entry.journal_from = entry.journal_from.max(entry.oldest_pos.min(next));
        }
        catalog.save(&*self.fs, &self.dir)
    }
}
