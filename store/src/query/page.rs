//! One page of a capped collection's documents: those matching a filter, received in a time
//! range, oldest or newest first, continuing after a cursor. What `GET /api/events` serves.
//!
//! A page reads only the positions where the time range lies ([`Capped::time_span`]) and,
//! from the cursor on, only as far as it must: oldest first, a tail from the cursor stopped at
//! the newest document of the moment the page was asked; newest first, ranges read backwards
//! from the cursor in growing steps (256, 512, … documents), as
//! [`Capped::newest_matching`] scans back. A rare filter reads the whole span, as a query
//! does.

use std::sync::Arc;

use futures::StreamExt;

use crate::{Capped, Filter, Position, Record, Result, Start, TimeSpan};

/// Which end of the collection a page starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Oldest first: positions, and received times, ascending.
    Oldest,
    /// Newest first.
    Newest,
}

/// What a page asks for.
#[derive(Clone, Debug)]
pub struct PageRequest {
    pub filter: Filter,
    /// Received times (ms since the epoch, inclusive) the documents must have.
    pub received: Option<(i64, i64)>,
    pub order: Order,
    /// At most this many documents (at least 1).
    pub limit: usize,
    /// Continue after this position (oldest first: above it; newest first: below it).
    pub after: Option<Position>,
}

/// A page and what it cost.
#[derive(Clone, Debug)]
pub struct Page {
    pub records: Vec<Record>,
    /// Where the next page continues from (the last record's position), when this one is full.
    pub next: Option<Position>,
    /// Documents read to find them.
    pub read: u64,
}

/// The first read backwards, in documents; each next one doubles, up to [`MAX_STEP`].
const FIRST_STEP: u64 = 256;
const MAX_STEP: u64 = 16_384;

/// Reads one page of `coll`.
pub async fn page(coll: &Arc<dyn Capped>, req: &PageRequest) -> Result<Page> {
    let limit = req.limit.max(1);
    let mut out = Page {
        records: Vec::new(),
        next: None,
        read: 0,
    };
    let Some(bounds) = coll.bounds().await? else {
        return Ok(out);
    };
    // The positions to look at: the time range's span, within what is retained.
    let (mut lo, mut hi) = (bounds.oldest.0, bounds.newest.0);
    if let Some((from, to)) = req.received {
        if from > to {
            return Ok(out);
        }
        match coll.time_span(from, to).await? {
            Some(TimeSpan::Empty) => return Ok(out),
            Some(TimeSpan::Positions(a, b)) => (lo, hi) = (lo.max(a.0), hi.min(b.0)),
            None => {}
        }
    }
    let time_ok = |r: &Record| match req.received {
        None => true,
        // The span may hold documents outside the range: the filter's own date condition
        // decides, when the caller put one in; this keeps a range given apart from it exact.
        Some((from, to)) => crate::update::get_path(&r.doc, crate::RECEIVED_PATH)
            .and_then(crate::date::millis)
            .is_some_and(|ms| (from..=to).contains(&ms)),
    };
    let keep = |r: &Record| time_ok(r) && req.filter.matches(&r.doc);
    match req.order {
        Order::Oldest => {
            if let Some(after) = req.after {
                lo = lo.max(after.0.saturating_add(1));
            }
            if lo <= hi {
                let found = read_span(coll, bounds.oldest, lo, hi, limit, &keep).await?;
                out.read += found.read;
                out.records = found.records;
            }
        }
        Order::Newest => {
            if let Some(after) = req.after {
                hi = hi.min(after.0.saturating_sub(1));
            }
            let mut step = FIRST_STEP;
            while lo <= hi && out.records.len() < limit {
                let a = hi.saturating_sub(step - 1).max(lo);
                let found = read_span(coll, bounds.oldest, a, hi, usize::MAX, &keep).await?;
                out.read += found.read;
                out.records.extend(
                    found
                        .records
                        .into_iter()
                        .rev()
                        .take(limit - out.records.len()),
                );
                if a == lo {
                    break;
                }
                hi = a - 1;
                step = (step * 2).min(MAX_STEP);
            }
        }
    }
    if out.records.len() == limit {
        out.next = out.records.last().map(|r| r.position);
    }
    Ok(out)
}

/// What [`read_span`] found, and how many documents it read.
struct Found {
    records: Vec<Record>,
    read: u64,
}

/// The documents at positions `[from, to]` that `keep` keeps, oldest first, up to `limit` of
/// them: a tail from `from`, stopped at `to` (which exists: it is at most the newest).
async fn read_span(
    coll: &Arc<dyn Capped>,
    oldest: Position,
    from: u64,
    to: u64,
    limit: usize,
    keep: &(dyn Fn(&Record) -> bool + Sync),
) -> Result<Found> {
    let start = if from > oldest.0 {
        Start::After(Position(from - 1))
    } else {
        Start::Oldest
    };
    let mut found = Found {
        records: Vec::new(),
        read: 0,
    };
    let mut tail = coll.tail(start);
    while let Some(r) = tail.next().await {
        let r = r?;
        if r.position.0 > to {
            break;
        }
        found.read += 1;
        let last = r.position.0 == to;
        if keep(&r) {
            found.records.push(r);
            if found.records.len() == limit {
                break;
            }
        }
        if last {
            break;
        }
    }
    Ok(found)
}
