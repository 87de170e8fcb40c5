//! The capability probe: what the server behind the URI supports, asked of the server itself
//! once at connect, never inferred from its name or version string. A MongoDB replica set
//! answers yes to everything; a standalone MongoDB lacks change streams, the oplog,
//! transactions, snapshot reads and a meaningful majority; FerretDB (a MongoDB wire-protocol
//! server) also refuses `$`-prefixed and dotted keys and evicts capped collections in the
//! background. Each "no" keeps the reply that showed it, so an error or a skipped test can
//! quote the server.
//!
//! A network failure while probing fails the connect (the server cannot be used); any other
//! refusal is an answer.

use crate::telemetry::Problem;
use futures::StreamExt;
use mongodb::bson::{Bson, Document as BsonDoc, doc};
use mongodb::error::Error as DriverError;
use mongodb::{Client, Database};

use super::CHECKPOINTS;
use super::WIRE_VERSION_6_0;
use super::capped::collection_info;
use super::convert::{Class, bson_as_i64, classify, reply_of};
use crate::{Capabilities, Result, Support};

/// What `hello` said about the deployment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The replica set's name, when the server says it is a member of one.
    pub set_name: Option<String>,
    /// Whether it is a `mongos` (a sharded cluster's router: replica sets behind it).
    pub mongos: bool,
    /// Whether it reports replica-set state (`setVersion`), which a real member always does.
    pub set_version: bool,
    /// `maxWireVersion`.
    pub wire_version: i32,
}

impl Hello {
    /// Reads the fields the probe uses from a `hello` reply.
    pub(crate) fn from_reply(reply: &BsonDoc) -> Self {
        Hello {
            set_name: reply.get_str("setName").ok().map(str::to_string),
            mongos: reply.get_str("msg").ok() == Some("isdbgrid"),
            set_version: reply.get("setVersion").is_some(),
            wire_version: reply
                .get("maxWireVersion")
                .and_then(bson_as_i64)
                .unwrap_or(0) as i32,
        }
    }

    /// Whether drivers treat it as a replica set (transactions, change streams, sessions).
    pub(crate) fn replica_set(&self) -> bool {
        self.set_name.is_some() || self.mongos
    }
}

/// `No`, or the error itself when it is an outage rather than an answer.
fn refused(e: DriverError, what: impl FnOnce(String) -> String) -> Result<Support> {
    if classify(&e) == Class::Transient {
        return Err(e.into());
    }
    Ok(Support::No {
        reason: what(reply_of(&e)),
    })
}

fn no(reason: impl Into<String>) -> Support {
    Support::No {
        reason: reason.into(),
    }
}

/// Asks the server what it supports (about a dozen round trips, once per connect).
pub(crate) async fn probe(client: &Client, db: &Database, hello: &Hello) -> Result<Capabilities> {
    let not_a_set =
        || no("hello reports no setName (not a replica-set member) and it is not a mongos");
    let majority = match (&hello.set_name, hello.mongos, hello.set_version) {
        (_, true, _) | (Some(_), _, true) => Support::Yes,
        (Some(set), _, false) => no(format!(
            "hello names replica set {set:?} but reports no setVersion: the server keeps no \
             replica-set state, so a majority is this one server"
        )),
        (None, false, _) => not_a_set(),
    };
    let change_streams = match db.watch().await {
        Ok(stream) => {
            drop(stream);
            Support::Yes
        }
        Err(e) => refused(e, |r| format!("aggregate with $changeStream answered {r}"))?,
    };
    let oplog = if hello.replica_set() && !hello.mongos {
        match collection_info(&client.database("local"), "oplog.rs").await {
            Ok(Some(_)) => Support::Yes,
            Ok(None) => no("listCollections on database local shows no oplog.rs"),
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => no(format!("listCollections on database local answered {e}")),
        }
    } else if hello.mongos {
        no("a mongos has no oplog of its own (each shard's replica set has one)")
    } else {
        not_a_set()
    };
    let transactions = if hello.replica_set() {
        probe_transactions(client, db).await?
    } else {
        not_a_set()
    };
    let before_images = if !change_streams.is_yes() {
        no("no change streams, so no change events to carry them")
    } else if hello.wire_version < WIRE_VERSION_6_0 {
        no(format!(
            "hello reports maxWireVersion {}; pre-images need MongoDB 6.0 (wire version {})",
            hello.wire_version, WIRE_VERSION_6_0
        ))
    } else {
        Support::Yes
    };
    let snapshot_reads = if hello.replica_set() {
        probe_snapshot(client, db).await?
    } else {
        not_a_set()
    };
    let (documents_as_sent, capped_bounds, awaiting_tails) = probe_documents(db).await?;
    let server_filters = probe_filters(db).await?;
    Ok(Capabilities {
        change_streams,
        oplog,
        transactions,
        majority,
        before_images,
        snapshot_reads,
        documents_as_sent,
        capped_bounds,
        server_filters,
        awaiting_tails,
    })
}

