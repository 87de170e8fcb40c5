//! Unit tests of `convert.rs`.

use super::*;
use crate::update::apply;
use serde_json::json;

fn obj(v: Value) -> Document {
    v.as_object().unwrap().clone()
}

#[test]
fn durability_maps_to_write_concerns_and_never_to_w0() {
    let t = Duration::from_secs(5);
    let wc = |d| write_concern(d, t);
    assert_eq!(
        wc(Durability::Acknowledged).w,
        Some(Acknowledgment::Nodes(1))
    );
    assert_eq!(wc(Durability::Acknowledged).journal, None);
    assert_eq!(wc(Durability::Journaled).w, Some(Acknowledgment::Nodes(1)));
    assert_eq!(wc(Durability::Journaled).journal, Some(true));
    assert_eq!(wc(Durability::Majority).w, Some(Acknowledgment::Majority));
    assert_eq!(wc(Durability::Majority).journal, Some(true));
    for d in Durability::ALL {
        let c = wc(d);
        assert_ne!(
            c.w,
            Some(Acknowledgment::Nodes(0)),
            "{d}: the driver refuses w:0, so no level may produce it"
        );
        assert_eq!(
            c.w_timeout,
            Some(t),
            "{d}: every level carries the wtimeout"
        );
    }
    assert_eq!(
        wc(Durability::Unacknowledged),
        wc(Durability::Acknowledged),
        "unacknowledged is sent as w:1 (in the background)"
    );
}

#[test]
fn json_round_trips_through_bson() {
    let v = json!({
        "s": "x", "i": 7, "neg": -3, "f": 1.5, "whole_float": 2.0, "b": true, "n": null,
        "a": [1, "two", {"three": 3}], "o": {"p": {"q": []}}
    });
    let b = doc_to_bson(&obj(v.clone()));
    assert_eq!(b.get("i"), Some(&Bson::Int64(7)), "integers are Int64");
    assert_eq!(b.get("f"), Some(&Bson::Double(1.5)));
    assert_eq!(Value::Object(bson_doc_to_json(b)), v);
}

/// Keys real streams send (`$`-prefixed, dotted, empty, extended-JSON look-alikes) go
/// through BSON bytes, as the driver sends and the server returns them, unchanged.
#[test]
fn keys_as_the_world_sends_them_survive_bson_bytes() {
    let v = json!({
        "$schema": "/mediawiki/recentchange/1.0.0",
        "meta": {"dt": "2024-05-01T12:00:00Z"},
        "commit": {"record": {"$type": "app.bsky.feed.post",
            "embed": {"video": {"ref": {"$link": "bafkreih"}, "size": 12345}}}},
        "a": {"b.c": {"": {"$inc": true}}}, "..": 1, "名前.姓": "山田",
        "looks_like": {"$oid": "not an ObjectId", "$date": 5, "$numberLong": "7"},
        "_tailrace": {"original": {"_id": {"$oid": "65f1c0ffee"}}},
    });
    let bytes = doc_to_bson(&obj(v.clone())).to_vec().unwrap();
    let back = BsonDoc::from_reader(bytes.as_slice()).unwrap();
    assert_eq!(
        back.get("looks_like").map(Bson::element_type),
        Some(bson::spec::ElementType::EmbeddedDocument),
        "an object that looks like extended JSON stays a document"
    );
    assert_eq!(Value::Object(bson_doc_to_json(back)), v);
}

#[test]
fn a_nul_in_a_key_cannot_be_bson() {
    let mut d = Document::new();
    d.insert("a\u{0}b".into(), json!(1));
    assert!(
        doc_to_bson(&d).to_vec().is_err(),
        "BSON keys are C strings: the ingester must refuse NUL in keys"
    );
    let mut ok = Document::new();
    ok.insert("v".into(), json!("a\u{0}b"));
    assert!(
        doc_to_bson(&ok).to_vec().is_ok(),
        "a NUL in a string value is fine"
    );
}

#[test]
fn foreign_bson_types_read_as_extended_json() {
    let oid = mongodb::bson::oid::ObjectId::new();
    let d = doc! {"_id": oid, "at": mongodb::bson::DateTime::from_millis(0), "i32": 5_i32};
    let j = bson_doc_to_json(d);
    assert_eq!(j["_id"], json!({"$oid": oid.to_hex()}));
    assert!(
        j["at"].get("$date").is_some(),
        "dates read as {{$date}}: {}",
        j["at"]
    );
    assert_eq!(j["i32"], json!(5));
}

#[test]
fn numbers_from_any_bson_numeric_type() {
    assert_eq!(bson_as_i64(&Bson::Int32(4)), Some(4));
    assert_eq!(bson_as_i64(&Bson::Int64(1 << 40)), Some(1 << 40));
    assert_eq!(bson_as_i64(&Bson::Double(4096.0)), Some(4096));
    assert_eq!(bson_as_i64(&Bson::Double(1.5)), None);
    assert_eq!(bson_as_i64(&Bson::String("1".into())), None);
}

