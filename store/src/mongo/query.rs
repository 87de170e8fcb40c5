//! Pipelines on the server ([`crate::query::ServerQuery`]): what the server evaluates as
//! tailrace does, probed once per store over a scratch collection, and the pipeline's prefix
//! run with `aggregate` on a capped or a keyed collection.
//!
//! A keyed collection's documents hold the engine's own fields ([`ENGINE_FIELDS`]), which no
//! reader sees: its stages run after a `$project` that removes them, and after a `$sort` by
//! `_id`, so that the server's stages see the documents as [`crate::Keyed::snapshot`] gives
//! them, in the same order. Without a snapshot: the server reads as its own `aggregate` does
//! (MongoDB's read concern `local`), so a key written while a long query reads may be seen
//! before or after that write, as in `db.rollups.aggregate(...)`; but a server without a
//! replica set's snapshot reads (FerretDB) answers such queries too.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use mongodb::Collection;
use mongodb::bson::{Bson, Document as BsonDoc};
use serde_json::Value;

use super::Inner;
use super::convert::{bson_doc_to_json, doc_to_bson, json_to_bson};
use super::keyed::{ENGINE_FIELDS, SNAPSHOT_BATCH, keyed_doc_to_json};
use crate::query::{Features, ServerQuery};
use crate::{Document, Result, Support};

/// A capped or keyed collection's server, for queries.
pub(crate) struct MongoQuery {
    pub(crate) inner: Arc<Inner>,
    pub(crate) coll: Collection<BsonDoc>,
    /// A keyed collection's: stages run after its engine's fields are removed (module docs).
    pub(crate) keyed: bool,
}

/// The stages a keyed collection's pipeline runs after: its documents by key, as read back.
fn keyed_prelude() -> [BsonDoc; 2] {
    let hidden: BsonDoc = ENGINE_FIELDS
        .iter()
        .map(|f| (f.to_string(), Bson::Int32(0)))
        .collect();
    [
        mongodb::bson::doc! {"$sort": {"_id": 1}},
        mongodb::bson::doc! {"$project": hidden},
    ]
}

/// Stages as BSON: dates (`{"$date": ...}`) as BSON dates, as the documents hold them, and a
/// `$sort`'s `[path, direction]` pairs as one document in their order.
fn stages_to_bson(stages: &[Value]) -> Vec<BsonDoc> {
    stages
        .iter()
        .map(|s| {
            if let Some(Value::Array(pairs)) = s.get("$sort") {
                let mut sort = BsonDoc::new();
                for pair in pairs {
                    if let (Some(path), Some(dir)) = (pair[0].as_str(), pair[1].as_i64()) {
                        sort.insert(path, dir as i32);
                    }
                }
                return mongodb::bson::doc! {"$sort": sort};
            }
            match json_to_bson(s) {
                Bson::Document(d) => d,
                _ => BsonDoc::new(),
            }
        })
        .collect()
}

#[async_trait]
impl ServerQuery for MongoQuery {
    async fn features(&self) -> Result<Arc<Features>> {
        let inner = self.inner.clone();
        let features = self
            .inner
            .query_features
            .get_or_try_init(|| async move {
                let mut features = probe(&inner).await?;
                // A `$match` means on the server what it means here only where the filter
                // probe found the server's semantics to be MongoDB's.
                if let Some(reason) = inner.capabilities.server_filters.reason() {
                    features.insert(
                        "$match",
                        Support::No {
                            reason: reason.to_owned(),
                        },
                    );
                }
                Ok::<_, crate::StoreError>(Arc::new(features))
            })
            .await
            .cloned()?;
        if !self.keyed {
            return Ok(features);
        }
        // A keyed collection's stages follow a `$sort` and a `$project` (keyed_prelude): on a
        // server that does not evaluate those as tailrace does, none of its stages run there.
        let missing = ["$sort", "$project"]
            .into_iter()
            .find(|f| !features.get(f).is_some_and(Support::is_yes));
        Ok(match missing {
            None => features,
            Some(f) => {
                let reason = format!(
                    "a keyed collection's stages run after a {f}, which the server does not \
                     evaluate as tailrace does"
                );
                Arc::new(
                    features
                        .keys()
                        .map(|name| {
                            (
                                *name,
                                Support::No {
                                    reason: reason.clone(),
                                },
                            )
                        })
                        .collect(),
                )
            }
        })
    }

    async fn run(&self, stages: Vec<Value>) -> Result<BoxStream<'static, Result<Document>>> {
        if !self.keyed {
            let cursor = self.coll.aggregate(stages_to_bson(&stages)).await?;
            return Ok(cursor
                .map(|d| d.map(bson_doc_to_json).map_err(Into::into))
                .boxed());
        }
        if stages.is_empty() {
            // Every document, read as a snapshot reads them (a `find` by key), with the
            // engine's fields removed here: this works on any server, whatever it evaluates.
            let cursor = self
                .coll
                .find(BsonDoc::new())
                .sort(mongodb::bson::doc! {"_id": 1})
                .batch_size(SNAPSHOT_BATCH)
                .await?;
            return Ok(cursor
                .map(|d| d.map(keyed_doc_to_json).map_err(Into::into))
                .boxed());
        }
        let mut all = keyed_prelude().to_vec();
        all.extend(stages_to_bson(&stages));
        let cursor = self.coll.aggregate(all).await?;
        Ok(cursor
            .map(|d| d.map(bson_doc_to_json).map_err(Into::into))
            .boxed())
    }
}

/// Runs every feature's probe in a scratch collection holding exactly the probe documents,
/// dropped afterwards.
async fn probe(inner: &Inner) -> Result<Features> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!("tailrace_probe_{}_{nanos}_query", std::process::id());
    let coll = inner.db.collection::<BsonDoc>(&name);
    let docs: Vec<BsonDoc> = crate::query::probe_docs().iter().map(doc_to_bson).collect();
    let features = async {
        coll.insert_many(docs).await?;
        crate::query::probe(|_, stages| {
            let coll = coll.clone();
            async move {
                let mut cursor = coll.aggregate(stages_to_bson(&stages)).await?;
                let mut out = Vec::new();
                while let Some(d) = cursor.next().await {
                    out.push(bson_doc_to_json(d?));
                }
                Ok(out)
            }
        })
        .await
    }
    .await;
    let _ = coll.drop().await;
    features
}
