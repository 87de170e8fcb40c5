//! Reads of the engine: documents by position (from the journal, or the tree for documents
//! of released segments), changes by sequence number, index lookups, and the tail and change
//! streams that catch up from the journal and then follow the writer's in-memory broadcast.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast::error::RecvError;

use super::Inner;
use super::format::{Entry, Header, parse_doc, parse_paths};
use super::journal::{Segment, SegmentScan};
use super::state::{self, SegIndex};
use super::tree;
use crate::{
    Change, ChangeFilter, ChangeStart, ChangeStream, Document, Filter, KeyedDoc, KeyedSnapshot,
    NewestMatching, Position, Record, RecordStream, Result, ResumeToken, Start, StoreError,
};

/// Documents or changes read per catch-up step: bounds memory while a reader is far behind.
pub(super) const CATCH_UP_BATCH: usize = 512;
/// Stored bytes a catch-up step reads at most. A tail's step is sized by the collection's
/// average document size: a tail catching up holds three steps (the one its consumer takes
/// and two read ahead), so documents of tens of kilobytes would otherwise make that tens of
/// megabytes per reader; events of a few hundred bytes still go [`CATCH_UP_BATCH`] at a
/// time. A change stream's step ends at the journal record where the images read reach it.
const CATCH_UP_BYTES: u64 = 1 << 20;
/// Documents a catch-up step reads at least, however large they are.
const CATCH_UP_MIN: usize = 16;

/// How many documents of `coll` a tail's catch-up step reads (see [`CATCH_UP_BYTES`]).
fn catch_up_batch(inner: &Inner, coll: &str) -> Result<usize> {
    let shared = inner.shared.read().map_err(super::lock_err)?;
    let (count, bytes) = shared
        .capped
        .get(coll)
        .map_or((0, 0), |v| (v.count, v.bytes));
    Ok(batch_for(count, bytes))
}

/// [`catch_up_batch`] for a collection of `count` documents of `bytes` in all.
fn batch_for(count: u64, bytes: u64) -> usize {
    let average = bytes.checked_div(count).unwrap_or(0).max(1);
    usize::try_from(CATCH_UP_BYTES / average)
        .unwrap_or(usize::MAX)
        .clamp(CATCH_UP_MIN, CATCH_UP_BATCH)
}
/// Documents read per step while walking back for `newest_matching`, and per page of a
/// snapshot: bounds memory whatever the collection's size.
const PAGE_ROWS: usize = 256;

pub(super) fn parse_token(token: &ResumeToken) -> Result<u64> {
    token.0.parse().map_err(|_| {
        StoreError::Invalid(format!(
            "resume token {token:?} was not made by the embedded engine"
        ))
    })
}

/// The segments to read from seek point `seek` on, each with where its records end; the
/// first is the seek point's own, read from its offset. Taken under the same lock as the seek
/// point itself: a segment released in between would have the scan start the next segment at
/// the released one's offset, skipping what lies before it.
fn segments_from(shared: &state::Shared, seek: state::Seek) -> Vec<(Arc<Segment>, u64, u64)> {
    shared
        .segments
        .range(seek.seq..)
        .map(|(seq, i)| {
            let from = if *seq == seek.seq { seek.off } else { 0 };
            (i.seg.clone(), from, i.end)
        })
        .collect()
}

/// The documents of `coll` at positions `[from, to]` (fewer past `limit`), in order. Positions
/// no longer retained, or holding no document, are skipped.
pub(super) fn read_docs(
    inner: &Inner,
    coll: &str,
    from: u64,
    to: u64,
    limit: usize,
) -> Result<Vec<Record>> {
    read_docs_with(
        inner,
        coll,
        from,
        to,
        limit,
        &parse_doc,
        &mut ReadBuffers::default(),
    )
}

/// What [`read_docs_with`] reads the journal into, kept by a caller that reads again and
/// again (a query's reader), so that its memory is not allocated, zeroed and faulted in for
/// each thousand documents.
#[derive(Default)]
pub(super) struct ReadBuffers {
    records: Vec<u8>,
    block: Vec<u8>,
}

