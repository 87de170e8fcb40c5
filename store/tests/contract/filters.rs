//! The filter case table (`filter_cases.rs`) through every engine: capped finds and tails,
//! keyed snapshots and change streams (inserts judged on their post-image, deletes on their
//! pre-image).

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use store::{
    ChangeFilter, ChangeOp, ChangeStart, Document, Durability, Filter, Position, Start, Store,
};

use super::{WAIT, capped, filter, filter_cases};

/// Whether a document is stored as sent only by a server with
/// [`store::Capability::DocumentsAsSent`]: a `$`-prefixed or dotted key, or an array in an
/// array, at any depth.
fn needs_documents_as_sent(v: &Value) -> bool {
    match v {
        Value::Object(m) => m
            .iter()
            .any(|(k, v)| k.starts_with('$') || k.contains('.') || needs_documents_as_sent(v)),
        Value::Array(items) => items
            .iter()
            .any(|v| v.is_array() || needs_documents_as_sent(v)),
        _ => false,
    }
}

/// The filter table's rows the store can hold, grouped by filter:
/// `(filter, [(row index, doc, expected)])`. On a server that refuses some documents (see
/// [`needs_documents_as_sent`]), their rows are left out, and that is printed with the reason.
fn cases_by_filter(store: &dyn Store) -> Vec<(Value, Vec<(usize, filter_cases::Case)>)> {
    let caps = store.capabilities();
    let refused = caps.get(store::Capability::DocumentsAsSent).reason();
    let mut left_out = 0;
    let mut groups: Vec<(Value, Vec<(usize, filter_cases::Case)>)> = Vec::new();
    for (i, case) in filter_cases::cases().into_iter().enumerate() {
        if refused.is_some() && needs_documents_as_sent(&Value::Object(case.doc.clone())) {
            left_out += 1;
            continue;
        }
        match groups.iter_mut().find(|(f, _)| *f == case.filter) {
            Some((_, rows)) => rows.push((i, case)),
            None => groups.push((case.filter.clone(), vec![(i, case)])),
        }
    }
    if let Some(reason) = refused {
        eprintln!(
            "notice: {left_out} of {} filter rows left out: their documents need {} ({reason})",
            filter_cases::cases().len(),
            store::Capability::DocumentsAsSent
        );
    }
    groups
}

/// The rows a query should return: the filter restricted to its own rows' documents (each
/// stored document carries its row index under `ROW`, a key no filter of the table reads).
const ROW: &str = "tailrace_row";

fn restricted(filter_json: &Value, rows: &[(usize, filter_cases::Case)]) -> Filter {
    let ids: Vec<Value> = rows.iter().map(|(i, _)| json!(i)).collect();
    filter(json!({"$and": [filter_json, {ROW: {"$in": ids}}]}))
}

fn tagged(i: usize, case: &filter_cases::Case) -> Document {
    let mut d = case.doc.clone();
    d.insert(ROW.into(), json!(i));
    d
}

fn expected_rows(rows: &[(usize, filter_cases::Case)]) -> Vec<u64> {
    rows.iter()
        .filter(|(_, c)| c.expected)
        .map(|(i, _)| *i as u64)
        .collect()
}

fn describe(rows: &[(usize, filter_cases::Case)]) -> String {
    rows.first().map(|(_, c)| c.name).unwrap_or("?").to_string()
}

