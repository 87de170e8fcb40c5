//! Reads of the embedded engine: point reads, index queries, and the tail / change streams
//! that catch up from the tables and then follow the writer's in-memory commit broadcast.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, ToSql, params};
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;

use super::Inner;
use super::schema::{self, capped_table};
use crate::{
    Bounds, Change, ChangeFilter, ChangeOp, ChangeStart, ChangeStream, Document, Filter, KeyedDoc,
    KeyedSnapshot, NewestMatching, Position, Record, RecordStream, Result, ResumeToken, Start,
    StoreError,
};

/// Rows fetched per catch-up query: bounds memory while a reader is far behind.
const CATCH_UP_BATCH: usize = 512;
/// Rows read per step while walking back for `newest_matching`, and per page of a snapshot:
/// bounds memory whatever the collection's size.
const PAGE_ROWS: usize = 256;

fn parse_doc(body: &str) -> Result<Document> {
    Ok(serde_json::from_str(body)?)
}

pub(super) fn parse_token(token: &ResumeToken) -> Result<u64> {
    token.0.parse().map_err(|_| {
        StoreError::Invalid(format!(
            "resume token {token:?} was not made by the embedded engine"
        ))
    })
}

pub(super) fn get_record(
    c: &Connection,
    table: &str,
    position: Position,
) -> Result<Option<Record>> {
    c.query_row(
        &format!("SELECT pos, body, ts FROM {table} WHERE pos = ?1"),
        [position.0 as i64],
        |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        },
    )
    .optional()?
    .map(|(pos, body, ts)| {
        Ok(Record {
            position: Position(pos as u64),
            doc: parse_doc(&body)?,
            committed_at_us: Some(ts),
        })
    })
    .transpose()
}

/// A JSON scalar as the SQL value `json_extract` returns for it.
fn sql_value(value: &Value) -> Result<Box<dyn ToSql + Send>> {
    Ok(match value {
        Value::String(s) => Box::new(s.clone()),
        Value::Bool(b) => Box::new(*b as i64),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Box::new(i),
            None => Box::new(n.as_f64().unwrap_or(f64::NAN)),
        },
        other => {
            return Err(StoreError::Invalid(format!(
                "latest() compares scalars only, not {other}"
            )));
        }
    })
}

pub(super) fn latest(
    c: &Connection,
    table: &str,
    field: &str,
    value: &Value,
    limit: usize,
) -> Result<Vec<Record>> {
    schema::check_field(field)?;
    let value = sql_value(value)?;
    let mut stmt = c.prepare_cached(&format!(
        "SELECT pos, body, ts FROM {table} WHERE {} = ?1 ORDER BY pos DESC LIMIT ?2",
        schema::field_sql(c, table, field)?
    ))?;
    let rows = stmt.query_map(params![value, limit as i64], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    rows.map(|row| {
        let (pos, body, ts) = row?;
        Ok(Record {
            position: Position(pos as u64),
            doc: parse_doc(&body)?,
            committed_at_us: Some(ts),
        })
    })
    .collect()
}

/// The query plan of `latest` on `field` (tests assert that the index is used).
pub fn explain_latest(c: &Connection, coll: &str, field: &str) -> Result<String> {
    schema::check_field(field)?;
    let table = capped_table(coll);
    let mut stmt = c.prepare(&format!(
        "EXPLAIN QUERY PLAN SELECT pos, body, ts FROM {table} WHERE {} = ?1 ORDER BY pos DESC LIMIT 20",
        schema::field_sql(c, &table, field)?
    ))?;
    let rows = stmt.query_map(["x"], |r| r.get::<_, String>(3))?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?.join("; "))
}

/// The oldest and newest positions of a capped table. Two scalar subqueries, each a seek
/// to one end of the rowid B-tree: SQLite turns a lone `MIN(pos)` or `MAX(pos)` into a seek,
/// but `SELECT MIN(pos), MAX(pos)` into a scan of the whole table, which every tailable feed
/// ran twice a second (its lag and its headroom) and which grew with the collection.
pub(super) fn bounds(c: &Connection, table: &str) -> Result<Option<Bounds>> {
    let (lo, hi): (Option<i64>, Option<i64>) = c
        .prepare_cached(&bounds_sql(table))?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(lo.zip(hi).map(|(lo, hi)| Bounds {
        oldest: Position(lo as u64),
        newest: Position(hi as u64),
    }))
}

fn bounds_sql(table: &str) -> String {
    format!("SELECT (SELECT MIN(pos) FROM {table}), (SELECT MAX(pos) FROM {table})")
}

