//! Unit tests of `keyed.rs`.

use super::*;

fn upsert(key: &str, once: Option<WriteId>, guard: bool) -> Upsert {
    Upsert {
        key: key.into(),
        update: doc! {"$inc": {"n": 1}},
        once,
        guard,
    }
}

#[test]
fn a_batch_of_upserts_is_one_ordered_update_command_per_chunk() {
    let ops: Vec<Upsert> = (0..UPDATE_CHUNK + 2)
        .map(|i| upsert(&format!("k{i}"), None, false))
        .collect();
    let wc = doc! {"j": true};
    let commands = update_commands("rollups", &ops, Some(&wc), false);
    assert_eq!(commands.len(), 2, "two chunks");
    let first = &commands[0];
    assert_eq!(first.get_str("update").unwrap(), "rollups");
    assert!(first.get_bool("ordered").unwrap());
    assert_eq!(first.get_array("updates").unwrap().len(), UPDATE_CHUNK);
    let statement = first.get_array("updates").unwrap()[0]
        .as_document()
        .unwrap();
    assert_eq!(
        statement.get_document("q").unwrap(),
        &doc! {"_id": "k0"},
        "an upsert sent for the first time needs no guard"
    );
    assert!(statement.get_bool("upsert").unwrap());
    assert!(
        first
            .get_document("writeConcern")
            .unwrap()
            .get_bool("j")
            .unwrap()
    );
    assert_eq!(commands[1].get_array("updates").unwrap().len(), 2);
    let in_txn = update_commands("rollups", &ops[..1], None, true);
    assert!(in_txn[0].get("writeConcern").is_none());
}

#[test]
fn a_named_upsert_leaves_its_name_and_sent_again_is_guarded_by_it() {
    let id = WriteId {
        writer: u64::MAX,
        seq: 7,
    };
    let u = stamped_update(doc! {"$inc": {"n": 1}}, 9, Some(id));
    assert_eq!(
        u,
        doc! {"$inc": {"n": 1}, "$set": {WRITTEN: 9_i64, ONCE_WRITER: -1_i64, ONCE_SEQ: 7_i64}},
        "the writer's 64 bits kept as an i64"
    );
    let guarded = update_command("r", &[upsert("k", Some(id), true)], None, false);
    let statement = guarded.get_array("updates").unwrap()[0]
        .as_document()
        .unwrap();
    assert_eq!(
        statement.get_document("q").unwrap(),
        &doc! {"_id": "k", "$or": [{ONCE_WRITER: {"$ne": -1_i64}}, {ONCE_SEQ: {"$lt": 7_i64}}]}
    );
    for (guard, in_transaction) in [(false, false), (true, true)] {
        let plain = update_command("r", &[upsert("k", Some(id), guard)], None, in_transaction);
        let statement = plain.get_array("updates").unwrap()[0]
            .as_document()
            .unwrap();
        assert_eq!(
            statement.get_document("q").unwrap(),
            &doc! {"_id": "k"},
            "first sent, or in a transaction (names read first)"
        );
    }

    // Applied: the same writer at this sequence number or a later one.
    let stored = |writer: i64, seq: i64| doc! {"_id": "k", ONCE_WRITER: writer, ONCE_SEQ: seq};
    assert!(shows_applied(&stored(-1, 7), id));
    assert!(shows_applied(&stored(-1, 8), id));
    assert!(
        !shows_applied(&stored(-1, 6), id),
        "an earlier update of the key"
    );
    assert!(!shows_applied(&stored(5, 9), id), "another writer's name");
    assert!(!shows_applied(&doc! {"_id": "k"}, id), "never named");
    let far = WriteId {
        writer: 1,
        seq: u64::MAX,
    };
    assert_eq!(once_fields(far), (1, i64::MAX), "saturates, never wraps");
}

