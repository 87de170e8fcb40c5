//! Capped collections on MongoDB, one file per job: creation and the compatibility check
//! (`create.rs`), the single writer task that assigns positions (`writer.rs`), the ring of
//! acknowledgment times (`acks.rs`), the tailable-await tail (`tail.rs`), and here the
//! collection handle and its reads.

mod acks;
mod create;
mod recent;
mod tail;
mod writer;

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use mongodb::Collection;
use mongodb::bson::{Bson, Document as BsonDoc, doc};
use serde_json::Value;

use super::Inner;
use super::convert::position_filter;
use super::convert::{bson_as_i64, bson_doc_to_json, doc_to_bson, engine_err, json_to_bson};
use crate::{
    Bounds, Capped, Document, Durability, Filter, NewestMatching, Position, Record, RecordStream,
    Result, Start, StoreError, Usage,
};
use tail::tail_stream;

pub(crate) use create::{collection_info, ensure_capped, ensure_indexes};
pub(crate) use writer::CappedShared;

/// A filter as the query document of a `find` on the collection's documents.
fn filter_document(filter: &Filter) -> BsonDoc {
    match json_to_bson(&filter.to_mongo("")) {
        Bson::Document(d) => d,
        // `to_mongo` always returns an object.
        _ => BsonDoc::new(),
    }
}

/// A stored document's position.
fn position_of(name: &str, doc: &BsonDoc) -> Result<u64> {
    doc.get("_id")
        .and_then(bson_as_i64)
        .filter(|i| *i >= 0)
        .map(|i| i as u64)
        .ok_or_else(|| StoreError::Incompatible {
            collection: name.to_string(),
            problem: format!(
                "holds a document whose _id is not a tailrace position ({:?}); only tailrace may \
                 write to its capped collections",
                doc.get("_id")
            ),
        })
}

/// The `_id` at one end of the collection (`order` 1: oldest, -1: newest).
async fn end_id(coll: &Collection<BsonDoc>, name: &str, order: i32) -> Result<Option<u64>> {
    let doc = coll
        .find_one(doc! {})
        .sort(doc! {"_id": order})
        .projection(doc! {"_id": 1})
        .await?;
    doc.map(|d| position_of(name, &d)).transpose()
}

/// The newest position stored.
pub(crate) async fn newest_id(coll: &Collection<BsonDoc>, name: &str) -> Result<Option<u64>> {
    end_id(coll, name, -1).await
}

/// The oldest position stored: the first document in natural (insertion) order, which is
/// `_id` order (one writer per collection, ordered inserts) and what eviction removes first.
/// Asked without a sort, because a server that sorts in its own process (FerretDB 1.24, which
/// pushes only a sort-less limit down to its backend) would read the whole collection for a
/// sort; on MongoDB either is one step of a scan.
pub(crate) async fn oldest_id(coll: &Collection<BsonDoc>, name: &str) -> Result<Option<u64>> {
    let doc = coll.find_one(doc! {}).projection(doc! {"_id": 1}).await?;
    doc.map(|d| position_of(name, &d)).transpose()
}

/// The newest position stored, found from `hint` (a position known to have been stored,
/// 0 for none) by two lookups by `_id` where it still holds: `hint` is kept, and nothing is
/// stored after `in_flight` (the last position this process's writer handed out: those
/// between are its inserts in flight, not yet acknowledged, which a snapshot leaves out).
/// `oldest`, when the caller has read it, stands for the first lookup: `hint` is kept when it
/// is not older. Otherwise (another process wrote since, or `hint` was evicted) by the sorted query,
/// which a server that sorts in its own process answers by reading the whole collection
/// (seconds on a full collection of FerretDB 1.24), where equality costs it one scan in its
/// backend, without reading documents into its own process.
pub(crate) async fn newest_id_from(
    coll: &Collection<BsonDoc>,
    name: &str,
    hint: u64,
    in_flight: u64,
    oldest: Option<u64>,
) -> Result<Option<u64>> {
    if hint > 0
        && !is_stored(coll, hint.max(in_flight) + 1).await?
        && match oldest {
            Some(o) => o <= hint,
            None => is_stored(coll, hint).await?,
        }
    {
        return Ok(Some(hint));
    }
    newest_id(coll, name).await
}

/// Whether a document is stored at `position`: a lookup by `_id`, which every server answers
/// without reading the collection (FerretDB pushes equality down to its backend).
pub(crate) async fn is_stored(coll: &Collection<BsonDoc>, position: u64) -> Result<bool> {
    let doc = coll
        .find_one(position_filter(position))
        .projection(doc! {"_id": 1})
        .await?;
    Ok(doc.is_some())
}