pub(super) fn scan(c: &Connection, coll: &str, prefix: &str) -> Result<Vec<KeyedDoc>> {
    // Keys in [prefix, prefix + U+10FFFF) share the prefix; this keeps the primary key usable.
    let upper = format!("{prefix}\u{10FFFF}");
    let mut stmt = c.prepare_cached(
        "SELECT key, body FROM kv WHERE coll = ?1 AND key >= ?2 AND key < ?3 ORDER BY key",
    )?;
    let rows = stmt.query_map(params![coll, prefix, upper], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    rows.map(|row| {
        let (key, body) = row?;
        Ok(KeyedDoc {
            key,
            doc: parse_doc(&body)?,
        })
    })
    .collect()
}

/// The `limit` newest documents matching `filter`, walking back from the newest in chunks of
/// [`PAGE_ROWS`], all in one read transaction so `as_of` and the rows agree.
pub(super) fn newest_matching(
    c: &Connection,
    table: &str,
    filter: &Filter,
    limit: usize,
) -> Result<NewestMatching> {
    let tx = c.unchecked_transaction()?;
    let newest: Option<i64> =
        tx.query_row(&format!("SELECT MAX(pos) FROM {table}"), [], |r| r.get(0))?;
    let Some(newest) = newest else {
        return Ok(NewestMatching {
            records: Vec::new(),
            as_of: None,
        });
    };
    let mut records = Vec::new();
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT pos, body, ts FROM {table} WHERE pos <= ?1 ORDER BY pos DESC LIMIT ?2"
    ))?;
    let mut below = newest;
    while records.len() < limit {
        let rows = stmt
            .query_map(params![below, PAGE_ROWS as i64], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let Some(&(last, _, _)) = rows.last() else {
            break;
        };
        let full = rows.len() == PAGE_ROWS;
        for (pos, body, ts) in rows {
            let doc = parse_doc(&body)?;
            if filter.matches(&doc) {
                records.push(Record {
                    position: Position(pos as u64),
                    doc,
                    committed_at_us: Some(ts),
                });
                if records.len() == limit {
                    break;
                }
            }
        }
        if !full {
            break;
        }
        below = last - 1;
    }
    Ok(NewestMatching {
        records,
        as_of: Some(Position(newest as u64)),
    })
}

/// At most `limit` documents of `coll` whose key starts with `prefix` and sorts after `after`.
pub(super) fn scan_page(
    c: &Connection,
    coll: &str,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<KeyedDoc>> {
    let upper = format!("{prefix}\u{10FFFF}");
    // `key > after` as its own statement (not `?4 IS NULL OR ...`), so it bounds the range
    // scan of the primary key: a late page costs no more than the first.
    let (sql, lower): (&str, &str) = match after {
        Some(a) if a >= prefix => (
            "SELECT key, body FROM kv WHERE coll = ?1 AND key > ?2 AND key < ?3
             ORDER BY key LIMIT ?4",
            a,
        ),
        _ => (
            "SELECT key, body FROM kv WHERE coll = ?1 AND key >= ?2 AND key < ?3
             ORDER BY key LIMIT ?4",
            prefix,
        ),
    };
    let mut stmt = c.prepare_cached(sql)?;
    let rows = stmt.query_map(params![coll, lower, upper, limit as i64], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    rows.map(|row| {
        let (key, body) = row?;
        Ok(KeyedDoc {
            key,
            doc: parse_doc(&body)?,
        })
    })
    .collect()
}

/// One page of a snapshot: up to [`PAGE_ROWS`] rows of `coll` after `after`, and the filter's
/// matches among them; `None` as the last key when the collection is exhausted.
fn snapshot_page(
    c: &Connection,
    coll: &str,
    after: Option<&str>,
    filter: Option<&Filter>,
) -> Result<(Vec<KeyedDoc>, Option<String>)> {
    let map = |r: &rusqlite::Row<'_>| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?));
    let rows = match after {
        Some(after) => c
            .prepare_cached(
                "SELECT key, body FROM kv WHERE coll = ?1 AND key > ?2 ORDER BY key LIMIT ?3",
            )?
            .query_map(params![coll, after, PAGE_ROWS as i64], map)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
        None => c
            .prepare_cached("SELECT key, body FROM kv WHERE coll = ?1 ORDER BY key LIMIT ?2")?
            .query_map(params![coll, PAGE_ROWS as i64], map)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
    };
    let last = (rows.len() == PAGE_ROWS)
        .then(|| rows.last().map(|(k, _)| k.clone()))
        .flatten();
    let mut docs = Vec::with_capacity(rows.len());
    for (key, body) in rows {
        let doc = parse_doc(&body)?;
        if filter.is_none_or(|f| f.matches(&doc)) {
            docs.push(KeyedDoc { key, doc });
        }
    }
    Ok((docs, last))
}

/// A snapshot of a keyed collection: one read transaction on a connection of its own (not
/// the pool's: it stays open while the pages are read), in which the op log's newest sequence
/// number and every page are read, so the token and the documents agree exactly.
pub(super) async fn snapshot(
    inner: Arc<Inner>,
    coll: String,
    filter: Option<Filter>,
) -> Result<KeyedSnapshot> {
    let filter = filter.filter(|f| !f.is_match_all());
    let db_path = inner.db_path.clone();
    let (conn, seq) = blocking(move || {
        let conn = schema::open(&db_path)?;
        conn.pragma_update(None, "query_only", true)?;
        // A deferred transaction takes its snapshot at the first read: this one.
        conn.execute_batch("BEGIN")?;
        let seq: i64 = conn.query_row(
            "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'oplog'), 0)",
            [],
            |r| r.get(0),
        )?;
        Ok((conn, seq))
    })
    .await?;
    let docs = async_stream::try_stream! {
        let mut conn = conn;
        let mut after: Option<String> = None;
        loop {
            let (c, f, a) = (coll.clone(), filter.clone(), after.clone());
            let (back, page, last) = blocking(move || {
                let out = snapshot_page(&conn, &c, a.as_deref(), f.as_ref());
                out.map(|(page, last)| (conn, page, last))
            })
            .await?;
            conn = back;
            for doc in page {
                yield doc;
            }
            match last {
                Some(last) => after = Some(last),
                None => break,
            }
        }
        // Dropping the connection ends the read transaction.
        drop(conn);
    };
    Ok(KeyedSnapshot {
        token: ResumeToken(seq.to_string()),
        docs: Box::pin(docs),
    })
}

/// Runs `f` on the blocking pool.
async fn blocking<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Engine {
            engine: "embedded",
            message: format!("reader task: {e}"),
        })?
}