/// [`read_docs`], each document decoded by `decode` (whole, or only some fields).
pub(super) fn read_docs_with(
    inner: &Inner,
    coll: &str,
    from: u64,
    to: u64,
    limit: usize,
    decode: &dyn Fn(&[u8]) -> Result<Document>,
    bufs: &mut ReadBuffers,
) -> Result<Vec<Record>> {
    let (oldest, next, journal_from, segments) = {
        let shared = inner.shared.read().map_err(super::lock_err)?;
        let Some(v) = shared.capped.get(coll) else {
            return Ok(Vec::new());
        };
        let from = from.max(v.oldest).max(1);
        let segments = v
            .seek(from.max(v.journal_from))
            .map(|seek| segments_from(&shared, seek));
        (v.oldest, v.next, v.journal_from, segments)
    };
    let from = from.max(oldest).max(1);
    let to = to.min(next.saturating_sub(1));
    let mut out = Vec::new();
    if from > to || limit == 0 {
        return Ok(out);
    }
    if from < journal_from {
        let prefix = tree::spill_prefix(coll);
        let start = tree::spill_key(coll, from);
        let mut after: Option<Vec<u8>> = None;
        let first = inner.tree.get(&start)?.map(|v| (start.clone(), v));
        if let Some((k, v)) = first {
            push_spilled(&prefix, &k, &v, decode, &mut out)?;
            after = Some(k);
        } else {
            after.get_or_insert_with(|| {
                let mut k = prefix.clone();
                k.extend_from_slice(&from.saturating_sub(1).to_be_bytes());
                k
            });
        }
        while out.len() < limit {
            let page =
                inner
                    .tree
                    .page(&prefix, after.as_deref(), PAGE_ROWS, inner.tree.visible())?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.to_vec());
            let mut done = false;
            for (k, v) in &page {
                let pos = spilled_pos(&prefix, k);
                if pos >= journal_from || pos > to || out.len() >= limit {
                    done = true;
                    break;
                }
                push_spilled(&prefix, k, v, decode, &mut out)?;
            }
            if done || page.len() < PAGE_ROWS {
                break;
            }
        }
        out.retain(|r| r.position.0 >= from && r.position.0 <= to);
        if out.len() >= limit || to < journal_from {
            out.truncate(limit);
            return Ok(out);
        }
    }
    let from = from.max(journal_from);
    let Some(segments) = segments else {
        return Ok(out);
    };
    for (seg, start, end) in segments {
        let mut scan = SegmentScan::in_buffer(&seg, start, end, &mut bufs.records);
        while let Some((_, bytes)) = scan.next_raw()? {
            let h = Header::parse(bytes)?;
            for (si, s) in h.sections.iter().enumerate() {
                if s.coll != coll {
                    continue;
                }
                let (lo, hi) = (s.first, s.first + s.count as u64);
                if hi <= from {
                    continue;
                }
                if lo > to {
                    return Ok(out);
                }
                let base = h.section_entry(si);
                let want_lo = from.max(lo);
                let want_hi = (to + 1).min(hi);
                let (e_lo, e_hi) = (base + (want_lo - lo) as u32, base + (want_hi - lo) as u32);
                for (bi, _) in h.blocks_for(e_lo, e_hi) {
                    let data = h.block_into(bytes, bi, &mut bufs.block)?;
                    for e in h.entries(bi, data) {
                        let (index, entry) = e?;
                        if index < e_lo {
                            continue;
                        }
                        if index >= e_hi {
                            break;
                        }
                        if let Entry::Doc(json) = entry {
                            out.push(Record {
                                position: Position(lo + (index - base) as u64),
                                doc: Arc::new(decode(json)?),
                                committed_at_us: Some(h.ts),
                            });
                            if out.len() >= limit {
                                return Ok(out);
                            }
                        }
                    }
                }
                if want_hi > to {
                    return Ok(out);
                }
            }
        }
    }
    Ok(out)
}

/// Positions a scan's worker reads at a time.
const SCAN_CHUNK: u64 = 1024;