/// An update that matches nothing, inside a transaction, then an abort: the kind of write a
/// multi-key rollup update makes, so a server that refuses `startTransaction` on writes (and
/// accepts it on reads) says so here. Nothing is written either way.
async fn probe_transactions(client: &Client, db: &Database) -> Result<Support> {
    let mut session = client.start_session().await?;
    if let Err(e) = session.start_transaction().await {
        return refused(e, |r| format!("startTransaction was refused: {r}"));
    }
    let write = db
        .collection::<BsonDoc>(CHECKPOINTS)
        .update_one(
            doc! {"_id": "tailrace-probe"},
            doc! {"$set": {"probe": true}},
        )
        .session(&mut session)
        .await;
    let _ = session.abort_transaction().await;
    match write {
        Ok(_) => Ok(Support::Yes),
        Err(e) => refused(e, |r| {
            format!("an update with startTransaction answered {r}")
        }),
    }
}

/// A read with the snapshot read concern must come back with its `atClusterTime`.
async fn probe_snapshot(client: &Client, db: &Database) -> Result<Support> {
    let mut session = client.start_session().snapshot(true).await?;
    let read = db
        .collection::<BsonDoc>(CHECKPOINTS)
        .find_one(doc! {"_id": "tailrace-probe"})
        .session(&mut session)
        .await;
    match read {
        Ok(_) if session.snapshot_time().is_some() => Ok(Support::Yes),
        Ok(_) => Ok(no(
            "a read with readConcern snapshot came back without atClusterTime",
        )),
        Err(e) => refused(e, |r| {
            format!("a read with readConcern snapshot answered {r}")
        }),
    }
}

