//! One commit: the group written as one record, synced when asked, applied, and shown to
//! readers once synced.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::core::{Publication, ViewUpdate, Writer};
use super::hub::{Commit, LiveAppend, LiveChange};
use super::ops::{Job, Op, Reply};
use super::stage::{Group, JobOut};
use crate::clock::now_us;
use crate::embedded::maint::Task;
use crate::embedded::tree;
use crate::{Result, StoreError};

impl Writer {
    /// Commits `jobs` (one record); returns each job's result, in order.
    pub(crate) fn commit_group(&mut self, jobs: &mut [Job]) -> Vec<Result<Reply>> {
        if let Some(why) = &self.poisoned {
            let e = StoreError::Engine {
                engine: "embedded",
                message: why.clone(),
            };
            return jobs.iter().map(|_| Err(e.duplicate("embedded"))).collect();
        }
        // Between commits everything written is in the tree: a build may start here.
        self.known.tend(&self.tree);
        let now = now_us();
        let mut group = Group::default();
        let mut results: Vec<Result<Reply>> = Vec::with_capacity(jobs.len());
        let mut sync = false;
        for job in jobs.iter_mut() {
            let op = std::mem::replace(&mut job.op, Op::Barrier);
            let mut out = JobOut::default();
            match self.stage(op, now, &group, &mut out) {
                Ok(reply) => {
                    sync |= job.durability.syncs();
                    results.push(Ok(self.merge(&mut group, out, reply)));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if let Err(e) = self.write_and_apply(group, now, sync) {
            let engine_err = |r: Result<Reply>| match r {
                Ok(_) => Err(e.duplicate("embedded")),
                Err(own) => Err(own),
            };
            return results.into_iter().map(engine_err).collect();
        }
        if self.rotate_asked.swap(false, Ordering::AcqRel)
            || self.tree.memtable_bytes() >= self.memtable_bytes
        {
            self.rotate();
        }
        results
    }

    /// Seals the tree's memtable (after marking it complete up to the last record) and has the
    /// maintenance thread flush it.
    pub(super) fn rotate(&mut self) {
        // The tables flushed from this memtable say they hold every record up to the last:
        // that record must be durable first, or a power cut would leave the keyed state ahead
        // of the journal (counters counting events that are gone).
        if self.sync_pending().is_err() {
            return;
        }
        let last = self.lsn.saturating_sub(1);
        self.tree
            .insert(tree::APPLIED, last.to_le_bytes().to_vec(), last);
        if self.tree.rotate() {
            let _ = self.maint.send(Task::Flush);
        }
    }

    /// Writes the group's record, syncs it if asked, applies and publishes it.
    pub(super) fn write_and_apply(&mut self, group: Group, now: i64, sync: bool) -> Result<()> {
        // Evictions: each appended collection keeps its newest documents within its limits.
        let mut oldest_after: HashMap<String, (u64, usize, u64, u64)> = HashMap::new();
        for (coll, docs, bodies, _) in &group.appends {
            let Some(c) = self.capped.get(coll.as_str()) else {
                continue;
            };
            let (mut count, mut bytes) = (c.count, c.bytes);
            for b in bodies {
                count += 1;
                bytes += b.len() as u64;
            }
            // Walk from the oldest, over the existing sizes and then the new documents.
            let (mut oldest, mut i) = (c.oldest, 0usize);
            let total = c.sizes.len() + docs.len();
            while i + 1 < total && (count > c.max_docs || bytes > c.max_bytes) {
                let size = if i < c.sizes.len() {
                    c.sizes[i]
                } else {
                    bodies[i - c.sizes.len()].len() as u32
                };
                if size != u32::MAX {
                    count -= 1;
                    bytes -= size as u64;
                }
                i += 1;
                oldest += 1;
            }
            // Past holes too, so the oldest position holds a document.
            while i + 1 < total {
                let size = if i < c.sizes.len() { c.sizes[i] } else { 0 };
                if size != u32::MAX {
                    break;
                }
                i += 1;
                oldest += 1;
            }
            oldest_after.insert(coll.clone(), (oldest, i, count, bytes));
        }

        // A spill writes nothing into the record, but it takes one: its tree writes then carry
        // a sequence number of their own, which the release waits to see persisted.
        let has_entries = !group.appends.is_empty()
            || !group.changes.is_empty()
            || !group.checkpoints.is_empty()
            || !group.spills.is_empty();
        let lsn = self.lsn;
        let change_first = self.change_next;
        let mut written = None;
        if has_entries {
            let b = &mut self.builder;
            b.clear();
            for (coll, docs, bodies, _) in &group.appends {
                let first = self.capped.get(coll.as_str()).map_or(1, |c| c.next);
                let oldest = oldest_after.get(coll.as_str()).map_or(first, |o| o.0);
                b.section(coll, first, oldest);
                for body in bodies {
                    b.doc(body);
                }
                let _ = docs;
            }
            for (i, c) in group.changes.iter().enumerate() {
                b.change(
                    change_first + i as u64,
                    c.op,
                    &c.coll,
                    &c.key,
                    c.before.as_ref().map(|k| k.json.as_bytes()),
                    c.after.as_ref().map(|k| k.json.as_bytes()),
                );
            }
            for (feed, body) in &group.checkpoints {
                b.checkpoint(feed, body.as_bytes());
            }
            b.finish(lsn, now, self.journal.last_crc(), &mut self.record);
            let w = self.journal.append(&self.record);
            let w = self.poison_on_sync_failure(w)?;
            if w.rolled {
                // Finishing the segment synced every record before this one.
                self.publish_pending();
            }
            written = Some(w);
        }
        if sync {
            let synced = self.journal.sync();
            self.poison_on_sync_failure(synced)?;
        }
        // Applied from here on: nothing below may fail the group.
        let mut commit = Commit::default();
        let commit_bytes = group.bytes as u64;
        let mut publication = Publication {
            lsn: lsn.saturating_sub(u64::from(written.is_none())),
            ..Publication::default()
        };
        if let Some(w) = written {
            self.lsn += 1;
            self.written_lsn.store(lsn, Ordering::Release);
            self.apply_journal_meta(&group, w, lsn, &oldest_after);
        }
        // Capped collections.
        for (coll, docs, bodies, _) in group.appends {
            let Some(c) = self.capped.get_mut(&coll) else {
                continue;
            };
            let first = c.next;
            for b in &bodies {
                c.sizes.push_back(b.len() as u32);
            }
            c.next += docs.len() as u64;
            if let Some(&(oldest, drop_n, count, bytes)) = oldest_after.get(coll.as_str()) {
                for _ in 0..drop_n {
                    c.sizes.pop_front();
                }
                c.oldest = oldest;
                c.count = count;
                c.bytes = bytes;
            }
            // Written, not yet shown: a tail started `Now` starts after it (and waits for it).
            c.newest.store(c.next - 1, Ordering::Release);
            publication.views.push((
                coll.clone(),
                ViewUpdate {
                    oldest: c.oldest,
                    next: c.next,
                    count: c.count,
                    bytes: c.bytes,
                },
            ));
            commit.appended.push((coll, LiveAppend { first, docs }));
        }
        // Keyed state, checkpoints, spills: into the tree, as of this record.
        let seqno = if written.is_some() {
            lsn
        } else {
            lsn.saturating_sub(1)
        };
        for ((coll, key), slot) in group.kv {
            let dk = tree::doc_key(&coll, &key);
            if let Some(orig) = slot.orig_ts {
                let moved = slot
                    .now
                    .as_ref()
                    .is_none_or(|n| tree::bucket(n.ts) != tree::bucket(orig));
                if moved {
                    self.tree
                        .remove(tree::time_key(&coll, tree::bucket(orig), &key), seqno);
                }
            }
            match slot.now {
                Some(kv) => {
                    if slot
                        .orig_ts
                        .is_none_or(|o| tree::bucket(o) != tree::bucket(kv.ts))
                    {
                        self.tree.insert(
                            tree::time_key(&coll, tree::bucket(kv.ts), &key),
                            Vec::new(),
                            seqno,
                        );
                    }
                    self.tree
                        .insert(dk, tree::value(kv.ts, kv.json.as_bytes()), seqno);
                    self.known.written(&coll, &key);
                    if slot.orig_ts.is_some() {
                        // A key written before is likely written again (a hot counter, a
                        // summary); a new one, on a long tail, mostly is not.
                        self.cache.put(&coll, &key, kv);
                    } else {
                        self.cache.remove(&coll, &key);
                    }
                }
                None => {
                    self.tree.remove(dk, seqno);
                    self.cache.remove(&coll, &key);
                }
            }
        }
        for (feed, body) in group.checkpoints {
            self.tree
                .insert(tree::checkpoint_key(&feed), body.into_bytes(), seqno);
        }
        for (coll, docs) in group.spills {
            for (pos, ts, json) in docs {
                self.tree
                    .insert(tree::spill_key(&coll, pos), tree::value(ts, &json), seqno);
            }
        }
        publication.tree_seqno = Some(seqno);
        // Changes.
        if !group.changes.is_empty() {
            for (i, c) in group.changes.into_iter().enumerate() {
                let seq = change_first + i as u64;
                commit.changes.push(LiveChange {
                    op: c.op,
                    collection: c.coll,
                    key: c.key,
                    before: c.before.map(|k| k.doc),
                    after: c.after.map(|k| k.doc),
                    seq,
                });
            }
            self.change_next = change_first + commit.changes.len() as u64;
            self.written_op
                .store(self.change_next - 1, Ordering::Release);
            publication.changes = Some((change_first, self.change_next));
        }
        if !commit.appended.is_empty() || !commit.changes.is_empty() {
            publication.commit = Some((commit, commit_bytes));
        }
        if self.pending.is_empty() {
            self.pending_since = Some(std::time::Instant::now());
        }
        self.pending.push(publication);
        if sync || !self.journal.dirty() {
            self.publish_pending();
        }
        Ok(())
    }

    /// A journal error as it is returned; a failed sync poisons the writer first.
    pub(super) fn poison_on_sync_failure<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_err() && self.journal.sync_failed() {
            self.poison(format!(
                "a journal sync failed ({}); nothing more is written until tailrace restarts",
                r.as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ));
        }
        r
    }

    /// Stops all writing: what the disk holds since the last good sync is unknown. What was
    /// waiting for a sync is never shown to readers.
    pub(super) fn poison(&mut self, why: String) {
        self.pending.clear();
        self.pending_since = None;
        self.poisoned = Some(why);
        self.release_readers();
    }

    /// Lets go of readers waiting to see writes that will never be shown (a poisoned or
    /// closed writer): they read what is shown.
    pub(crate) fn release_readers(&self) {
        let written = self.written_lsn.load(Ordering::Acquire);
        self.published.send_if_modified(|p| {
            let was = *p;
            *p = (*p).max(written);
            *p != was
        });
    }

    /// How long the oldest commit not yet shown to readers has waited for a sync (`None`:
    /// none waits).
    pub(crate) fn pending_for(&self) -> Option<std::time::Duration> {
        self.pending_since.map(|t| t.elapsed())
    }

    /// Syncs the journal and shows readers every commit that waited for it.
    pub(crate) fn sync_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let synced = self.journal.sync();
        self.poison_on_sync_failure(synced)?;
        self.publish_pending();
        Ok(())
    }

    /// Shows readers the commits whose records are synced (all that wait: the journal was
    /// just synced), in order: positions, counts, the keyed state's sequence number, the
    /// change log's end, and the live broadcast.
    pub(super) fn publish_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        self.pending_since = None;
        let mut last_lsn = 0;
        let mut tree_seqno = None;
        if let Ok(mut shared) = self.shared.write() {
            for p in &pending {
                for (coll, v) in &p.views {
                    if let Some(view) = shared.capped.get_mut(coll) {
                        view.oldest = v.oldest;
                        view.next = v.next;
                        view.count = v.count;
                        view.bytes = v.bytes;
                    }
                }
                if let Some((first, next)) = p.changes {
                    shared.change_next = next;
                    if shared.change_first == 0 {
                        shared.change_first = first;
                    }
                }
                tree_seqno = p.tree_seqno.or(tree_seqno);
                last_lsn = last_lsn.max(p.lsn);
            }
            if let Some(seqno) = tree_seqno {
                self.tree.publish(seqno);
            }
            shared.point = (self.tree.visible(), shared.change_next.saturating_sub(1));
        }
        for p in pending {
            if let Some((_, next)) = p.changes {
                self.newest_op.store(next - 1, Ordering::Release);
            }
            if let Some((mut commit, bytes)) = p.commit {
                commit.committed_at_us = now_us();
                self.hub.send(commit, bytes);
            }
        }
        self.published.send_if_modified(|p| {
            let was = *p;
            *p = (*p).max(last_lsn);
            *p != was
        });
    }

    /// Syncs what the journal holds.
    pub(crate) fn sync_journal(&mut self) -> Result<()> {
        self.journal.sync()
    }

    /// Seals the memtable now (its flush is queued for the maintenance thread).
    pub(crate) fn seal_memtable(&mut self) {
        self.rotate();
    }

    /// Seals the memtable when it holds as much as a commit would seal it at (the conversion
    /// of an earlier layout, which writes keys without commits); whether it did.
    pub(crate) fn seal_if_full(&mut self) -> bool {
        let full = self.tree.memtable_bytes() >= self.memtable_bytes;
        if full {
            self.rotate();
        }
        full
    }

    /// Has the memtable sealed after the next commit.
    pub(crate) fn request_rotation(&self) {
        self.rotate_asked.store(true, Ordering::Release);
    }
}