/// [`crate::Capped::scan`]: chunks of [`SCAN_CHUNK`] positions handed out in turn to a worker
/// per core queries may use ([`crate::query::threads`]), each a thread of its own
/// (`tailrace-query`) that reads and decodes its chunks in order; the stream takes the workers'
/// results in the same turn, so the documents come out in position order while the decoding,
/// most of a query's cost, runs on all those cores. The workers run at the lowest priority on
/// those cores ([`crate::query::as_query_thread`]): a query gives way to the writer, the feeds
/// and the ingester, and leaves them a core of their own.
pub(super) fn scan(
    inner: Arc<Inner>,
    coll: String,
    from: u64,
    to: u64,
    fields: Option<Arc<[String]>>,
) -> futures::stream::BoxStream<'static, Result<Vec<Record>>> {
    use futures::stream::{self, StreamExt};
    let workers = crate::query::threads() as u64;
    let start = async move {
        inner.caught_up().await?;
        let mut turns = Vec::new();
        for k in 0..workers {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<Record>>>(2);
            let (inner, coll, fields) = (inner.clone(), coll.clone(), fields.clone());
            let worker = move || {
                crate::query::as_query_thread();
                let paths = fields.as_deref().map(crate::query::only_paths);
                let decode = |json: &[u8]| match &paths {
                    Some(p) => parse_paths(json, p),
                    None => parse_doc(json),
                };
                let mut bufs = ReadBuffers::default();
                let mut lo = from.saturating_add(k * SCAN_CHUNK);
                while lo <= to {
                    let hi = lo.saturating_add(SCAN_CHUNK - 1).min(to);
                    let batch =
                        read_docs_with(&inner, &coll, lo, hi, usize::MAX, &decode, &mut bufs);
                    let failed = batch.is_err();
                    // The consumer stopped (a full $limit), or this worker's error ends it.
                    if tx.blocking_send(batch).is_err() || failed {
                        return;
                    }
                    lo = lo.saturating_add(workers * SCAN_CHUNK);
                }
            };
            std::thread::Builder::new()
                .name("tailrace-query".into())
                .spawn(worker)
                .map_err(|e| StoreError::Engine {
                    engine: "embedded",
                    message: format!("starting a query's reader: {e}"),
                })?;
            turns.push(rx);
        }
        Ok::<_, StoreError>(turns)
    };
    stream::once(start)
        .map(|started| match started {
            Ok(turns) => stream::unfold((turns, 0usize), |(mut turns, i)| async move {
                let n = turns.len();
                let batch = turns[i % n].recv().await?;
                Some((batch, (turns, i + 1)))
            })
            .boxed(),
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        })
        .flatten()
        .boxed()
}

fn spilled_pos(prefix: &[u8], k: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = k.get(prefix.len()..prefix.len() + 8) {
        b.copy_from_slice(s);
    }
    u64::from_be_bytes(b)
}

fn push_spilled(
    prefix: &[u8],
    k: &[u8],
    v: &[u8],
    decode: &dyn Fn(&[u8]) -> Result<Document>,
    out: &mut Vec<Record>,
) -> Result<()> {
    let (ts, json) = tree::split_value(v)?;
    out.push(Record {
        position: Position(spilled_pos(prefix, k)),
        doc: Arc::new(decode(json)?),
        committed_at_us: Some(ts),
    });
    Ok(())
}

/// [`capped_after`] on a storage thread, started at once. `spent` are documents of an
/// earlier batch its consumer is done with: they are dropped there first, so the thread that
/// allocated them frees them and the decode reuses their memory, where a consumer on another
/// thread would hand each block back across threads.
fn read_capped_after(
    inner: &Arc<Inner>,
    coll: &str,
    after: Option<u64>,
    limit: usize,
    spent: Vec<Arc<Document>>,
) -> impl Future<Output = Result<Vec<Record>>> + use<> {
    let coll = coll.to_owned();
    inner.read_started(move |i| {
        drop(spent);
        capped_after(i, &coll, after, limit)
    })
}

