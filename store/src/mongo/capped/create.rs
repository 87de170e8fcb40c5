//! Creating a capped collection, and checking an existing one against its spec.

use mongodb::bson::{Bson, Document as BsonDoc, doc};
use mongodb::options::IndexOptions;
use mongodb::{Collection, Database, IndexModel};

use super::super::convert::{bson_as_i64, engine_err, error_code};
use crate::names::check_field;
use crate::telemetry::Problem;
use crate::{CappedSpec, Result, StoreError};

/// The server's error code for "namespace already exists" (a concurrent creator won).
const NAMESPACE_EXISTS: i32 = 48;

/// The `listCollections` entry of `name`, if it exists.
pub(crate) async fn collection_info(db: &Database, name: &str) -> Result<Option<BsonDoc>> {
    let reply = db
        .run_command(doc! {"listCollections": 1, "filter": {"name": name}})
        .await?;
    let first = reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .and_then(|b| b.first())
        .and_then(Bson::as_document)
        .cloned();
    Ok(first)
}

/// The options of a capped collection, for creating one and for checking an existing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CappedOptions {
    /// `size`: the byte limit (the server rounds it up to a multiple of 256, minimum 4096).
    pub size: u64,
    /// `max`: the document limit.
    pub max: u64,
}

impl CappedOptions {
    /// What a spec asks MongoDB for.
    pub(crate) fn from_spec(spec: &CappedSpec) -> Self {
        CappedOptions {
            size: spec.max_bytes,
            max: spec.max_docs,
        }
    }
}

/// Checks an existing collection's `listCollections` entry against the spec: it must be a
/// capped collection at least as large as configured. `Ok(Some(warning))` when it is larger.
pub(crate) fn check_existing_capped(
    name: &str,
    info: &BsonDoc,
    want: CappedOptions,
) -> Result<Option<String>> {
    let incompatible = |problem: String| StoreError::Incompatible {
        collection: name.to_string(),
        problem,
    };
    let kind = info.get_str("type").unwrap_or("collection");
    if kind != "collection" {
        return Err(incompatible(format!(
            "exists as a MongoDB {kind}, not a capped collection; drop it or choose another name"
        )));
    }
    let empty = BsonDoc::new();
    let options = info.get_document("options").unwrap_or(&empty);
    if !options.get_bool("capped").unwrap_or(false) {
        return Err(incompatible(format!(
            "exists and is not capped, so it cannot be tailed or bounded; drop it \
             (db.{name}.drop()), rename it, or configure another collection name"
        )));
    }
    let size = options
        .get("size")
        .and_then(bson_as_i64)
        .unwrap_or(0)
        .max(0) as u64;
    let max = options.get("max").and_then(bson_as_i64).unwrap_or(0).max(0) as u64;
    if size < want.size {
        return Err(incompatible(format!(
            "is capped at {size} bytes, smaller than the configured max_bytes {}; enlarge it with \
             db.runCommand({{collMod: \"{name}\", cappedSize: {}}}) (MongoDB 6.0+), or drop it, \
             or lower max_bytes",
            want.size, want.size
        )));
    }
    if max > 0 && max < want.max {
        return Err(incompatible(format!(
            "is capped at {max} documents, fewer than the configured max_docs {}; enlarge it with \
             db.runCommand({{collMod: \"{name}\", cappedMax: {}}}) (MongoDB 6.0+), or drop it, \
             or lower max_docs",
            want.max, want.max
        )));
    }
    // The server rounds `size` up to a multiple of 256 bytes, at least 4096: not "larger".
    let rounded = want.size.div_ceil(256).saturating_mul(256).max(4096);
    if size > rounded || max == 0 || max > want.max {
        let max_text = if max == 0 {
            "no document limit".to_string()
        } else {
            format!("{max} documents")
        };
        return Ok(Some(format!(
            "existing capped collection {name} is larger than configured ({size} bytes, \
             {max_text}; configured {} bytes, {} documents): it keeps more",
            want.size, want.max
        )));
    }
    Ok(None)
}

/// The name of the index that serves `latest(field, ..)`.
pub(crate) fn latest_index_name(field: &str) -> String {
    format!("tailrace_latest_{field}")
}

/// The key of that index: the field, then `_id`, so "newest N with field = value" is an index
/// range read backwards, with no in-memory sort.
pub(crate) fn latest_index_keys(field: &str) -> BsonDoc {
    doc! {field: 1, "_id": 1}
}

