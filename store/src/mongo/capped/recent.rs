//! The documents this process appended lately, as the server acknowledged them: what a tail
//! on a server whose tailable cursors close after one batch reads instead of the server.
//!
//! Such a server (FerretDB 1.24) answers every re-open of a tail, `{_id: {$gt: last}}`, by
//! reading the whole collection into its own process: it pushes only equality down to its
//! backend. On a full collection of the realistic stream that is seconds per poll (2.8 s at
//! 79,000 documents on PostgreSQL), so a polling tail cannot keep up with 70 events/s however
//! it polls. The writer knows each document it stored and where, so a tail of the same
//! process takes the run after its last position from here, and reads the server only for
//! what is not here: another process's documents, a start from the oldest, a tail that fell
//! behind what is kept, and a quiet spell (see `tail.rs`). A run served from here is checked
//! against eviction as a server read would be (the oldest position kept), so a tail reports
//! [`crate::StoreError::PositionLost`] the same way either way.
//!
//! Only kept where tails poll; on MongoDB a tailable cursor stays open and this is not used.

use std::collections::VecDeque;
use std::sync::Mutex;

use mongodb::bson::{Document as BsonDoc, RawDocumentBuf};

/// At most this many documents are kept...
const MAX_DOCS: usize = 8192;
/// ...and at most this many bytes of them (BSON), so that large documents cannot make it
/// grow past a bound.
const MAX_BYTES: usize = 16 << 20;

/// A bounded run of stored documents by position, oldest first; positions increase but may
/// leave holes (an insert that failed in part is not recorded).
pub(crate) struct Recent {
    docs: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    docs: VecDeque<(u64, RawDocumentBuf)>,
    bytes: usize,
}

impl Recent {
    pub(crate) fn new() -> Self {
        Recent {
            docs: Mutex::new(Kept::default()),
        }
    }

    /// Records documents the server acknowledged at positions `first, first + 1, ..`
    /// (each with its `_id`). Positions at or above `first` recorded before are dropped:
    /// positions are handed out again only after a failed insert, whose documents are not
    /// on the server.
    pub(crate) fn stored<'a>(&self, first: u64, docs: impl Iterator<Item = &'a BsonDoc>) {
        let Ok(mut kept) = self.docs.lock() else {
            return;
        };
        while kept.docs.back().is_some_and(|(p, _)| *p >= first) {
            if let Some((_, d)) = kept.docs.pop_back() {
                kept.bytes -= d.as_bytes().len();
            }
        }
        for (i, d) in docs.enumerate() {
            let Ok(raw) = RawDocumentBuf::try_from(d) else {
                // Not representable (it was just sent, so this does not happen): a hole,
                // which sends the tail to the server.
                continue;
            };
            kept.bytes += raw.as_bytes().len();
            kept.docs.push_back((first + i as u64, raw));
        }
        while kept.docs.len() > MAX_DOCS || kept.bytes > MAX_BYTES {
            match kept.docs.pop_front() {
                Some((_, d)) => kept.bytes -= d.as_bytes().len(),
                None => break,
            }
        }
    }

    /// The documents at `after + 1, after + 2, ..` (at most `max`), as long as they follow
    /// one another: empty when `after + 1` is not kept.
    pub(crate) fn after(&self, after: u64, max: usize) -> Vec<(u64, BsonDoc)> {
        let Ok(kept) = self.docs.lock() else {
            return Vec::new();
        };
        let start = kept.docs.partition_point(|(p, _)| *p <= after);
        let mut out = Vec::new();
        for (want, (p, d)) in (after + 1..).zip(kept.docs.range(start..)) {
            if *p != want || out.len() >= max {
                break;
            }
            match BsonDoc::try_from(d) {
                Ok(doc) => out.push((*p, doc)),
                Err(_) => break,
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    fn docs(first: i64, n: i64) -> Vec<BsonDoc> {
        (first..first + n)
            .map(|i| doc! {"_id": i, "n": i})
            .collect()
    }

    fn positions(run: &[(u64, BsonDoc)]) -> Vec<u64> {
        run.iter().map(|(p, _)| *p).collect()
    }

    #[test]
    fn a_run_follows_its_position_and_stops_at_a_hole() {
        let r = Recent::new();
        r.stored(1, docs(1, 3).iter());
        // 4 and 5 failed; 6.. stored later.
        r.stored(6, docs(6, 2).iter());
        assert_eq!(positions(&r.after(0, 100)), vec![1, 2, 3]);
        assert_eq!(positions(&r.after(2, 100)), vec![3]);
        assert!(r.after(3, 100).is_empty(), "4 is a hole: the server says");
        assert_eq!(positions(&r.after(5, 100)), vec![6, 7]);
        assert_eq!(positions(&r.after(0, 2)), vec![1, 2], "at most max");
        assert!(r.after(7, 100).is_empty(), "nothing newer");
        assert_eq!(r.after(0, 1)[0].1, doc! {"_id": 1_i64, "n": 1_i64});
    }

    #[test]
    fn positions_handed_out_again_replace_what_was_kept_there() {
        let r = Recent::new();
        r.stored(1, docs(1, 5).iter());
        r.stored(4, [doc! {"_id": 4_i64, "n": 40_i64}].iter());
        assert_eq!(positions(&r.after(0, 100)), vec![1, 2, 3, 4]);
        assert_eq!(r.after(3, 1)[0].1.get_i64("n").unwrap(), 40);
    }

    #[test]
    fn it_keeps_the_newest_within_its_bounds() {
        let r = Recent::new();
        r.stored(1, docs(1, MAX_DOCS as i64 + 10).iter());
        assert!(r.after(9, 1).is_empty(), "the oldest ten are forgotten");
        assert_eq!(positions(&r.after(10, 1_000_000)).len(), MAX_DOCS);
        // A few large documents: bounded by bytes, not count.
        let big = "x".repeat(4 << 20);
        let large: Vec<BsonDoc> = (0..8)
            .map(|i| doc! {"_id": 100_000_i64 + i, "s": big.clone()})
            .collect();
        r.stored(100_000, large.iter());
        let kept = r.docs.lock().unwrap();
        assert!(kept.bytes <= MAX_BYTES, "{} bytes kept", kept.bytes);
        assert!(
            kept.docs.len() < 8,
            "{} large documents kept",
            kept.docs.len()
        );
    }
}
