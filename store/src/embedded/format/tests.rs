//! Unit tests of `format.rs`.

use super::*;

#[test]
fn a_record_reads_back_entry_by_entry_across_blocks() {
    let mut b = Builder::new();
    b.section("events", 7, 3);
    let big = "東京 🦀 ".repeat(5000);
    let docs: Vec<String> = (0..20)
        .map(|i| {
            format!(
                r#"{{"n":{i},"text":"{}"}}"#,
                if i == 5 { &big } else { "x" }
            )
        })
        .collect();
    for d in &docs {
        b.doc(d.as_bytes());
    }
    b.set_oldest_after(4);
    b.section("dead", 1, 1);
    b.doc(b"{}");
    b.change(
        41,
        ChangeOp::Update,
        "rollups",
        "hashtags:\u{0}x",
        Some(b"{\"count\":1}"),
        Some(b"{\"count\":2}"),
    );
    b.change(42, ChangeOp::Delete, "rollups", "k", Some(b"{}"), None);
    b.checkpoint("tail", b"{\"pos\":1}");
    let mut out = Vec::new();
    b.finish(9, 123, 0, &mut out);
    assert!(check(&out));
    let h = Header::parse(&out).unwrap();
    assert_eq!(h.lsn, 9);
    assert_eq!(h.ts, 123);
    assert_eq!(h.sections[0].first, 7);
    assert_eq!(h.sections[0].count, 20);
    assert_eq!(h.sections[0].oldest_after, 4);
    assert_eq!(h.sections[1].coll, "dead");
    assert_eq!((h.change_first, h.change_count, h.checkpoints), (41, 2, 1));
    assert!(h.blocks.len() >= 2, "the big document starts a new block");
    assert!(
        h.blocks.iter().any(|b| b.codec == LZ4),
        "repetitive text compresses"
    );
    let seen = entries_of(&out);
    assert_eq!(seen.len(), 24);
    assert!(
        seen.iter()
            .enumerate()
            .all(|(i, (index, _))| i as u32 == *index)
    );
    assert!(seen[22].1.contains("Delete"));
    assert!(seen[23].1.contains("tail"));
    // A flipped byte fails the checksum.
    let mut bad = out.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(!check(&bad));
    assert_eq!(
        Header::peek(&out[..FIXED]),
        Some((h.blocks[0].offset as usize, out.len()))
    );
    assert_eq!(Header::peek(&[0u8; FIXED]), None);
}

/// Every entry of a record, as its index and debug text, through the header's blocks.
fn entries_of(out: &[u8]) -> Vec<(u32, String)> {
    assert!(check(out));
    let h = Header::parse(out).unwrap();
    let mut seen = Vec::new();
    for i in 0..h.blocks.len() {
        let data = h.block(out, i).unwrap();
        for e in h.entries(i, &data) {
            let (index, entry) = e.unwrap();
            seen.push((index, format!("{entry:?}")));
        }
    }
    seen
}

