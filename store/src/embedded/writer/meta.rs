//! After a record is written: the segment table, seek points, index entries, and the sealed
//! segments' index files.

use std::collections::HashMap;
use std::sync::Arc;

use super::core::Writer;
use super::stage::Group;
use crate::embedded::journal::{self, Segment};
use crate::embedded::maint::Task;
use crate::embedded::state::{MemIndex, SEEK_EVERY, Seek, SegColl, SegIndex, SegInfo, Shared};

impl Writer {
    /// After a record was written: the segment table, seek points, index entries and the
    /// capped views readers use.
    pub(super) fn apply_journal_meta(
        &mut self,
        group: &Group,
        w: journal::Written,
        lsn: u64,
        oldest_after: &HashMap<String, (u64, usize, u64, u64)>,
    ) {
        let Ok(mut shared) = self.shared.write() else {
            return;
        };
        if w.rolled || !shared.segments.contains_key(&w.seq) {
            // The previous segment is finished: its index goes to a file (maintenance).
            if let Some((&prev, _)) = shared.segments.iter().next_back()
                && prev < w.seq
            {
                self.seal(&mut shared, prev);
            }
            match Segment::open(&*self.fs, &self.jdir, w.seq) {
                Ok(seg) => {
                    shared.segments.insert(
                        w.seq,
                        SegInfo {
                            seg,
                            first_lsn: lsn,
                            last_lsn: 0,
                            end: 0,
                            changes: (self.change_next, self.change_next),
                            colls: Default::default(),
                            index: SegIndex::Memory(MemIndex::default()),
                        },
                    );
                }
                Err(e) => {
                    self.poisoned = Some(format!("the journal's new segment cannot be read: {e}"));
                    return;
                }
            }
        }
        let end = self.journal.tail();
        let change_end = self.change_next + group.changes.len() as u64;
        let mut seeks: Vec<(String, Seek)> = Vec::new();
        let mut change_seek = None;
        {
            let Some(info) = shared.segments.get_mut(&w.seq) else {
                return;
            };
            if info.last_lsn == 0 {
                // Its first record (a segment recovered empty, made by a roll before a crash,
                // has had no number of its own until now).
                info.first_lsn = lsn;
            }
            info.last_lsn = lsn;
            info.end = end;
            if info.changes.0 == info.changes.1 {
                info.changes = (self.change_next, self.change_next);
            }
            info.changes.1 = change_end;
            for (coll, docs, _, hashes) in &group.appends {
                let Some(c) = self.capped.get_mut(coll.as_str()) else {
                    continue;
                };
                let first = c.next;
                let end_pos = first + docs.len() as u64;
                let oldest = oldest_after.get(coll.as_str()).map_or(c.oldest, |o| o.0);
                let sc = info.colls.entry(coll.clone()).or_insert(SegColl {
                    first,
                    end: first,
                    oldest_after: oldest,
                });
                sc.end = end_pos;
                sc.oldest_after = oldest;
                if let SegIndex::Memory(m) = &mut info.index {
                    for (i, hs) in hashes.iter().enumerate() {
                        for h in hs {
                            m.push(*h, first + i as u64);
                        }
                    }
                }
                let due = match c.last_seek {
                    Some((seq, off)) => seq != w.seq || w.offset >= off + SEEK_EVERY,
                    None => true,
                };
                if due {
                    c.last_seek = Some((w.seq, w.offset));
                    seeks.push((
                        coll.clone(),
                        Seek {
                            pos: first,
                            seq: w.seq,
                            off: w.offset,
                        },
                    ));
                }
            }
            if !group.changes.is_empty() {
                let due = match self.last_change_seek {
                    Some((seq, off)) => seq != w.seq || w.offset >= off + SEEK_EVERY,
                    None => true,
                };
                if due {
                    self.last_change_seek = Some((w.seq, w.offset));
                    change_seek = Some(Seek {
                        pos: self.change_next,
                        seq: w.seq,
                        off: w.offset,
                    });
                }
            }
        }
        for (coll, seek) in seeks {
            if let Some(v) = shared.capped.get_mut(&coll) {
                v.seeks.push_back(seek);
            }
        }
        if let Some(s) = change_seek {
            shared.change_seeks.push_back(s);
        }
    }

    /// Freezes segment `seq`'s index and asks for its file.
    pub(super) fn seal(&self, shared: &mut Shared, seq: u64) {
        let Some(info) = shared.segments.get_mut(&seq) else {
            return;
        };
        let SegIndex::Memory(m) =
            std::mem::replace(&mut info.index, SegIndex::Sealed(Arc::default()))
        else {
            return;
        };
        let entries = Arc::new(m.into_sorted());
        info.index = SegIndex::Sealed(entries.clone());
        let summary = crate::embedded::recover::summarize(shared, seq, &self.capped_sizes());
        if let Some(summary) = summary {
            let indexes = self
                .capped
                .iter()
                .filter(|(_, c)| !c.indexes.is_empty())
                .map(|(k, c)| (k.clone(), c.indexes.clone()))
                .collect();
            let _ = self.maint.send(Task::WriteIndex {
                path: journal::index_path(&self.jdir, seq),
                summary,
                entries,
                indexes,
            });
        }
    }

    /// Each capped collection's oldest position and sizes from it.
    pub(super) fn capped_sizes(&self) -> HashMap<String, (u64, Vec<u32>)> {
        self.capped
            .iter()
            .map(|(k, c)| (k.clone(), (c.oldest, c.sizes.iter().copied().collect())))
            .collect()
    }
}