/// The next documents after `after` (from the oldest when `None`), or `PositionLost` when the
/// one right after `after` was evicted. One read transaction, so the check and the rows agree.
fn capped_after(c: &Connection, coll: &str, after: Option<u64>) -> Result<Vec<Record>> {
    let table = capped_table(coll);
    let tx = c.unchecked_transaction()?;
    if let Some(after) = after {
        let oldest: Option<i64> =
            tx.query_row(&format!("SELECT MIN(pos) FROM {table}"), [], |r| r.get(0))?;
        if let Some(oldest) = oldest
            && oldest as u64 > after + 1
        {
            return Err(StoreError::PositionLost {
                collection: coll.to_string(),
                after: Position(after),
                oldest: Position(oldest as u64),
            });
        }
    }
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT pos, body, ts FROM {table} WHERE pos > ?1 ORDER BY pos LIMIT ?2"
    ))?;
    let rows = stmt.query_map(
        params![after.unwrap_or(0) as i64, CATCH_UP_BATCH as i64],
        |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        },
    )?;
    rows.map(|row| {
        let (pos, body, ts) = row?;
        Ok(Record {
            position: Position(pos as u64),
            doc: parse_doc(&body)?,
            committed_at_us: Some(ts),
        })
    })
    .collect()
}

/// The next op-log entries after `after` that `filter` admits ([`ChangeFilter::admits`]:
/// collection, operation, key), and the sequence number of the last entry read, admitted or
/// not; or `HistoryLost` when the one right after `after` is gone.
///
/// The images of an entry the filter does not admit are never decoded: a change feed on the
/// sources' summaries reads past the long-tail counters' entries (~1.4 per realistic event)
/// at the cost of comparing their keys.
fn changes_after(
    c: &Connection,
    after: Option<u64>,
    filter: &ChangeFilter,
) -> Result<(Vec<Change>, Option<u64>)> {
    let tx = c.unchecked_transaction()?;
    if let Some(after) = after {
        let oldest: Option<i64> = tx.query_row("SELECT MIN(seq) FROM oplog", [], |r| r.get(0))?;
        if let Some(oldest) = oldest
            && oldest as u64 > after + 1
        {
            return Err(StoreError::HistoryLost {
                token: ResumeToken(after.to_string()),
                oldest: ResumeToken(oldest.to_string()),
            });
        }
    }
    let mut stmt = tx.prepare_cached(
        "SELECT seq, coll, op, key, before, after, ts FROM oplog WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    )?;
    let mut rows = stmt.query(params![after.unwrap_or(0) as i64, CATCH_UP_BATCH as i64])?;
    let (mut changes, mut last) = (Vec::new(), None);
    while let Some(r) = rows.next()? {
        let seq = r.get::<_, i64>(0)?;
        last = Some(seq as u64);
        let op: ChangeOp = text(r, 2)?.parse().map_err(StoreError::Invalid)?;
        let (coll, key) = (text(r, 1)?, text(r, 3)?);
        if !filter.admits(coll, op, key) {
            continue;
        }
        let image = |i: usize| -> Result<Option<Document>> {
            match r.get_ref(i)? {
                ValueRef::Null => Ok(None),
                _ => parse_doc(text(r, i)?).map(Some),
            }
        };
        changes.push(Change {
            op,
            collection: coll.to_string(),
            key: key.to_string(),
            before: if filter.wants_before(op) {
                image(4)?
            } else {
                None
            },
            after: image(5)?,
            token: ResumeToken(seq.to_string()),
            committed_at_us: r.get(6)?,
        });
    }
    Ok((changes, last))
}

/// Column `i` of `r` as text, borrowed from the row.
fn text<'r>(r: &'r rusqlite::Row<'_>, i: usize) -> Result<&'r str> {
    let value = r.get_ref(i)?;
    value.as_str().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, value.data_type(), Box::new(e)).into()
    })
}