/// On a scratch capped collection of one document: whether documents with a `$`-prefixed
/// key, a dotted key and a nested array are stored as sent, whether a tailable cursor on it
/// stays open, and whether the collection holds one document right after further inserts
/// (eviction at insert, as MongoDB does). The collection is dropped.
async fn probe_documents(db: &Database) -> Result<(Support, Support, Support)> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!("tailrace_probe_{}_{nanos}", std::process::id());
    let created = db
        .create_collection(&name)
        .capped(true)
        .size(4096)
        .max(1)
        .await;
    if let Err(e) = created {
        // Without a scratch collection nothing can be learned; assume what MongoDB does
        // and say why, rather than refuse a server that may be fine.
        if classify(&e) == Class::Transient {
            return Err(e.into());
        }
        Problem {
            error_type: "probe",
            detail: &format!(
                "could not create a scratch collection to probe the server ({}); assuming it \
                 stores documents as sent, keeps capped bounds at every insert and keeps \
                 tailable cursors open, as MongoDB does",
                reply_of(&e)
            ),
        }
        .warn();
        return Ok((Support::Yes, Support::Yes, Support::Yes));
    }
    let coll = db.collection::<BsonDoc>(&name);
    let outcome = async {
        coll.insert_one(doc! {"_id": 1}).await?;
        let mut refusals = Vec::new();
        let shapes: [(&str, Bson); 3] = [
            ("$probe", Bson::Int32(1)),
            ("dotted.key", Bson::Int32(1)),
            (
                "nested",
                Bson::Array(vec![Bson::Array(vec![Bson::Int32(1)])]),
            ),
        ];
        for (i, (key, value)) in shapes.into_iter().enumerate() {
            let mut d = BsonDoc::new();
            d.insert("_id", 2 + i as i32);
            d.insert(key, value.clone());
            if let Err(e) = coll.insert_one(d).await {
                let shown = Bson::Document(doc! {key: value}).into_relaxed_extjson();
                refusals.push(refused(e, |r| format!("{shown} answered {r}"))?);
            }
        }
        coll.insert_one(doc! {"_id": 5}).await?;
        let documents = match refusals.as_slice() {
            [] => Support::Yes,
            some => no(format!(
                "inserts of {}",
                some.iter()
                    .filter_map(Support::reason)
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        };
        // A tailable cursor on a capped collection holding documents: MongoDB keeps it open
        // (a cursor id) to wait for more.
        let tail = db
            .run_command(
                doc! {"find": name.as_str(), "filter": {}, "tailable": true, "awaitData": true},
            )
            .await?;
        let tail_id = tail
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get("id"))
            .and_then(bson_as_i64)
            .unwrap_or(0);
        let tails = if tail_id != 0 {
            let _ = db
                .run_command(doc! {"killCursors": name.as_str(), "cursors": [tail_id]})
                .await;
            Support::Yes
        } else {
            no(
                "a tailable awaitData find on a capped collection that holds documents answered \
                 with cursor id 0 (the server closed the cursor after its first batch)",
            )
        };
        let mut held = 0;
        let mut cursor = coll.find(doc! {}).await?;
        while let Some(d) = cursor.next().await {
            d?;
            held += 1;
        }
        let bounds = if held <= 1 {
            Support::Yes
        } else {
            no(format!(
                "a capped collection created with max 1 held {held} documents right after \
                 further inserts (the server evicts later, in the background)"
            ))
        };
        Ok::<_, crate::StoreError>((documents, bounds, tails))
    }
    .await;
    let dropped = coll.drop().await;
    let found = outcome?;
    if let Err(e) = dropped {
        Problem {
            error_type: "probe",
            detail: &format!(
                "could not drop the probe's scratch collection {name} ({})",
                reply_of(&e)
            ),
        }
        .warn();
    }
    Ok(found)
}

/// Corners of MongoDB's query semantics (arrays, nulls, index parts of paths) where a
/// wire-compatible server may answer otherwise: `(filter, documents)`, each document storable
/// on any such server (no `$` or dotted keys, no nested arrays).
fn filter_corners() -> Vec<(serde_json::Value, Vec<serde_json::Value>)> {
    use serde_json::json;
    vec![
        (
            json!({"a.b": null}),
            vec![json!({"a": [{"b": 3}, {}]}), json!({"a": [1, "string", 4]})],
        ),
        (json!({"a.b": {"$ne": null}}), vec![json!({"a": [1, 2]})]),
        (json!({"tags.01": "b"}), vec![json!({"tags": ["a", "b"]})]),
        (
            json!({"v": {"$in": [{"k": "x"}]}}),
            vec![json!({"v": [{"k": "x"}]})],
        ),
        (
            json!({"h": {"text": "rust", "indices": [0, 4]}}),
            vec![json!({"h": [{"text": "rust", "indices": [0, 4]}]})],
        ),
    ]
}