/// The next `limit` documents after `after` (from the oldest when `None`), or `PositionLost`
/// when the one right after `after` was evicted.
fn capped_after(
    inner: &Inner,
    coll: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<Record>> {
    let (oldest, next) = {
        let shared = inner.shared.read().map_err(super::lock_err)?;
        shared
            .capped
            .get(coll)
            .map_or((1, 1), |v| (v.oldest, v.next))
    };
    if let Some(after) = after
        && oldest > after + 1
        && next > oldest
    {
        return Err(StoreError::PositionLost {
            collection: coll.to_string(),
            after: Position(after),
            oldest: Position(oldest),
        });
    }
    let from = after.map_or(oldest, |a| a + 1);
    let batch = read_docs(inner, coll, from, u64::MAX, limit)?;
    // Evicted while being read: the reader is overtaken after all.
    if let (Some(after), Some(first)) = (after, batch.first())
        && first.position.0 > after + 1
    {
        let oldest = inner
            .shared
            .read()
            .map_err(super::lock_err)?
            .capped
            .get(coll)
            .map_or(1, |v| v.oldest);
        if oldest > after + 1 {
            return Err(StoreError::PositionLost {
                collection: coll.to_string(),
                after: Position(after),
                oldest: Position(oldest),
            });
        }
    }
    Ok(batch)
}

/// The `limit` newest documents of `coll` matching `filter`, walking back from the newest in
/// chunks of [`PAGE_ROWS`].
pub(super) fn newest_matching(
    inner: &Inner,
    coll: &str,
    filter: &Filter,
    limit: usize,
) -> Result<NewestMatching> {
    let (oldest, next) = {
        let shared = inner.shared.read().map_err(super::lock_err)?;
        shared
            .capped
            .get(coll)
            .map_or((1, 1), |v| (v.oldest, v.next))
    };
    if next <= oldest {
        return Ok(NewestMatching {
            records: Vec::new(),
            as_of: None,
        });
    }
    let newest = next - 1;
    let mut records = Vec::new();
    let mut hi = newest;
    while records.len() < limit {
        let lo = hi.saturating_sub(PAGE_ROWS as u64 - 1).max(oldest);
        let chunk = read_docs(inner, coll, lo, hi, usize::MAX)?;
        for r in chunk.into_iter().rev() {
            if filter.matches(&r.doc) {
                records.push(r);
                if records.len() == limit {
                    break;
                }
            }
        }
        if lo <= oldest {
            break;
        }
        hi = lo - 1;
    }
    Ok(NewestMatching {
        records,
        as_of: Some(Position(newest)),
    })
}

/// The `limit` newest documents of `coll` whose `field` equals `value`, from the index.
pub(super) fn latest(
    inner: &Inner,
    coll: &str,
    field: &str,
    value: &serde_json::Value,
    limit: usize,
) -> Result<Vec<Record>> {
    let Some(canonical) = state::canonical(Some(value)) else {
        return Ok(Vec::new());
    };
    let hash = state::index_hash(coll, field, &canonical);
    // Segments newest first: positions only grow along the journal, so once `limit` matches
    // are found no older segment can hold a newer one.
    let (segs, oldest) = {
        let shared = inner.shared.read().map_err(super::lock_err)?;
        let Some(v) = shared.capped.get(coll) else {
            return Ok(Vec::new());
        };
        let segs: Vec<u64> = shared
            .segments
            .iter()
            .rev()
            .filter(|(_, i)| i.colls.contains_key(coll))
            .map(|(seq, _)| *seq)
            .collect();
        (segs, v.oldest)
    };
    let mut found: Vec<Record> = Vec::new();
    let mut candidates: Vec<u64> = Vec::new();
    for seq in &segs {
        candidates.clear();
        {
            let shared = inner.shared.read().map_err(super::lock_err)?;
            let Some(info) = shared.segments.get(seq) else {
                continue;
            };
            match &info.index {
                SegIndex::File { path, entries } => {
                    let (path, entries) = (path.clone(), *entries);
                    drop(shared);
                    SegIndex::File { path, entries }.lookup(&*inner.fs, hash, &mut candidates)?;
                }
                other => other.lookup(&*inner.fs, hash, &mut candidates)?,
            }
        }
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        candidates.retain(|p| *p >= oldest);
        // The next candidates that could complete the answer, read together when they lie
        // close (a value most documents have), one by one when they lie far apart.
        let mut i = 0;
        while i < candidates.len() {
            let j = (i + limit - found.len()).min(candidates.len());
            let (hi, lo) = (candidates[i], candidates[j - 1]);
            let docs = if hi - lo <= 4 * (j - i) as u64 + 64 {
                read_docs(inner, coll, lo, hi, usize::MAX)?
            } else {
                // Oldest first, as a range read returns them.
                let mut docs = Vec::with_capacity(j - i);
                for &pos in candidates[i..j].iter().rev() {
                    docs.extend(read_docs(inner, coll, pos, pos, 1)?);
                }
                docs
            };
            for r in docs.into_iter().rev() {
                if candidates[i..j].contains(&r.position.0)
                    && state::canonical(crate::update::get_path(&r.doc, field)).as_deref()
                        == Some(canonical.as_slice())
                {
                    found.push(r);
                    // Every position an older segment holds is smaller.
                    if found.len() >= limit {
                        return Ok(found);
                    }
                }
            }
            i = j;
        }
    }
    // Documents of released segments, kept in the tree: few, read whole. Where the tree ends
    // is read now, not with the segments: a segment released since (skipped above) moved its
    // documents there first, and a document read from its segment before may be there too.
    let journal_from = {
        let shared = inner.shared.read().map_err(super::lock_err)?;
        shared.capped.get(coll).map_or(oldest, |v| v.journal_from)
    };
    if oldest < journal_from {
        let seen: std::collections::HashSet<u64> = found.iter().map(|r| r.position.0).collect();
        for r in read_docs(inner, coll, oldest, journal_from - 1, usize::MAX)? {
            if !seen.contains(&r.position.0)
                && state::canonical(crate::update::get_path(&r.doc, field)).as_deref()
                    == Some(canonical.as_slice())
            {
                found.push(r);
            }
        }
        found.sort_unstable_by_key(|r| std::cmp::Reverse(r.position));
    }
    found.truncate(limit);
    Ok(found)
}

/// The change log's logical bounds: the oldest retained sequence number (the history keeps
/// `oplog_max_entries`) and the next one.
fn change_bounds(inner: &Inner) -> Result<(u64, u64)> {
    let shared = inner.shared.read().map_err(super::lock_err)?;
    let next = shared.change_next;
    let oldest = shared
        .change_first
        .max(next.saturating_sub(inner.oplog_max))
        .max(1);
    Ok((oldest, next))
}

/// The next changes after `after` that `filter` admits, and the sequence number of the last
/// one read, admitted or not; or `HistoryLost` when the one right after `after` is gone.
/// The images of an entry the filter does not admit are never parsed. Reads whole journal
/// records until `max` changes are read or the images parsed reach `max_bytes` (stored
/// bytes), so at least one record's.
pub(super) fn changes_after(
    inner: &Inner,
    after: Option<u64>,
    filter: &ChangeFilter,
    max: usize,
    max_bytes: u64,
) -> Result<(Vec<Change>, Option<u64>)> {
    let (oldest, next) = change_bounds(inner)?;
    if let Some(after) = after
        && oldest > after + 1
        && next > oldest
    {
        return Err(StoreError::HistoryLost {
            token: ResumeToken(after.to_string()),
            oldest: ResumeToken(oldest.to_string()),
        });
    }
    let from = after.map_or(oldest, |a| (a + 1).max(oldest));
    let mut changes = Vec::new();
    let mut last = None;
    if from >= next {
        return Ok((changes, last));
    }
    let segments = {
        let shared = inner.shared.read().map_err(super::lock_err)?;
        shared
            .change_seek(from)
            .map(|seek| segments_from(&shared, seek))
    };
    let Some(segments) = segments else {
        return Ok((changes, last));
    };
    let mut read = 0usize;
    let mut image_bytes = 0u64;
    'segments: for (seg, start, end) in segments {
        let mut scan = SegmentScan::new(&seg, start, end);
        while let Some((_, bytes)) = scan.next_raw()? {
            let h = Header::parse(bytes)?;
            if h.change_count == 0 || h.change_first + (h.change_count as u64) <= from {
                continue;
            }
            let docs = h.docs();
            let (c_lo, c_hi) = (docs, docs + h.change_count);
            for (bi, _) in h.blocks_for(c_lo, c_hi) {
                let data = h.block(bytes, bi)?;
                for e in h.entries(bi, &data) {
                    let (index, entry) = e?;
                    if index < c_lo {
                        continue;
                    }
                    if index >= c_hi {
                        break;
                    }
                    let Entry::Change(c) = entry else { continue };
                    let seq = h.change_first + (index - c_lo) as u64;
                    if seq < from {
                        continue;
                    }
                    if seq >= next {
                        // Written, not yet shown to readers (not yet synced).
                        break 'segments;
                    }
                    last = Some(seq);
                    read += 1;
                    if filter.admits(c.coll, c.op, c.key) {
                        let before = match c.before {
                            Some(b) if filter.wants_before(c.op) => {
                                image_bytes += b.len() as u64;
                                Some(Arc::new(parse_doc(b)?))
                            }
                            _ => None,
                        };
                        image_bytes += c.after.map_or(0, |a| a.len() as u64);
                        let change = Change {
                            op: c.op,
                            collection: c.coll.to_owned(),
                            key: c.key.to_owned(),
                            before,
                            after: c.after.map(parse_doc).transpose()?.map(Arc::new),
                            token: ResumeToken(seq.to_string()),
                            committed_at_us: h.ts,
                        };
                        changes.push(change);
                    }
                }
            }
            if read >= max || image_bytes >= max_bytes {
                break 'segments;
            }
        }
    }
    Ok((changes, last))
}

