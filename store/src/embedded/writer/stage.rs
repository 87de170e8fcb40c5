//! Staging a job against what its group staged before it: each job joins the group only if
//! all of it stages, so one bad job fails alone.

use std::sync::Arc;

use super::cache::{Kv, KvHashMap, KvKey, KvRef};
use super::core::{Writer, index_hashes, lock_err, refused};
use super::ops::{Docs, Op, Reply};
use crate::embedded::catalog;
use crate::embedded::format;
use crate::embedded::tree::{self, Tree};
use crate::{ChangeOp, Document, Position, Result, StoreError, update};

/// A capped collection's documents staged by a job or a group: the collection, the
/// documents, their JSON and each one's index hashes.
pub(super) type Appended = (String, Docs, Vec<Vec<u8>>, Vec<Vec<u64>>);
/// Documents of a released segment moved into the tree: collection, (position, commit
/// time, JSON).
pub(super) type Spilled = (String, Vec<(u64, i64, Vec<u8>)>);

/// The staged keyed documents of a job or a group.
pub(super) type KvMap = KvHashMap<KvKey, Slot>;

/// A keyed key's state as staged: `None` once deleted.
#[derive(Clone)]
pub(super) struct Slot {
    pub(super) now: Option<Kv>,
    /// Its write time in the tree before the group (for the write-time index).
    pub(super) orig_ts: Option<i64>,
}

/// A staged change.
pub(crate) struct StagedChange {
    pub(super) op: ChangeOp,
    pub(super) coll: String,
    pub(super) key: String,
    pub(super) before: Option<Kv>,
    pub(super) after: Option<Kv>,
}

/// What one job stages; joins the group if the job succeeds.
#[derive(Default)]
pub(super) struct JobOut {
    pub(super) appends: Vec<Appended>,
    pub(super) changes: Vec<StagedChange>,
    pub(super) kv: KvMap,
    pub(super) checkpoints: Vec<(String, String)>,
    pub(super) spills: Vec<Spilled>,
    /// Which appends (index into `appends`) answer the job.
    pub(super) answer_append: Option<usize>,
}

/// What the group staged.
#[derive(Default)]
pub(super) struct Group {
    /// Per capped collection, in order of first append: its documents, bodies and index
    /// hashes.
    pub(super) appends: Vec<Appended>,
    pub(super) changes: Vec<StagedChange>,
    pub(super) kv: KvMap,
    pub(super) checkpoints: Vec<(String, String)>,
    pub(super) spills: Vec<Spilled>,
    pub(super) bytes: usize,
}

impl Group {
    pub(super) fn next_pos(&self, w: &Writer, coll: &str) -> u64 {
        let base = w.capped.get(coll).map_or(1, |c| c.next);
        base + self
            .appends
            .iter()
            .find(|(c, ..)| c == coll)
            .map_or(0, |a| a.1.len() as u64)
    }
}

impl Writer {
    /// Joins a staged job to the group; fills in its positions.
    pub(super) fn merge(&mut self, group: &mut Group, out: JobOut, reply: Reply) -> Reply {
        let mut positions = None;
        for (i, (coll, docs, bodies, hashes)) in out.appends.into_iter().enumerate() {
            let first = group.next_pos(self, &coll);
            if out.answer_append == Some(i) {
                positions = Some((first..first + docs.len() as u64).map(Position).collect());
            }
            group.bytes += bodies.iter().map(Vec::len).sum::<usize>();
            match group.appends.iter_mut().find(|a| a.0 == coll) {
                Some(a) => {
                    a.1.extend(docs);
                    a.2.extend(bodies);
                    a.3.extend(hashes);
                }
                None => group.appends.push((coll, docs, bodies, hashes)),
            }
        }
        for c in &out.changes {
            group.bytes += c.after.as_ref().map_or(0, |a| a.json.len())
                + c.before.as_ref().map_or(0, |b| b.json.len());
        }
        // The first job to stage changes or keys (often the group's only one: a batch's
        // rollups) hands its vector and map over, rather than every key being hashed and
        // inserted again into a map growing from nothing.
        if group.changes.is_empty() {
            group.changes = out.changes;
        } else {
            group.changes.extend(out.changes);
        }
        if group.kv.is_empty() {
            group.kv = out.kv;
        } else {
            for (k, slot) in out.kv {
                match group.kv.get_mut(&k) {
                    Some(existing) => existing.now = slot.now,
                    None => {
                        group.kv.insert(k, slot);
                    }
                }
            }
        }
        group.checkpoints.extend(out.checkpoints);
        group.spills.extend(out.spills);
        match (reply, positions) {
            (Reply::Positions(_), Some(p)) | (Reply::Done, Some(p)) => Reply::Positions(p),
            (r, _) => r,
        }
    }

