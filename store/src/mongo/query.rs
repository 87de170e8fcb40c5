//! Pipelines on the server ([`crate::query::ServerQuery`]): what the server evaluates as
//! tailrace does, probed once per store over a scratch collection, and the pipeline's prefix
//! run with `aggregate` on a capped collection.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use mongodb::Collection;
use mongodb::bson::{Bson, Document as BsonDoc};
use serde_json::Value;

use super::Inner;
use super::convert::{bson_doc_to_json, doc_to_bson, json_to_bson};
use crate::query::{Features, ServerQuery};
use crate::{Document, Result, Support};

/// A capped collection's server, for queries.
pub(crate) struct MongoQuery {
    pub(crate) inner: Arc<Inner>,
    pub(crate) coll: Collection<BsonDoc>,
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
        self.inner
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
                Ok(Arc::new(features))
            })
            .await
            .cloned()
    }

    async fn run(&self, stages: Vec<Value>) -> Result<BoxStream<'static, Result<Document>>> {
        let cursor = self.coll.aggregate(stages_to_bson(&stages)).await?;
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