#[test]
fn an_update_reply_tells_its_first_failed_statement() {
    assert!(update_outcome(&doc! {"ok": 1.0, "n": 3, "nModified": 1}).is_ok());
    let Refusal {
        index,
        code,
        error: refused,
    } = update_outcome(&doc! {
        "ok": 1.0, "n": 1,
        "writeErrors": [{"index": 1, "code": 14, "errmsg": "Cannot apply $inc to a string"}],
    })
    .unwrap_err();
    assert_eq!(index, 1, "the statement before it was applied");
    assert_eq!(code, 14);
    assert!(
        matches!(&refused, StoreError::Invalid(m) if m.contains("$inc")),
        "a refused statement is a bad request: {refused}"
    );
    let partly = after_applied(33, refused);
    assert!(
        matches!(&partly, StoreError::PartlyWritten { written: 33, error } if matches!(**error, StoreError::Invalid(_))),
        "{partly}"
    );
    assert!(matches!(
        after_applied(0, StoreError::Invalid("x".into())),
        StoreError::Invalid(_)
    ));
    let Refusal {
        index, error: wce, ..
    } = update_outcome(&doc! {
        "ok": 1.0, "n": 2,
        "writeConcernError": {"code": 64, "errmsg": "waiting for replication timed out"},
    })
    .unwrap_err();
    assert!(wce.is_transient(), "{wce}");
    assert_eq!(index, usize::MAX, "every statement was applied");
}
use serde_json::json;

#[test]
fn replacement_puts_the_key_first_and_drops_a_foreign_id() {
    let doc = json!({"fresh": true, "_id": "ignored"})
        .as_object()
        .unwrap()
        .clone();
    let r = replacement("a", &doc, 7);
    assert_eq!(r, doc! {"_id": "a", "fresh": true, WRITTEN: 7_i64});
}

#[test]
fn every_write_carries_its_time_and_reads_leave_it_out() {
    let u = stamped_update(doc! {"$inc": {"count": 1}}, 9, None);
    assert_eq!(u, doc! {"$inc": {"count": 1}, "$set": {WRITTEN: 9_i64}});
    let u = stamped_update(doc! {"$set": {"a": 1}}, 9, None);
    assert_eq!(u, doc! {"$set": {"a": 1, WRITTEN: 9_i64}});
    let read = keyed_doc_to_json(
        doc! {"_id": "k", "count": 3, WRITTEN: 9_i64, ONCE_WRITER: 1_i64, ONCE_SEQ: 2_i64},
    );
    assert_eq!(
        serde_json::Value::Object(read),
        json!({"_id": "k", "count": 3})
    );
}

#[test]
fn scan_filters_anchor_an_escaped_prefix() {
    assert_eq!(
        scan_filter("source:a.b"),
        doc! {"_id": {"$regex": "^source:a\\.b"}}
    );
    assert_eq!(scan_filter(""), doc! {"_id": {"$type": "string"}});
}

#[test]
fn scan_pages_continue_after_the_last_key() {
    assert_eq!(
        scan_page_filter("tags:", Some("tags:rust")),
        doc! {"_id": {"$regex": "^tags:", "$gt": "tags:rust"}}
    );
    assert_eq!(
        scan_page_filter("", Some("k")),
        doc! {"_id": {"$type": "string", "$gt": "k"}}
    );
    assert_eq!(scan_page_filter("", None), scan_filter(""));
}

#[test]
fn snapshot_queries_keep_string_keys_and_the_filter() {
    let f = Filter::parse(&json!({"lang": "ja"})).unwrap();
    assert_eq!(
        snapshot_query(Some(&f)),
        doc! {"$and": [{"_id": {"$type": "string"}}, {"lang": {"$eq": "ja"}}]}
    );
    assert_eq!(
        snapshot_query(Some(&Filter::match_all())),
        doc! {"_id": {"$type": "string"}},
        "a filter that matches everything is not sent"
    );
    assert_eq!(snapshot_query(None), doc! {"_id": {"$type": "string"}});
}

#[test]
fn existing_keyed_collections_are_checked() {
    let plain = doc! {"name": "k", "type": "collection", "options": {}};
    assert!(
        check_existing_keyed("k", &plain).unwrap(),
        "images must be switched on"
    );
    let ready = doc! {"name": "k", "type": "collection",
    "options": {"changeStreamPreAndPostImages": {"enabled": true}}};
    assert!(!check_existing_keyed("k", &ready).unwrap());
    let capped =
        doc! {"name": "k", "type": "collection", "options": {"capped": true, "size": 4096}};
    assert!(matches!(
        check_existing_keyed("k", &capped),
        Err(StoreError::Incompatible { .. })
    ));
    let view = doc! {"name": "k", "type": "view", "options": {}};
    assert!(check_existing_keyed("k", &view).is_err());
}