pub(super) fn tail_stream(
    inner: Arc<Inner>,
    coll: String,
    newest: Arc<AtomicU64>,
    start: Start,
) -> RecordStream {
    // Subscribe before reading the journal: every commit after this point is either read or
    // in the broadcast, so nothing falls in between. Done here, not in the stream, so that
    // `Start::Now` means when `tail` was called, not its first poll.
    let subscribed = inner.subscribe();
    let mut last: Option<u64> = match start {
        Start::Oldest => None,
        Start::After(p) => Some(p.0),
        Start::Now => Some(newest.load(Ordering::Acquire)),
    };
    Box::pin(async_stream::try_stream! {
        let mut live = subscribed?;
        // A caller's own writes first (shown once synced).
        inner.caught_up().await?;
        loop {
            // Reads in flight, each with the position it reads after. Catching up, two
            // batches are read at once on storage threads while the consumer takes a third:
            // decoding is the slower half, and two threads of it keep the consumer busy.
            let mut reading = std::collections::VecDeque::new();
            let step = catch_up_batch(&inner, &coll)?;
            reading.push_back((last, read_capped_after(&inner, &coll, last, step, Vec::new())));
            // The documents of the batch handed over before the current one: the consumer
            // has asked for the current batch, so it is done with them.
            let mut handed: Vec<Arc<Document>> = Vec::new();
            while let Some((after, read)) = reading.pop_front() {
                if after != last {
                    // Started beyond the batch before, which ended short after all: read
                    // again from where the consumer is.
                    reading.clear();
                    reading.push_back((last, read_capped_after(&inner, &coll, last, step, Vec::new())));
                    continue;
                }
                let batch = read.await?;
                let Some(end) = batch.last().map(|r| r.position.0) else {
                    break;
                };
                if batch.len() < step {
                    // The end (for now): a read started beyond it would leave a hole should
                    // documents arrive meanwhile, and waiting for it gains nothing.
                    reading.clear();
                }
                let mut spent = std::mem::replace(
                    &mut handed,
                    batch.iter().map(|r| r.doc.clone()).collect(),
                );
                // Positions are dense: a full batch ends `step` after its start.
                let mut from = reading
                    .back()
                    .map_or(end, |(a, _)| a.map_or(end, |a| a + step as u64));
                while reading.len() < 2 {
                    let spent = std::mem::take(&mut spent);
                    reading.push_back((
                        Some(from),
                        read_capped_after(&inner, &coll, Some(from), step, spent),
                    ));
                    from += step as u64;
                }
                for record in batch {
                    last = Some(record.position.0);
                    yield record;
                }
            }
            // Caught up: nothing read ahead or handed over is kept while following live.
            drop(reading);
            drop(handed);
            'live: loop {
                match live.recv().await {
                    Ok(commit) => {
                        if commit.elided.as_ref().is_some_and(|e| e.collections.contains(&coll)) {
                            // Sent without its documents: read them from the journal.
                            break 'live;
                        }
                        for (name, append) in &commit.appended {
                            if *name != coll {
                                continue;
                            }
                            for (i, doc) in append.docs.iter().enumerate() {
                                let p = append.first + i as u64;
                                match last {
                                    Some(l) if p <= l => continue,
                                    // Not the next one: read the journal to fill the hole.
                                    Some(l) if p != l + 1 => break 'live,
                                    None => break 'live,
                                    _ => {}
                                }
                                last = Some(p);
                                yield Record {
                                    position: Position(p),
                                    doc: doc.clone(),
                                    committed_at_us: Some(commit.committed_at_us),
                                };
                            }
                        }
                    }
                    // Fell behind the broadcast: read the journal until caught up again.
                    Err(RecvError::Lagged(_)) => break 'live,
                    Err(RecvError::Closed) => Err(StoreError::Closed)?,
                }
            }
        }
    })
}