#[test]
fn regex_escape_quotes_every_metacharacter() {
    assert_eq!(regex_escape("source:a"), "source:a");
    assert_eq!(regex_escape("a.b*c"), "a\\.b\\*c");
    assert_eq!(
        regex_escape("(x)[y]{z}^$|?+\\"),
        "\\(x\\)\\[y\\]\\{z\\}\\^\\$\\|\\?\\+\\\\"
    );
}

fn command_error(code: i32, name: &str) -> DriverError {
    let ce: mongodb::error::CommandError = bson::deserialize_from_document(doc! {
        "code": code, "codeName": name, "errmsg": format!("{name} happened"),
    })
    .unwrap();
    DriverError::from(ErrorKind::Command(ce))
}

#[test]
fn error_codes_map_by_meaning() {
    assert_eq!(class_of_code(136), Class::PositionLost);
    assert_eq!(class_of_code(286), Class::HistoryLost);
    assert_eq!(class_of_code(14), Class::Invalid);
    assert_eq!(class_of_code(10107), Class::Transient);
    assert_eq!(
        class_of_code(11000),
        Class::Other,
        "duplicate key is not transient"
    );

    let lost = command_error(136, "CappedPositionLost");
    assert_eq!(error_code(&lost), Some(136));
    assert_eq!(classify(&lost), Class::PositionLost);
    let e = map_error(lost);
    assert!(
        matches!(
            e,
            StoreError::Engine {
                engine: "mongodb",
                ..
            }
        ),
        "136 needs the reader's position, so From maps it to Engine: {e}"
    );

    let history = map_error(command_error(286, "ChangeStreamHistoryLost"));
    assert!(history.is_history_lost(), "286 is HistoryLost: {history}");

    let bad = map_error(command_error(14, "TypeMismatch"));
    assert!(matches!(bad, StoreError::Invalid(_)), "got {bad}");

    let other = map_error(command_error(11000, "DuplicateKey"));
    let text = other.to_string();
    assert!(
        text.contains("mongodb") && text.contains("DuplicateKey"),
        "got {text}"
    );

    // "This server does not support X" is neither a bad request nor an engine failure:
    // CommandNotFound, CommandNotSupported, NotImplemented, a change stream on a server
    // that is not a replica set, an unknown pipeline stage.
    for (code, name) in [
        (59, "CommandNotFound"),
        (115, "CommandNotSupported"),
        (238, "NotImplemented"),
        (40573, "Location40573"),
        (40324, "Location40324"),
    ] {
        let e = map_error(command_error(code, name));
        assert!(
            matches!(&e, StoreError::Unsupported { reply, .. } if reply.contains(name) && reply.contains(&code.to_string())),
            "{code} {name} is Unsupported, quoting the reply: {e}"
        );
        assert!(!e.is_transient(), "{code} does not pass with a retry");
    }
    // A malformed request stays a bad request.
    let parse = map_error(command_error(9, "FailedToParse"));
    assert!(matches!(parse, StoreError::Invalid(_)), "got {parse}");

    let shut = map_error(DriverError::from(ErrorKind::Shutdown));
    assert!(matches!(shut, StoreError::Closed), "got {shut}");

    let io = DriverError::from(std::io::Error::other("reset"));
    assert_eq!(classify(&io), Class::Transient);

    let via_from: StoreError = command_error(286, "ChangeStreamHistoryLost").into();
    assert!(
        via_from.is_history_lost(),
        "the From impl in error.rs maps 286 too"
    );
}

/// `apply(doc, normalized)` equals `apply(doc, original)` on every start document where
/// `apply(doc, original)` succeeds.
fn same_as_apply(update: Update, starts: &[Value]) {
    let normalized = normalize_update(&update).unwrap();
    for start in starts {
        let mut want = obj(start.clone());
        let mut got = obj(start.clone());
        if apply(&mut want, &update).is_err() {
            continue;
        }
        apply(&mut got, &normalized).unwrap();
        assert_eq!(got, want, "{update:?} as {normalized:?} on {start}");
        // And MongoDB's own rule holds: no path is touched twice or with its parent.
        let paths: Vec<&String> = normalized
            .inc
            .iter()
            .map(|(p, _)| p)
            .chain(normalized.set.iter().map(|(p, _)| p))
            .collect();
        for (i, a) in paths.iter().enumerate() {
            for b in &paths[i + 1..] {
                assert!(a != b && !is_under(a, b) && !is_under(b, a), "{a} vs {b}");
            }
        }
    }
}