    /// Stages one operation into `out`.
    pub(super) fn stage(
        &mut self,
        op: Op,
        now: i64,
        group: &Group,
        out: &mut JobOut,
    ) -> Result<Reply> {
        match op {
            Op::CreateCapped { name, spec } => {
                self.create_capped(&name, &spec)?;
                let (newest, indexes) = self
                    .capped
                    .get(&name)
                    .map(|c| (c.newest.clone(), Arc::from(c.indexes.as_slice())))
                    .ok_or_else(|| StoreError::Engine {
                        engine: "embedded",
                        message: format!("capped collection {name} was not created"),
                    })?;
                Ok(Reply::Newest(newest, indexes))
            }
            Op::CreateKeyed { name } => {
                self.create_keyed(&name)?;
                Ok(Reply::Done)
            }
            Op::Validate { coll, rule } => {
                self.set_validator(&coll, rule)?;
                Ok(Reply::Done)
            }
            Op::Append {
                coll,
                docs,
                bodies,
                indexed,
                hashes,
            } => {
                let meta = self.capped.get(&coll).ok_or_else(|| {
                    StoreError::Invalid(format!("capped collection {coll} was not opened"))
                })?;
                if bodies.len() != docs.len() {
                    return Err(StoreError::Invalid(format!(
                        "append to {coll}: {} documents and {} encodings",
                        docs.len(),
                        bodies.len()
                    )));
                }
                if let Some(rule) = &meta.validator
                    && docs.iter().any(|d| !rule.matches(d))
                {
                    return Err(refused(&coll, rule));
                }
                let hashes = if *indexed == *meta.indexes && hashes.len() == docs.len() {
                    hashes
                } else {
                    index_hashes(&coll, &meta.indexes, docs.iter())
                };
                if out.answer_append.is_none() {
                    out.answer_append = Some(out.appends.len());
                }
                out.appends.push((coll, docs, bodies, hashes));
                Ok(Reply::Positions(Vec::new()))
            }
            Op::Update { coll, updates } => {
                self.check_keyed(&coll)?;
                for u in &updates {
                    crate::names::check_key(&coll, &u.key)?;
                }
                for u in updates {
                    let current = self.read_kv(&coll, &u.key, group, out)?;
                    let doc = match &current {
                        Some(c) => update::apply_to_copy(&c.doc, u.update)?,
                        None => {
                            let mut d = Document::new();
                            d.insert("_id".into(), u.key.clone().into());
                            update::apply_owned(&mut d, u.update)?;
                            d
                        }
                    };
                    let op = if current.is_some() {
                        ChangeOp::Update
                    } else {
                        ChangeOp::Insert
                    };
                    self.write_kv(&coll, u.key, op, current, doc, now, group, out)?;
                }
                Ok(Reply::Done)
            }
            Op::Set { coll, key, mut doc } => {
                self.check_keyed(&coll)?;
                crate::names::check_key(&coll, &key)?;
                let current = self.read_kv(&coll, &key, group, out)?;
                doc.insert("_id".into(), key.clone().into());
                let op = if current.is_some() {
                    ChangeOp::Replace
                } else {
                    ChangeOp::Insert
                };
                self.write_kv(&coll, key, op, current, doc, now, group, out)?;
                Ok(Reply::Done)
            }
            Op::Delete { coll, key } => {
                self.check_keyed(&coll)?;
                crate::names::check_key(&coll, &key)?;
                let Some(before) = self.read_kv(&coll, &key, group, out)? else {
                    return Ok(Reply::Deleted(false));
                };
                self.delete_kv(&coll, key, before, group, out)?;
                Ok(Reply::Deleted(true))
            }
            Op::Expire {
                coll,
                prefix,
                before,
                limit,
            } => {
                self.check_keyed(&coll)?;
                let n = self.expire(&coll, &prefix, before, limit, group, out)?;
                Ok(Reply::Expired(n))
            }
            Op::Checkpoint { feed, body } => {
                crate::names::check_key("checkpoints", &feed)?;
                out.checkpoints.push((feed, body));
                Ok(Reply::Done)
            }
            Op::Spill { coll, docs } => {
                out.spills.push((coll, docs));
                Ok(Reply::Done)
            }
            Op::Barrier => Ok(Reply::Done),
            Op::Together(ops) => {
                let mut reply = None;
                for op in ops {
                    let r = self.stage(op, now, group, out)?;
                    if reply.is_none() && matches!(r, Reply::Positions(_)) {
                        reply = Some(r);
                    }
                }
                Ok(reply.unwrap_or(Reply::Done))
            }
        }
    }

    pub(super) fn check_keyed(&self, coll: &str) -> Result<()> {
        let catalog = self.catalog.lock().map_err(lock_err)?;
        match catalog.collections.get(coll) {
            Some(c) if c.kind == catalog::Kind::Keyed => Ok(()),
            _ => Err(StoreError::Invalid(format!(
                "keyed collection {coll} was not opened"
            ))),
        }
    }