pub(super) fn change_stream(
    inner: Arc<Inner>,
    filter: ChangeFilter,
    start: ChangeStart,
) -> ChangeStream {
    let filter = Arc::new(filter);
    // Eager for the same reason as `tail_stream`.
    let subscribed = match inner.subscribe() {
        Ok(s) => s,
        Err(e) => return ChangeStream::failed(e),
    };
    let resolved = match &start {
        ChangeStart::Oldest => None,
        ChangeStart::After(t) => match parse_token(t) {
            Ok(seq) => Some(seq),
            Err(e) => return ChangeStream::failed(e),
        },
        ChangeStart::Now => Some(inner.written_op.load(Ordering::Acquire)),
    };
    let read_up_to: Arc<Mutex<Option<ResumeToken>>> = Arc::new(Mutex::new(
        resolved
            .filter(|s| *s > 0)
            .map(|s| ResumeToken(s.to_string())),
    ));
    let cell = read_up_to.clone();
    // Set just before a change is handed over (or when the filter skips it): the consumer
    // reads the cell between polls, when every change it received is processed, so a
    // checkpoint taken then may resume after it.
    let advance = move |seq: u64| {
        if let Ok(mut t) = cell.lock() {
            *t = Some(ResumeToken(seq.to_string()));
        }
    };
    let inner_stream = async_stream::try_stream! {
        let mut live = subscribed;
        let mut last: Option<u64> = resolved;
        inner.caught_up().await?;
        loop {
            loop {
                let admitted = filter.clone();
                let (batch, read_to) = inner
                    .read(move |i| changes_after(i, last, &admitted, CATCH_UP_BATCH, CATCH_UP_BYTES))
                    .await?;
                let Some(read_to) = read_to else {
                    break;
                };
                for change in batch {
                    let seq = parse_token(&change.token)?;
                    advance(seq);
                    if filter.matches(&change) {
                        yield change;
                    }
                }
                // The entries after the last one handed over were not admitted.
                last = Some(read_to);
                advance(read_to);
            }
            'live: loop {
                match live.recv().await {
                    Ok(commit) => {
                        if commit.elided.as_ref().is_some_and(|e| e.changes) {
                            // Sent without its changes: read them from the journal.
                            break 'live;
                        }
                        for change in &commit.changes {
                            let seq = change.seq;
                            match last {
                                Some(l) if seq <= l => continue,
                                Some(l) if seq != l + 1 => break 'live,
                                None => break 'live,
                                _ => {}
                            }
                            last = Some(seq);
                            advance(seq);
                            if change.matches(&filter) {
                                yield change.to_change(&filter, commit.committed_at_us);
                            }
                        }
                    }
                    Err(RecvError::Lagged(_)) => break 'live,
                    Err(RecvError::Closed) => Err(StoreError::Closed)?,
                }
            }
        }
    };
    ChangeStream::new(Box::pin(inner_stream), read_up_to)
}