#[test]
fn normalized_updates_mean_what_apply_means() {
    let starts = [
        json!({}),
        json!({"count": 4, "a": {"b": 1}}),
        json!({"a": {"b": 2.5, "c": "x"}, "tag": "old"}),
    ];
    same_as_apply(Update::inc("count", 1), &starts);
    same_as_apply(Update::inc("count", 2).and_inc("count", 3), &starts);
    same_as_apply(Update::inc("a.b", 2).and_set("tag", "x"), &starts);
    same_as_apply(Update::inc("a.b", 2).and_set("a.b", 9), &starts);
    same_as_apply(Update::inc("a.b", 2).and_set("a", json!({"z": 1})), &starts);
    same_as_apply(
        Update::default()
            .and_set("a", json!({"k": 1}))
            .and_set("a.m.n", 2),
        &starts,
    );
    same_as_apply(
        Update::default().and_set("a.b", 1).and_set("a", json!({})),
        &starts,
    );
    same_as_apply(Update::default().and_set("x", 1).and_set("x", 2), &starts);
    same_as_apply(
        Update {
            inc: vec![("n".into(), json!(1)), ("n".into(), json!(0.5))],
            set: vec![],
        },
        &starts,
    );
}

#[test]
fn updates_apply_refuses_are_refused() {
    for u in [
        Update::inc("a", 1).and_inc("a.b", 1),
        Update::inc("a", 1).and_set("a.b", 1),
        Update::default().and_set("a", 5).and_set("a.b", 1),
        Update {
            inc: vec![("n".into(), json!("one"))],
            set: vec![],
        },
        Update::inc("", 1),
        Update::inc("a..b", 1),
        Update::inc("$where", 1),
        Update::default().and_set("_id", "other"),
    ] {
        assert!(
            matches!(normalize_update(&u), Err(StoreError::Invalid(_))),
            "{u:?} must be refused"
        );
    }
}

#[test]
fn update_document_has_the_mongodb_shape() {
    let d = update_document(&Update::inc("count", 2).and_set("tag", "x")).unwrap();
    assert_eq!(
        d,
        doc! {"$inc": {"count": 2_i64}, "$set": {"tag": "x"}},
        "one $inc and one $set"
    );
    let d = update_document(&Update::inc("a.b", 1).and_inc("a.b", 1)).unwrap();
    assert_eq!(d, doc! {"$inc": {"a.b": 2_i64}});
    let d = update_document(&Update::default()).unwrap();
    assert_eq!(
        d,
        doc! {"$set": {}},
        "an empty update still upserts the key"
    );
    let d = update_document(&Update {
        inc: vec![("f".into(), json!(0.25))],
        set: vec![],
    })
    .unwrap();
    assert_eq!(d, doc! {"$inc": {"f": 0.25}});
}

#[test]
fn oplog_tokens_round_trip_and_order() {
    let p = OplogPos {
        t: 1_700_000_000,
        i: 7,
        n: 2,
        end: false,
    };
    let tok = encode_token(&Token::Oplog(p)).unwrap();
    assert_eq!(decode_token(&tok).unwrap(), Token::Oplog(p));
    let ts = Timestamp {
        time: 5,
        increment: 9,
    };
    assert!(OplogPos::before(ts) < OplogPos::entry(ts));
    assert_eq!(
        OplogPos::entry(ts).resume_operation_time(),
        Timestamp {
            time: 5,
            increment: 10
        },
        "after a whole entry: the next timestamp"
    );
    assert_eq!(OplogPos::before(ts).resume_operation_time(), ts);
}

#[test]
fn stream_tokens_round_trip_as_json() {
    let data = "8263D1A2B3000000012B042C0100296E5A1004A5";
    let t: DriverToken = bson::deserialize_from_bson(Bson::Document(doc! {"_data": data})).unwrap();
    let tok = encode_token(&Token::Stream(t.clone())).unwrap();
    let json: Value = serde_json::from_str(&tok.0).unwrap();
    assert_eq!(
        json,
        json!({"_data": data}),
        "the token is the JSON of the driver's"
    );
    assert_eq!(decode_token(&tok).unwrap(), Token::Stream(t));
    for bad in ["", "7", "{}", "{\"oplog\":{}}", "{\"x\":1}"] {
        let e = decode_token(&ResumeToken(bad.into())).unwrap_err();
        assert!(matches!(e, StoreError::Invalid(_)), "{bad:?}: {e}");
    }
}

/// The received time tailrace stamps (`{"$date": ...}`) is a real BSON date on the server,
/// and reads back as the same instant.
#[test]
fn a_date_is_stored_as_a_bson_date() {
    let v = json!({"at": {"$date": "2026-12-06T14:00:00.250Z"}, "not": {"$date": "soon"}});
    let b = doc_to_bson(&obj(v));
    assert_eq!(
        b.get("at"),
        Some(&Bson::DateTime(bson::DateTime::from_millis(
            1_796_565_600_250
        )))
    );
    assert_eq!(
        b.get("not").map(Bson::element_type),
        Some(bson::spec::ElementType::EmbeddedDocument),
        "what is not a date stays a document"
    );
    let back = bson_doc_to_json(b);
    assert_eq!(crate::date::millis(&back["at"]), Some(1_796_565_600_250));
}