    /// The current state of a key: staged by this job, by the group, cached, or in the tree.
    pub(super) fn read_kv(
        &self,
        coll: &str,
        key: &str,
        group: &Group,
        out: &JobOut,
    ) -> Result<Option<Kv>> {
        let k = KvRef(coll, key);
        if let Some(slot) = out.kv.get(&k).or_else(|| group.kv.get(&k)) {
            return Ok(slot.now.clone());
        }
        if let Some(kv) = self.cache.get(coll, key) {
            // Every test runs this check too: a cached document that is not the tree's would
            // be updated from a stale state.
            debug_assert_eq!(
                self.read_tree(coll, key).ok().flatten().map(|t| t.json),
                Some(kv.json.clone()),
                "the cache of keyed documents differs from the tree at {coll}/{key}"
            );
            return Ok(Some(kv.clone()));
        }
        if !self.known.may_hold(coll, key) {
            // Every test runs this check: a key the filter left out would be written as new.
            debug_assert!(
                matches!(self.read_tree(coll, key), Ok(None)),
                "the filter of stored keys left out {coll}/{key}"
            );
            return Ok(None);
        }
        self.read_tree(coll, key)
    }

    pub(super) fn read_tree(&self, coll: &str, key: &str) -> Result<Option<Kv>> {
        // At its own sequence number: its writes not yet shown to readers included.
        let Some(v) = self
            .tree
            .get_at(&tree::doc_key(coll, key), Tree::before(self.lsn))?
        else {
            return Ok(None);
        };
        let (ts, json) = tree::split_value(&v)?;
        let json = std::str::from_utf8(json).map_err(|_| StoreError::Engine {
            engine: "embedded",
            message: format!("keyed state: {coll}/{key} is not UTF-8"),
        })?;
        Ok(Some(Kv {
            doc: Arc::new(format::parse_doc(json.as_bytes())?),
            json: Arc::from(json),
            ts,
        }))
    }

    /// The write time the tree held for a key before this group (for its write-time index
    /// entry): as staged by the job or the group when they touched it, else `current`'s.
    pub(super) fn orig_ts(
        k: &KvRef<'_>,
        group: &Group,
        out: &JobOut,
        current: Option<&Kv>,
    ) -> Option<i64> {
        match out.kv.get(k).or_else(|| group.kv.get(k)) {
            Some(slot) => slot.orig_ts,
            None => current.map(|c| c.ts),
        }
    }

    /// Stages a key's new state in the job (its key is copied only the first time the job
    /// writes it: a source's summary is written for every event of a batch).
    pub(super) fn put_slot(out: &mut JobOut, coll: &str, key: &str, slot: Slot) {
        match out.kv.get_mut(&KvRef(coll, key)) {
            Some(staged) => *staged = slot,
            None => {
                out.kv.insert((coll.to_owned(), key.to_owned()), slot);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_kv(
        &self,
        coll: &str,
        key: String,
        op: ChangeOp,
        before: Option<Kv>,
        doc: Document,
        now: i64,
        group: &Group,
        out: &mut JobOut,
    ) -> Result<()> {
        if let Some(rule) = self.keyed_validators.get(coll)
            && !rule.matches(&doc)
        {
            return Err(refused(coll, rule));
        }
        let json = format::doc_json(&doc)?;
        let after = Kv {
            doc: Arc::new(doc),
            json,
            ts: now,
        };
        let orig_ts = Self::orig_ts(&KvRef(coll, &key), group, out, before.as_ref());
        Self::put_slot(
            out,
            coll,
            &key,
            Slot {
                now: Some(after.clone()),
                orig_ts,
            },
        );
        out.changes.push(StagedChange {
            op,
            coll: coll.to_owned(),
            key,
            before,
            after: Some(after),
        });
        Ok(())
    }

    pub(super) fn delete_kv(
        &self,
        coll: &str,
        key: String,
        before: Kv,
        group: &Group,
        out: &mut JobOut,
    ) -> Result<()> {
        let orig_ts = Self::orig_ts(&KvRef(coll, &key), group, out, Some(&before));
        Self::put_slot(out, coll, &key, Slot { now: None, orig_ts });
        out.changes.push(StagedChange {
            op: ChangeOp::Delete,
            coll: coll.to_owned(),
            key,
            before: Some(before),
            after: None,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::writer::cache::KvRef;

    /// A borrowed key finds what was staged under the owned one, and only that: if the two
    /// hashed differently, a job's second update of a key would not see its first.
    #[test]
    fn a_borrowed_key_finds_the_owned_one() {
        let mut m: KvMap = KvMap::default();
        for (c, k) in [
            ("rollups", "hashtags:東京"),
            ("rollups", "source:a"),
            ("r", "ollups"),
        ] {
            m.insert(
                (c.to_owned(), k.to_owned()),
                Slot {
                    now: None,
                    orig_ts: Some(k.len() as i64),
                },
            );
        }
        let ts = |c, k| m.get(&KvRef(c, k)).map(|s| s.orig_ts);
        assert_eq!(ts("rollups", "hashtags:東京"), Some(Some(15)));
        assert_eq!(ts("rollups", "source:a"), Some(Some(8)));
        assert_eq!(ts("r", "ollups"), Some(Some(6)));
        assert_eq!(ts("rollup", "ssource:a"), None);
        assert_eq!(ts("rollups", "hashtags:东京"), None);
    }
}