/// At most `limit` documents of keyed collection `coll` whose key starts with `prefix` and
/// sorts after `after`, at `seqno`.
pub(super) fn scan_page(
    inner: &Inner,
    coll: &str,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
    seqno: u64,
) -> Result<Vec<KeyedDoc>> {
    let mut p = tree::doc_prefix(coll);
    let base = p.len();
    p.extend_from_slice(prefix.as_bytes());
    let after_key = after
        .filter(|a| *a >= prefix)
        .map(|a| tree::doc_key(coll, a));
    let page = inner.tree.page(&p, after_key.as_deref(), limit, seqno)?;
    page.into_iter()
        .map(|(k, v)| {
            let key = std::str::from_utf8(&k[base..])
                .map_err(|_| StoreError::Engine {
                    engine: "embedded",
                    message: "keyed state: a key that is not UTF-8".into(),
                })?
                .to_owned();
            let (_, json) = tree::split_value(&v)?;
            Ok(KeyedDoc {
                key,
                doc: parse_doc(json)?,
            })
        })
        .collect()
}

/// A snapshot of a keyed collection: the tree read at one sequence number (held, so the tree
/// keeps the versions it sees), and the change token of that moment.
pub(super) async fn snapshot(
    inner: Arc<Inner>,
    coll: String,
    filter: Option<Filter>,
) -> Result<KeyedSnapshot> {
    let filter = filter.filter(|f| !f.is_match_all());
    inner.caught_up().await?;
    let (seqno, token, hold) = inner.snapshot_point()?;
    let docs = async_stream::try_stream! {
        let _hold = hold;
        let mut after: Option<String> = None;
        loop {
            let (c, a, i) = (coll.clone(), after.clone(), inner.clone());
            let page = inner
                .read(move |_| scan_page(&i, &c, "", a.as_deref(), PAGE_ROWS, seqno))
                .await?;
            let full = page.len() == PAGE_ROWS;
            after = page.last().map(|d| d.key.clone());
            for doc in page {
                if filter.as_ref().is_none_or(|f| f.matches(&doc.doc)) {
                    yield doc;
                }
            }
            if !full {
                break;
            }
        }
    };
    Ok(KeyedSnapshot {
        token: ResumeToken(token.to_string()),
        docs: Box::pin(docs),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A read plans its segments under the lock it took its seek point under. When the seek
    /// point's segment is gone (released by the time the segments were listed, as could
    /// happen between two acquisitions of the lock), the next segment is read from its
    /// start, never from the gone one's offset.
    #[test]
    fn a_seek_points_own_segment_is_the_only_one_read_from_its_offset() {
        use super::super::journal::Segment;
        use super::super::state::{MemIndex, Seek, SegIndex, SegInfo, Shared};
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::embedded::fs::RealFs;
        let mut shared = Shared::default();
        for seq in [2u64, 3] {
            std::fs::write(dir.path().join(format!("{seq:016x}.log")), [0u8; 8]).unwrap();
            shared.segments.insert(
                seq,
                SegInfo {
                    seg: Segment::open(&fs, dir.path(), seq).unwrap(),
                    first_lsn: seq,
                    last_lsn: seq,
                    end: 8192,
                    changes: (0, 0),
                    colls: Default::default(),
                    index: SegIndex::Memory(MemIndex::default()),
                },
            );
        }
        let plan = |seq, off| -> Vec<(u64, u64)> {
            segments_from(&shared, Seek { pos: 1, seq, off })
                .into_iter()
                .map(|(seg, from, _)| (seg.seq, from))
                .collect()
        };
        assert_eq!(plan(2, 4096), vec![(2, 4096), (3, 0)]);
        assert_eq!(plan(1, 4096), vec![(2, 0), (3, 0)], "segment 1 is gone");
    }

    /// Events of a few hundred bytes go 512 at a time; large documents fewer, their bytes
    /// bounded; huge ones at least 16; an empty collection as events.
    #[test]
    fn a_catch_up_step_is_bounded_by_bytes() {
        assert_eq!(batch_for(0, 0), CATCH_UP_BATCH);
        assert_eq!(batch_for(100_000, 43_000_000), CATCH_UP_BATCH);
        let step = batch_for(2_000, 2_000 * 24_000);
        assert_eq!(step, 43);
        assert!(step as u64 * 24_000 <= CATCH_UP_BYTES);
        assert_eq!(batch_for(10, 10 << 24), CATCH_UP_MIN);
    }

    /// A change stream catching up over large images reads about [`CATCH_UP_BYTES`] of them a
    /// step, not [`CATCH_UP_BATCH`] changes, and its steps still cover every change once.
    #[tokio::test]
    async fn a_change_catch_up_step_is_bounded_by_bytes() {
        use crate::{Durability, KeyUpdate, Store, Update};
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::EmbeddedStore::open(dir.path(), Default::default()).unwrap();
        let k = store.keyed("rollups").await.unwrap();
        let body = "東京の雨 🦀 مرحبا ".repeat(1_000);
        for i in 0..200u64 {
            let update = Update::default()
                .and_set("body", body.clone())
                .and_set("i", i);
            k.update(
                vec![KeyUpdate::new(format!("k{}", i % 8), update)],
                Durability::Acknowledged,
            )
            .await
            .unwrap();
        }
        let all = ChangeFilter::default();
        let mut after = None;
        let mut seen = 0u64;
        let mut steps = 0;
        while let (batch, Some(read_to)) =
            changes_after(&store.inner, after, &all, CATCH_UP_BATCH, CATCH_UP_BYTES).unwrap()
        {
            let bytes: usize = batch
                .iter()
                .filter_map(|c| c.after.as_ref())
                .map(|d| serde_json::to_string(&**d).unwrap().len())
                .sum();
            // One commit's changes past the bound at most.
            assert!(
                bytes as u64 <= CATCH_UP_BYTES + 2 * body.len() as u64,
                "{bytes} bytes"
            );
            for c in &batch {
                assert_eq!(c.after.as_ref().unwrap()["i"], serde_json::json!(seen));
                seen += 1;
            }
            after = Some(read_to);
            steps += 1;
        }
        assert_eq!(seen, 200, "every change once");
        assert!(steps >= 4, "{steps} steps of ~{} KB", CATCH_UP_BYTES >> 10);
        store.close().await.unwrap();
    }
}