pub(super) fn tail_stream(
    inner: Arc<Inner>,
    coll: String,
    newest: Arc<AtomicU64>,
    start: Start,
) -> RecordStream {
    // Subscribe before looking at the table: every commit after this point is either in the
    // table when we read it or in the broadcast, so nothing falls in between. Done here, not
    // in the stream, so that `Start::Now` means when `tail` was called, not its first poll.
    let subscribed = inner.subscribe();
    let mut last: Option<u64> = match start {
        Start::Oldest => None,
        Start::After(p) => Some(p.0),
        Start::Now => Some(newest.load(Ordering::Acquire)),
    };
    Box::pin(async_stream::try_stream! {
        let mut live = subscribed?;
        loop {
            loop {
                let c = coll.clone();
                let batch = inner.read(move |conn| capped_after(conn, &c, last)).await?;
                if batch.is_empty() {
                    break;
                }
                for record in batch {
                    last = Some(record.position.0);
                    yield record;
                }
            }
            'live: loop {
                match live.recv().await {
                    Ok(commit) => {
                        for (name, records) in &commit.appended {
                            if *name != coll {
                                continue;
                            }
                            for record in records {
                                let p = record.position.0;
                                match last {
                                    Some(l) if p <= l => continue,
                                    // Not the next one: read the table to fill the hole.
                                    Some(l) if p != l + 1 => break 'live,
                                    _ => {}
                                }
                                last = Some(p);
                                yield record.clone();
                            }
                        }
                    }
                    // Fell behind the broadcast: read the table until caught up again.
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
        ChangeStart::Now => Some(inner.newest_op.load(Ordering::Acquire)),
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
        loop {
            loop {
                let admitted = filter.clone();
                let (batch, read_to) = inner
                    .read(move |conn| changes_after(conn, last, &admitted))
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
                        for change in &commit.changes {
                            let seq = parse_token(&change.token)?;
                            match last {
                                Some(l) if seq <= l => continue,
                                Some(l) if seq != l + 1 => break 'live,
                                _ => {}
                            }
                            last = Some(seq);
                            advance(seq);
                            if filter.matches(change) {
                                yield filter.shaped_copy(change);
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `bounds` seeks both ends of the table, whatever its size, and finds them after the
    /// oldest rows were evicted.
    #[test]
    fn bounds_seek_the_ends_instead_of_scanning() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE capped_e(pos INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT, sz INTEGER)",
        )
        .unwrap();
        assert!(bounds(&c, "capped_e").unwrap().is_none(), "empty");
        let plan: Vec<String> = c
            .prepare(&format!("EXPLAIN QUERY PLAN {}", bounds_sql("capped_e")))
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            plan.iter().all(|step| !step.starts_with("SCAN capped_e")),
            "no scan of the table: {plan:?}"
        );
        for _ in 0..10 {
            c.execute("INSERT INTO capped_e(body, sz) VALUES ('{}', 2)", [])
                .unwrap();
        }
        c.execute("DELETE FROM capped_e WHERE pos <= 3", [])
            .unwrap();
        let b = bounds(&c, "capped_e").unwrap().unwrap();
        assert_eq!((b.oldest, b.newest), (Position(4), Position(10)));
    }
}