/// A stored document as a [`Record`] (its `_id` becomes the position).
fn to_record(name: &str, mut doc: BsonDoc, committed_at_us: Option<i64>) -> Result<Record> {
    let position = Position(position_of(name, &doc)?);
    doc.remove("_id");
    Ok(Record {
        position,
        doc: Arc::new(bson_doc_to_json(doc)),
        committed_at_us,
    })
}

/// Converts appended documents; the `_id` field is the engine's (the position), so a document
/// carrying its own is refused rather than silently overwritten.
pub(crate) fn convert_append<D: std::borrow::Borrow<Document>>(
    name: &str,
    docs: &[D],
) -> Result<Vec<BsonDoc>> {
    docs.iter()
        .map(|d| {
            let d = d.borrow();
            if d.contains_key("_id") {
                return Err(StoreError::Invalid(format!(
                    "a document appended to capped collection {name} has an _id field; MongoDB \
                     uses _id for the position: rename the field"
                )));
            }
            Ok(doc_to_bson(d))
        })
        .collect()
}

/// A capped collection of the MongoDB engine.
pub(crate) struct MongoCapped {
    pub(crate) inner: Arc<Inner>,
    pub(crate) shared: Arc<CappedShared>,
    /// Fields `latest` may query (this handle's spec).
    pub(crate) indexes: Vec<String>,
}