/// Whether the server answers the [`filter_corners`] as MongoDB does (tailrace's own
/// [`crate::Filter`] is the reference: its table of cases follows MongoDB's manual and
/// server). On a scratch collection, dropped afterwards.
async fn probe_filters(db: &Database) -> Result<Support> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!("tailrace_probe_{}_{nanos}_filters", std::process::id());
    let coll = db.collection::<BsonDoc>(&name);
    let outcome = async {
        let mut differences = Vec::new();
        let mut next_id = 0_i32;
        for (filter_json, docs) in filter_corners() {
            let filter = crate::Filter::parse(&filter_json)
                .map_err(|e| crate::StoreError::Invalid(e.to_string()))?;
            let mut expected = Vec::new();
            let mut stored = Vec::new();
            for d in &docs {
                next_id += 1;
                let body = d.as_object().cloned().unwrap_or_default();
                if filter.matches(&body) {
                    expected.push(next_id);
                }
                let mut bson = super::convert::doc_to_bson(&body);
                bson.insert("_id", next_id);
                stored.push(bson);
            }
            coll.insert_many(stored).await?;
            let first = next_id - docs.len() as i32 + 1;
            let query = match super::convert::json_to_bson(&filter.to_mongo("")) {
                Bson::Document(q) => q,
                _ => BsonDoc::new(),
            };
            let query = doc! {"$and": [{"_id": {"$gte": first, "$lte": next_id}}, query]};
            let mut found = Vec::new();
            let mut cursor = coll.find(query).await?;
            while let Some(d) = cursor.next().await {
                if let Some(id) = d?.get("_id").and_then(bson_as_i64) {
                    found.push(id as i32);
                }
            }
            found.sort_unstable();
            if found != expected {
                let shown = |ids: &[i32]| {
                    let picked: Vec<serde_json::Value> = ids
                        .iter()
                        .filter_map(|id| docs.get((id - first) as usize).cloned())
                        .collect();
                    serde_json::Value::Array(picked)
                };
                differences.push(format!(
                    "find {filter_json} matched {} where MongoDB matches {}",
                    shown(&found),
                    shown(&expected)
                ));
            }
        }
        Ok::<_, crate::StoreError>(differences)
    }
    .await;
    let _ = coll.drop().await;
    match outcome {
        Ok(d) if d.is_empty() => Ok(Support::Yes),
        Ok(d) => Ok(no(d.join("; "))),
        Err(e) if e.is_transient() => Err(e),
        // A server that cannot even run the probe gets filters evaluated here: always right.
        Err(e) => Ok(no(format!("the filter probe failed: {e}"))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The probe's corners, answered by tailrace's own filter (the reference it compares the
    /// server with): each corner has a document MongoDB matches or one it does not, so a server
    /// that answers every query with everything or nothing differs somewhere.
    #[test]
    fn the_filter_corners_mean_what_mongodb_means() {
        let answers: Vec<Vec<bool>> = filter_corners()
            .into_iter()
            .map(|(f, docs)| {
                let f = crate::Filter::parse(&f).unwrap();
                docs.iter()
                    .map(|d| f.matches(d.as_object().unwrap()))
                    .collect()
            })
            .collect();
        assert_eq!(
            answers,
            vec![
                vec![true, false],
                vec![true],
                vec![false],
                vec![true],
                vec![true],
            ]
        );
    }

    #[test]
    fn hello_tells_a_member_from_a_named_server_without_set_state() {
        let member = Hello::from_reply(&doc! {
            "setName": "rs0", "setVersion": 1, "maxWireVersion": 21,
        });
        assert!(member.replica_set() && member.set_version);
        assert_eq!(member.wire_version, 21);
        let named = Hello::from_reply(&doc! {"setName": "rs0", "maxWireVersion": 21});
        assert!(named.replica_set() && !named.set_version);
        let standalone = Hello::from_reply(&doc! {"maxWireVersion": 17});
        assert!(!standalone.replica_set());
        let router = Hello::from_reply(&doc! {"msg": "isdbgrid", "maxWireVersion": 21});
        assert!(router.replica_set() && router.mongos);
    }
}