/// The filter table through a capped collection: `newest_matching` (MongoDB: a `find`) and a
/// filtered tail (MongoDB: the tailable cursor's query) give each row's expected answer.
pub async fn filter_cases_on_capped(store: &dyn Store) {
    let groups = cases_by_filter(store);
    let c = capped(store, "c_cases", 100_000, 256 << 20).await;
    let mut docs = Vec::new();
    for (_, rows) in &groups {
        docs.extend(rows.iter().map(|(i, case)| tagged(*i, case)));
    }
    let total = docs.len();
    let positions = c.append(docs, Durability::Acknowledged).await.unwrap();
    let before_first = Position(positions[0].0 - 1);
    let mut failures = Vec::new();
    for (filter_json, rows) in &groups {
        let f = restricted(filter_json, rows);
        let want = expected_rows(rows);
        let got = c.newest_matching(&f, total).await.unwrap();
        let mut rows_got: Vec<u64> = got
            .records
            .iter()
            .map(|r| r.doc[ROW].as_u64().unwrap())
            .collect();
        rows_got.sort_unstable();
        if rows_got != want {
            failures.push(format!(
                "newest_matching {filter_json} ({}): expected rows {want:?}, got {rows_got:?}",
                describe(rows)
            ));
        }
        // The tail: every expected row, then nothing (the sentinel below is not matched).
        let mut tail = c.tail_matching(Start::After(before_first), f);
        let mut tail_rows = Vec::new();
        for _ in 0..want.len() {
            match tokio::time::timeout(WAIT, tail.next()).await {
                Ok(Some(Ok(r))) => tail_rows.push(r.doc[ROW].as_u64().unwrap()),
                other => {
                    failures.push(format!("tail_matching {filter_json}: {other:?}"));
                    break;
                }
            }
        }
        tail_rows.sort_unstable();
        if tail_rows != want {
            failures.push(format!(
                "tail_matching {filter_json} ({}): expected rows {want:?}, got {tail_rows:?}",
                describe(rows)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} filters disagree with the table:\n{}",
        failures.len(),
        groups.len(),
        failures.join("\n")
    );
}

/// The filter table through a keyed collection: a filtered snapshot (MongoDB: a snapshot
/// `find`) and filtered change streams (MongoDB: the `$match` on `fullDocument.`, and on
/// `fullDocumentBeforeChange.` for deletes) give each row's expected answer.
pub async fn filter_cases_on_keyed(store: &dyn Store) {
    let groups = cases_by_filter(store);
    let k = store.keyed("k_cases").await.unwrap();
    // One stream per filter, opened before any write.
    let mut streams = Vec::new();
    for (filter_json, rows) in &groups {
        let f = ChangeFilter {
            filter: Some(restricted(filter_json, rows)),
            ..ChangeFilter::default()
        };
        streams.push(k.changes(f, ChangeStart::Now));
    }
    let key = |i: usize| format!("row:{i:04}");
    for (_, rows) in &groups {
        for (i, case) in rows {
            k.set(&key(*i), tagged(*i, case), Durability::Acknowledged)
                .await
                .unwrap();
        }
    }
    let mut failures = Vec::new();
    for ((filter_json, rows), stream) in groups.iter().zip(streams.iter_mut()) {
        let want = expected_rows(rows);
        let snapshot = k
            .snapshot(Some(restricted(filter_json, rows)))
            .await
            .unwrap();
        let docs: Vec<store::KeyedDoc> =
            tokio::time::timeout(WAIT, snapshot.docs.collect::<Vec<_>>())
                .await
                .expect("snapshot read in time")
                .into_iter()
                .collect::<Result<_, _>>()
                .unwrap();
        let snap_rows: Vec<u64> = docs.iter().map(|d| d.doc[ROW].as_u64().unwrap()).collect();
        if snap_rows != want {
            failures.push(format!(
                "snapshot {filter_json} ({}): expected rows {want:?}, got {snap_rows:?}",
                describe(rows)
            ));
        }
        let mut change_rows = Vec::new();
        for _ in 0..want.len() {
            match tokio::time::timeout(WAIT, stream.next()).await {
                Ok(Some(Ok(c))) => {
                    change_rows.push(c.after.as_ref().unwrap()[ROW].as_u64().unwrap())
                }
                other => {
                    failures.push(format!("changes {filter_json}: {other:?}"));
                    break;
                }
            }
        }
        if change_rows != want {
            failures.push(format!(
                "changes {filter_json} ({}): expected rows {want:?}, got {change_rows:?}",
                describe(rows)
            ));
        }
    }
    // Deletes are judged on their pre-image: the same rows again, through the delete branch.
    for (_, rows) in &groups {
        for (i, _) in rows {
            k.delete(&key(*i), Durability::Acknowledged).await.unwrap();
        }
    }
    for ((filter_json, rows), stream) in groups.iter().zip(streams.iter_mut()) {
        let want = expected_rows(rows);
        let mut deleted = Vec::new();
        for _ in 0..want.len() {
            match tokio::time::timeout(WAIT, stream.next()).await {
                Ok(Some(Ok(c))) if c.op == ChangeOp::Delete => {
                    deleted.push(c.before.as_ref().unwrap()[ROW].as_u64().unwrap())
                }
                other => {
                    failures.push(format!("delete of {filter_json}: {other:?}"));
                    break;
                }
            }
        }
        if deleted != want {
            failures.push(format!(
                "deletes {filter_json} ({}): expected rows {want:?}, got {deleted:?}",
                describe(rows)
            ));
        }
        if let Ok(Some(extra)) =
            tokio::time::timeout(Duration::from_millis(20), stream.next()).await
        {
            failures.push(format!(
                "changes {filter_json}: more than expected: {extra:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} disagreements with the table:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