impl MongoCapped {
    /// The `limit` newest documents matching `query` (and `here`, evaluated in this process,
    /// when given), newest first (`limit` > 0: MongoDB reads 0 as no limit). With `here` the
    /// server cannot stop at `limit`, so documents are read in batches until enough match.
    async fn newest_first(
        &self,
        query: BsonDoc,
        here: Option<&Filter>,
        limit: usize,
    ) -> Result<Vec<Record>> {
        let mut find = self.shared.coll.find(query).sort(doc! {"_id": -1});
        if here.is_none() {
            find = find.limit(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        let mut cursor = find.await?;
        let mut records = Vec::new();
        while records.len() < limit
            && let Some(doc) = cursor.next().await
        {
            let doc = doc?;
            let position = position_of(&self.shared.name, &doc)?;
            let record = to_record(&self.shared.name, doc, self.shared.acks.lookup(position))?;
            if here.is_none_or(|f| f.matches(&record.doc)) {
                records.push(record);
            }
        }
        Ok(records)
    }

    /// The newest position stored, from what this process last knew of it.
    async fn newest(&self, oldest: Option<u64>) -> Result<Option<u64>> {
        let hint = self.shared.acks.now();
        let in_flight = self.shared.acks.allocated();
        let newest = newest_id_from(
            &self.shared.coll,
            &self.shared.name,
            hint,
            in_flight,
            oldest,
        )
        .await?;
        if let Some(n) = newest {
            self.shared.acks.saw(n);
        }
        Ok(newest)
    }

    /// Whether document filters run on the server: only where it evaluates them as MongoDB
    /// does ([`crate::Capability::ServerFilters`]); elsewhere they run here, with the same
    /// meaning as on the embedded engine.
    fn filters_on_server(&self) -> bool {
        self.inner.capabilities.server_filters.is_yes()
    }
}

impl MongoCapped {
    /// Appends `docs`, converted to BSON here: [`Capped::append`] and
    /// [`Capped::append_shared`].
    async fn append_converted<D: std::borrow::Borrow<Document> + Sync>(
        &self,
        docs: &[D],
        durability: Durability,
    ) -> Result<Vec<Position>> {
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        let docs = convert_append(&self.shared.name, docs)?;
        self.shared.submit(docs, durability).await
    }
}

#[async_trait]
impl Capped for MongoCapped {
    fn name(&self) -> &str {
        &self.shared.name
    }

    async fn append(&self, docs: Vec<Document>, durability: Durability) -> Result<Vec<Position>> {
        self.append_converted(&docs, durability).await
    }

    async fn append_shared(
        &self,
        docs: Arc<[Arc<Document>]>,
        durability: Durability,
    ) -> Result<Vec<Position>> {
        // Converted to BSON from the shared documents: nothing to copy first.
        self.append_converted(&docs, durability).await
    }

    fn tail(&self, start: Start) -> RecordStream {
        tail_stream(self.inner.clone(), self.shared.clone(), start, None)
    }

    fn tail_matching(&self, start: Start, filter: Filter) -> RecordStream {
        if filter.is_match_all() {
            return self.tail(start);
        }
        if !self.filters_on_server() {
            let tail = self.tail(start);
            return tail
                .filter(move |r| {
                    futures::future::ready(r.as_ref().map_or(true, |r| filter.matches(&r.doc)))
                })
                .boxed();
        }
        // On the server: the tailable cursor's query, so non-matching documents never travel.
        let query = Some(filter_document(&filter));
        tail_stream(self.inner.clone(), self.shared.clone(), start, query)
    }

    async fn newest_matching(&self, filter: &Filter, limit: usize) -> Result<NewestMatching> {
        // The newest position first, then only documents up to it: a document appended in
        // between is left to the tail that continues after `as_of`, never given twice.
        let Some(newest) = self.newest(None).await? else {
            return Ok(NewestMatching {
                records: Vec::new(),
                as_of: None,
            });
        };
        let as_of = Some(Position(newest));
        if limit == 0 {
            // MongoDB reads `limit(0)` as "no limit".
            return Ok(NewestMatching {
                records: Vec::new(),
                as_of,
            });
        }
        let mut query = doc! {"_id": {"$lte": newest as i64}};
        let mut here = None;
        if !filter.is_match_all() {
            if self.filters_on_server() {
                query = doc! {"$and": [query, filter_document(filter)]};
            } else {
                here = Some(filter);
            }
        }
        let records = self.newest_first(query, here, limit).await?;
        Ok(NewestMatching { records, as_of })
    }

    async fn get(&self, position: Position) -> Result<Option<Record>> {
        let doc = self
            .shared
            .coll
            .find_one(position_filter(position.0))
            .await?;
        doc.map(|d| to_record(&self.shared.name, d, self.shared.acks.lookup(position.0)))
            .transpose()
    }

    async fn latest(&self, field: &str, value: &Value, limit: usize) -> Result<Vec<Record>> {
        if !self.indexes.iter().any(|f| f == field) {
            return Err(StoreError::NotIndexed {
                collection: self.shared.name.clone(),
                field: field.to_string(),
            });
        }
        if matches!(value, Value::Array(_) | Value::Object(_)) {
            // Same rule as the embedded engine (and MongoDB would match array elements).
            return Err(StoreError::Invalid(format!(
                "latest() compares scalars only, not {value}"
            )));
        }
        if limit == 0 {
            // MongoDB reads `limit(0)` as "no limit".
            return Ok(Vec::new());
        }
        self.newest_first(doc! {field: json_to_bson(value)}, None, limit)
            .await
    }

    async fn bounds(&self) -> Result<Option<Bounds>> {
        let oldest = oldest_id(&self.shared.coll, &self.shared.name).await?;
        let newest = match oldest {
            Some(o) => self.newest(Some(o)).await?,
            None => None,
        };
        Ok(oldest.zip(newest).map(|(o, n)| Bounds {
            oldest: Position(o),
            newest: Position(n),
        }))
    }

    async fn usage(&self) -> Result<Usage> {
        // `$collStats.storageStats`: `count` and `size` (uncompressed BSON bytes, the measure
        // the capped `size` limit applies to), without scanning the collection.
        let mut cursor = self
            .shared
            .coll
            .aggregate([doc! {"$collStats": {"storageStats": {}}}])
            .await?;
        let Some(stats) = cursor.next().await.transpose()? else {
            return Ok(Usage::default());
        };
        let storage = stats.get_document("storageStats").map_err(|_| {
            engine_err(format!(
                "$collStats of {} has no storageStats",
                self.shared.name
            ))
        })?;
        let num = |k: &str| storage.get(k).and_then(bson_as_i64).unwrap_or(0).max(0) as u64;
        Ok(Usage {
            docs: num("count"),
            bytes: num("size"),
        })
    }

    fn server_query(&self) -> Option<Arc<dyn crate::query::ServerQuery>> {
        Some(Arc::new(super::query::MongoQuery {
            inner: self.inner.clone(),
            coll: self.shared.coll.clone(),
            keyed: false,
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn appended_documents_must_not_carry_an_id() {
        let ok = convert_append("events", &[crate::Document::new()]).unwrap();
        assert_eq!(ok.len(), 1);
        let mut d = crate::Document::new();
        d.insert("_id".into(), Value::from(1));
        let err = convert_append("events", &[d]).unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "got {err}");
    }

    #[test]
    fn records_take_their_position_from_the_id() {
        let r = to_record("events", doc! {"_id": 7_i64, "n": 1_i64}, Some(5)).unwrap();
        assert_eq!(r.position, Position(7));
        assert!(
            !r.doc.contains_key("_id"),
            "the position is not part of the document"
        );
        assert_eq!(r.doc["n"], Value::from(1));
        let foreign = to_record("events", doc! {"_id": "abc"}, None).unwrap_err();
        assert!(
            matches!(foreign, StoreError::Incompatible { .. }),
            "got {foreign}"
        );
    }
}