/// Creates the capped collection when absent, refuses an incompatible existing one, and
/// creates the indexes `latest` uses.
pub(crate) async fn ensure_capped(db: &Database, name: &str, spec: &CappedSpec) -> Result<()> {
    let want = CappedOptions::from_spec(spec);
    for field in &spec.indexes {
        check_field(field)?;
    }
    let mut created = false;
    loop {
        match collection_info(db, name).await? {
            Some(info) => {
                if let Some(warning) = check_existing_capped(name, &info, want)? {
                    Problem {
                        error_type: "collection_options",
                        detail: &warning,
                    }
                    .warn();
                }
                break;
            }
            None if created => {
                return Err(engine_err(format!(
                    "capped collection {name} was created but is not listed"
                )));
            }
            None => {
                let res = db
                    .create_collection(name)
                    .capped(true)
                    .size(want.size)
                    .max(want.max)
                    .await;
                match res {
                    Ok(()) => {}
                    // Another process created it meanwhile: check what it created.
                    Err(e) if error_code(&e) == Some(NAMESPACE_EXISTS) => {}
                    Err(e) => return Err(e.into()),
                }
                created = true;
            }
        }
    }
    if !spec.indexes.is_empty() {
        let coll = db.collection::<BsonDoc>(name);
        let models = spec
            .indexes
            .iter()
            .map(|field| (latest_index_name(field), latest_index_keys(field)))
            .collect();
        ensure_indexes(&coll, models).await?;
    }
    Ok(())
}

/// Creates the indexes (by name) that the collection lacks. Asking for the ones it has would
/// be a no-op on MongoDB; FerretDB (1.24) answers it by dropping the connection (a panic in
/// its `createIndexes`), so a restarted process could not open its collections.
pub(crate) async fn ensure_indexes(
    coll: &Collection<BsonDoc>,
    wanted: Vec<(String, BsonDoc)>,
) -> Result<()> {
    let existing = coll.list_index_names().await?;
    let missing: Vec<IndexModel> = wanted
        .into_iter()
        .filter(|(name, _)| !existing.contains(name))
        .map(|(name, keys)| {
            IndexModel::builder()
                .keys(keys)
                .options(IndexOptions::builder().name(name).build())
                .build()
        })
        .collect();
    if !missing.is_empty() {
        coll.create_indexes(missing).await?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn info(options: BsonDoc) -> BsonDoc {
        doc! {"name": "events", "type": "collection", "options": options}
    }

    #[test]
    fn capped_options_come_from_the_spec() {
        let spec = CappedSpec {
            max_docs: 100_000,
            max_bytes: 64 << 20,
            indexes: vec!["user.id".into()],
        };
        assert_eq!(
            CappedOptions::from_spec(&spec),
            CappedOptions {
                size: 64 << 20,
                max: 100_000
            }
        );
        assert_eq!(latest_index_keys("user.id"), doc! {"user.id": 1, "_id": 1});
        assert_eq!(latest_index_name("user.id"), "tailrace_latest_user.id");
    }

    #[test]
    fn existing_collections_are_checked_not_silently_used() {
        let want = CappedOptions {
            size: 4096,
            max: 10,
        };
        let not_capped = check_existing_capped("events", &info(doc! {}), want).unwrap_err();
        assert!(
            matches!(&not_capped, StoreError::Incompatible { collection, problem }
                if collection == "events" && problem.contains("not capped") && problem.contains("drop")),
            "got {not_capped}"
        );
        let small = check_existing_capped(
            "events",
            &info(doc! {"capped": true, "size": 1024_i32, "max": 10_i64}),
            want,
        )
        .unwrap_err();
        assert!(
            small.to_string().contains("collMod"),
            "names the fix: {small}"
        );
        let few = check_existing_capped(
            "events",
            &info(doc! {"capped": true, "size": 4096.0, "max": 5_i32}),
            want,
        )
        .unwrap_err();
        assert!(few.to_string().contains("max_docs"), "got {few}");
        let view = check_existing_capped(
            "events",
            &doc! {"name": "events", "type": "view", "options": {}},
            want,
        )
        .unwrap_err();
        assert!(view.to_string().contains("view"), "got {view}");
        assert_eq!(
            check_existing_capped(
                "events",
                &info(doc! {"capped": true, "size": 4096_i64, "max": 10_i64}),
                want
            )
            .unwrap(),
            None,
            "exactly as configured"
        );
        let larger = check_existing_capped(
            "events",
            &info(doc! {"capped": true, "size": 8192_i64}),
            want,
        )
        .unwrap();
        assert!(larger.is_some(), "a larger one is used, with a warning");
        let rounded = check_existing_capped(
            "events",
            &info(doc! {"capped": true, "size": 5120_i64, "max": 10_i64}),
            CappedOptions {
                size: 5000,
                max: 10,
            },
        )
        .unwrap();
        assert_eq!(
            rounded, None,
            "the server's rounding up is not a larger collection"
        );
    }
}