#[test]
fn a_builder_kept_between_records_writes_each_as_a_new_one_would() {
    // Records in the order a writer meets them: small, one entry past 64 KiB (the
    // compressor's table grows for it), small again after it, incompressible bytes (kept
    // raw), and an empty one.
    let mut noise = 0x2545_F491_4F6C_DD1Du64;
    let incompressible: String = (0..40_000)
        .map(|_| {
            noise ^= noise << 13;
            noise ^= noise >> 7;
            noise ^= noise << 17;
            char::from(b'!' + (noise % 90) as u8)
        })
        .collect();
    let huge = format!(r#"{{"text":"{}"}}"#, "ʻāina 🌺 ".repeat(9000));
    let records: Vec<Vec<String>> = vec![
        vec![r#"{"a":1}"#.into(), r#"{"$b.c":"東京"}"#.into()],
        vec![huge.clone(), r#"{"after":"big"}"#.into()],
        (0..300)
            .map(|i| format!(r#"{{"n":{i},"tag":"x"}}"#))
            .collect(),
        vec![format!(r#"{{"noise":"{incompressible}"}}"#), huge],
        vec![],
    ];
    let mut kept = Builder::new();
    let (mut kept_out, mut fresh_out) = (Vec::new(), Vec::new());
    let mut codecs = Vec::new();
    for (lsn, docs) in records.iter().enumerate() {
        let mut fresh = Builder::new();
        kept.clear();
        for b in [&mut kept, &mut fresh] {
            b.section("events", 1 + lsn as u64 * 1000, 1);
            for d in docs {
                b.doc(d.as_bytes());
            }
            b.change(
                lsn as u64 + 1,
                ChangeOp::Insert,
                "r",
                "k",
                None,
                Some(b"{}"),
            );
            b.checkpoint("tail", format!(r#"{{"pos":{lsn}}}"#).as_bytes());
        }
        kept.finish(lsn as u64, 7, 0, &mut kept_out);
        fresh.finish(lsn as u64, 7, 0, &mut fresh_out);
        let (a, b) = (entries_of(&kept_out), entries_of(&fresh_out));
        assert_eq!(a.len(), docs.len() + 2, "record {lsn}");
        assert_eq!(a, b, "record {lsn}");
        let h = Header::parse(&kept_out).unwrap();
        assert_eq!(
            (h.lsn, h.change_first, h.checkpoints),
            (lsn as u64, lsn as u64 + 1, 1)
        );
        assert_eq!(
            h.sections.len(),
            1,
            "no section left over from the record before"
        );
        assert_eq!(h.sections[0].count as usize, docs.len());
        codecs.extend(h.blocks.iter().map(|b| b.codec));
    }
    assert!(codecs.contains(&RAW), "incompressible bytes are kept raw");
    assert!(codecs.contains(&LZ4));
    // A record bigger than what is kept: its buffer is let go at the next one.
    kept.clear();
    kept.section("events", 1, 1);
    let big = format!(r#"{{"t":"{}"}}"#, "x".repeat(KEEP_RAW));
    kept.doc(big.as_bytes());
    assert!(kept.raw.capacity() > KEEP_RAW);
    kept.clear();
    assert!(kept.raw.capacity() <= KEEP_RAW);
}

/// What the writer stores ([`write_doc`]), checked to be what `serde_json` writes, read
/// back through [`parse_doc`].
fn round_trip(doc: &serde_json::Value) -> Document {
    let mut json = Vec::new();
    write_doc(doc.as_object().unwrap(), &mut json).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&json),
        String::from_utf8_lossy(&serde_json::to_vec(doc).unwrap()),
        "not what serde_json writes"
    );
    assert_eq!(doc_json(doc.as_object().unwrap()).unwrap().as_bytes(), json);
    parse_doc(&json).unwrap()
}

#[test]
fn shared_text_is_what_write_doc_writes_after_a_large_document_too() {
    // One past the kept buffer, then a small one: the buffer let go must not leak the
    // large document's bytes into the next.
    let large = serde_json::json!({"text": "ü".repeat(40_000), "n": 1});
    let small = serde_json::json!({"a": [1, 2.5, "x"], "b": {"c": null}});
    for doc in [&small, &large, &small, &large, &large, &small] {
        let mut expected = Vec::new();
        write_doc(doc.as_object().unwrap(), &mut expected).unwrap();
        assert_eq!(
            doc_json(doc.as_object().unwrap()).unwrap().as_bytes(),
            expected
        );
    }
}

#[test]
fn stored_documents_are_written_as_serde_json_writes() {
    // Every scalar value, in texts and in keys, 512 to a document: the escapes of control
    // characters, quotes and backslashes, and UTF-8 of every length. Floats, integers and
    // nesting: `stored_documents_read_back_as_written`, through the same `round_trip`.
    let chars: Vec<char> = (0..=0x10_FFFF).filter_map(char::from_u32).collect();
    for chunk in chars.chunks(512) {
        let text: String = chunk.iter().collect();
        let mut doc = serde_json::Map::new();
        for c in chunk {
            doc.insert(format!("{c}k"), serde_json::json!(c.to_string()));
        }
        doc.insert("text".into(), serde_json::json!(text));
        let doc = serde_json::Value::Object(doc);
        assert_eq!(serde_json::Value::Object(round_trip(&doc)), doc);
    }
}

#[test]
fn stored_documents_read_back_as_written() {
    // Floats: random bit patterns (every exponent, subnormals) and the edges. `Value`'s
    // equality says 0.0 == -0.0, so the bits are compared.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let edges = [
        0.0,
        -0.0,
        f64::MIN_POSITIVE,
        5e-324,
        f64::MAX,
        f64::MIN,
        f64::EPSILON,
        0.1 + 0.2,
        9_007_199_254_740_993.0,
        1e23,
    ];
    let floats: Vec<f64> = edges
        .into_iter()
        .chain(
            (0..200_000)
                .map(|_| f64::from_bits(next()))
                .filter(|f| f.is_finite()),
        )
        .collect();
    for chunk in floats.chunks(1000) {
        let doc = serde_json::json!({ "v": chunk });
        let back = round_trip(&doc);
        let back = back["v"].as_array().unwrap();
        for (a, b) in chunk.iter().zip(back) {
            let b = b.as_f64().unwrap();
            assert_eq!(a.to_bits(), b.to_bits(), "{a:e} read back as {b:e}");
        }
    }
    // Integers keep their kind: u64 beyond i64, i64 below zero, past 2^53.
    let ints = serde_json::json!({
        "u": u64::MAX, "i": i64::MIN, "p": 9_007_199_254_740_993u64, "z": 0, "m": -1,
    });
    let back = round_trip(&ints);
    assert_eq!(serde_json::Value::Object(back.clone()), ints);
    assert_eq!(back["u"].as_u64(), Some(u64::MAX));
    assert_eq!(back["i"].as_i64(), Some(i64::MIN));
    assert!(back["m"].is_i64() && back["z"].is_u64());
    // Keys and texts as the world sends them, nested as deep as the ingester allows.
    let mut deep = serde_json::json!("bottom");
    for _ in 0..100 {
        deep = serde_json::json!({ "$d.e": deep });
    }
    let doc = serde_json::json!({
        "$where": "x", "a.b": {"$ref": 1, "": null}, "text": "東京 🦀 مرحبا שלום Ελλάδα हिन्दी 👩🏽‍💻",
        "escapes": "quote \" backslash \\ nul \u{0} bell \u{7} tab \t newline \n del \u{7f}",
        "e\u{301}": "decomposed", "arr": [true, false, null, [], {}], "deep": deep,
    });
    assert_eq!(serde_json::Value::Object(round_trip(&doc)), doc);
}

proptest::proptest! {
    #[test]
    fn any_stored_text_reads_back(key in ".*", text in ".*") {
        let doc = serde_json::json!({ key.clone(): text, "k": { key: 1.5 } });
        proptest::prop_assert_eq!(serde_json::Value::Object(round_trip(&doc)), doc);
    }
}

#[test]
fn only_a_number_starting_minus_zero_takes_the_slower_parser() {
    for yes in [
        &br#"{"a":-0.0}"#[..],
        br#"{"a":[1,-0.25]}"#,
        br#"{"a": -0e5}"#,
    ] {
        assert!(
            may_hold_negative_zero(yes),
            "{}",
            String::from_utf8_lossy(yes)
        );
    }
    for no in [
        &br#"{"at":"2026-04-01T00:00:00-05:00"}"#[..],
        br#"{"a":-1.5,"b":10}"#,
    ] {
        assert!(
            !may_hold_negative_zero(no),
            "{}",
            String::from_utf8_lossy(no)
        );
    }
}

#[test]
fn a_damaged_stored_document_is_an_error() {
    for bad in [
        &b"{\"a\":\"\xff\"}"[..],
        b"{\"a\":",
        b"[1,2]",
        b"{\"a\":1} x",
        b"",
    ] {
        assert!(
            parse_doc(bad).is_err(),
            "{:?} parsed",
            String::from_utf8_lossy(bad)
        );
    }
}

/// A document read for only some of its paths holds exactly what the whole document holds
/// along them: negative zeros, escapes, every script, nested objects, arrays on the way (taken
/// whole), `$` and dotted keys, and paths the document lacks.
#[test]
fn some_paths_read_as_the_whole_document_reads_them() {
    let doc = serde_json::json!({
        "$schema": "/x", "a.b": 1, "neg": -0.0, "text": "東京 \"q\" \\ \u{1F980} \u{0}",
        "user": {"screen_name": "ü", "ids": [1, -0.0, {"$date": "2026-12-06T14:00:00Z"}], "deep": {"n": -0.0}},
        "tags": [{"t": "a"}, {"t": "b"}],
        "hashtags": ["Ünïcode", "🦀"], "n": 12345678901234567890u64, "f": 0.1,
    });
    let mut bytes = Vec::new();
    write_doc(doc.as_object().unwrap(), &mut bytes).unwrap();
    let whole = parse_doc(&bytes).unwrap();
    let cases: [(&[&str], serde_json::Value); 11] = [
        (
            &["user.screen_name", "hashtags"],
            serde_json::json!({"user": {"screen_name": "ü"}, "hashtags": ["Ünïcode", "🦀"]}),
        ),
        (
            &["neg", "user.deep.n"],
            serde_json::json!({"neg": -0.0, "user": {"deep": {"n": -0.0}}}),
        ),
        (
            &["$schema", "a.b", "missing", "user.missing.x"],
            serde_json::json!({"$schema": "/x"}),
        ),
        (
            &["tags.t", "user.ids.0"],
            serde_json::json!({"tags": [{"t": "a"}, {"t": "b"}], "user": {"ids": [1, -0.0, {"$date": "2026-12-06T14:00:00Z"}]}}),
        ),
        (
            &["user", "user.screen_name"],
            serde_json::json!({"user": whole["user"].clone()}),
        ),
        (
            &["text", "n", "f"],
            serde_json::json!({"text": whole["text"].clone(), "n": whole["n"].clone(), "f": 0.1}),
        ),
        (&[], serde_json::json!({})),
        // One path alone (read in one pass when it runs through objects).
        (
            &["user.deep.n"],
            serde_json::json!({"user": {"deep": {"n": -0.0}}}),
        ),
        (
            &["user.ids.0"],
            serde_json::json!({"user": {"ids": whole["user"]["ids"].clone()}}),
        ),
        (
            &["user.screen_name.x"],
            serde_json::json!({"user": {"screen_name": "ü"}}),
        ),
        (&["user.missing.x"], serde_json::json!({})),
    ];
    for (paths, want) in cases {
        let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
        let some = parse_paths(&bytes, &crate::query::only_paths(&paths)).unwrap();
        let want = want.as_object().unwrap();
        assert_eq!(&some, want, "{paths:?}");
        assert_eq!(
            format!("{some:?}"),
            format!("{want:?}"),
            "same bits (a negative zero stays negative)"
        );
    }
}

/// Reading some paths stops at the last of their first fields: what follows is not looked at
/// (here, text that does not parse), and a path whose field is not met reads to the end.
#[test]
fn some_paths_stop_reading_once_their_fields_were_met() {
    let bytes = br#"{"_tailrace":{"received":{"$date":"2026-12-06T14:00:00.000Z"},"seq":7},"lang":"ja","text":"#;
    let paths = |ps: &[&str]| {
        crate::query::only_paths(&ps.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>())
    };
    let some = parse_paths(
        bytes,
        &paths(&["_tailrace.received", "_tailrace.seq", "lang"]),
    )
    .unwrap();
    assert_eq!(
        serde_json::Value::Object(some),
        serde_json::json!({"_tailrace": {"received": {"$date": "2026-12-06T14:00:00.000Z"}, "seq": 7}, "lang": "ja"})
    );
    assert!(parse_paths(bytes, &paths(&["lang", "user.screen_name"])).is_err());
}
