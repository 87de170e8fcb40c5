//! The expiry of idle keys: the oldest-written keys of a prefix, by the write-time index.

use super::cache::{Kv, KvRef};
use super::core::Writer;
use super::stage::{Group, JobOut};
use crate::Result;
use crate::embedded::tree::{self, Tree};

impl Writer {
    /// Stages the deletes of up to `limit` keys of `coll` starting with `prefix` whose last
    /// write is older than `before`, oldest first.
    pub(super) fn expire(
        &self,
        coll: &str,
        prefix: &str,
        before: i64,
        limit: usize,
        group: &Group,
        out: &mut JobOut,
    ) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let tprefix = tree::time_prefix(coll);
        let last_bucket = tree::bucket(before);
        let seqno = Tree::before(self.lsn);
        let mut candidates: Vec<(i64, String, Kv)> = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        'scan: loop {
            let page = self.tree.page(&tprefix, after.as_deref(), 1024, seqno)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.to_vec());
            let full = page.len() == 1024;
            let mut bucket_of_page = 0;
            for (k, _) in page {
                let rest = &k[tprefix.len()..];
                if rest.len() < 8 {
                    continue;
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&rest[..8]);
                let bucket = u64::from_be_bytes(b);
                if bucket > last_bucket {
                    break 'scan;
                }
                // Once enough keys are found in older buckets, the rest are newer.
                if candidates.len() >= limit && bucket > bucket_of_page {
                    break 'scan;
                }
                bucket_of_page = bucket;
                let Ok(key) = std::str::from_utf8(&rest[8..]) else {
                    continue;
                };
                if !key.starts_with(prefix) {
                    continue;
                }
                let k = KvRef(coll, key);
                if out.kv.contains_key(&k) || group.kv.contains_key(&k) {
                    // Written (or deleted) by this group: not idle.
                    continue;
                }
                let Some(kv) = self.read_tree(coll, key)? else {
                    continue;
                };
                if kv.ts < before && tree::bucket(kv.ts) == bucket {
                    candidates.push((kv.ts, key.to_owned(), kv));
                }
            }
            if !full {
                break;
            }
        }
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        candidates.truncate(limit);
        let n = candidates.len() as u64;
        for (_, key, kv) in candidates {
            self.delete_kv(coll, key, kv, group, out)?;
        }
        Ok(n)
    }
}
