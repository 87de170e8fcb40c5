//! `POST /api/aggregate` on the running binary: the questions a stream's collector asks
//! (counts by language, top hashtags, events per minute), answered over the stored window,
//! and the pipelines it must refuse with a 400 while it stays up.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Tailrace;
use serde_json::{Value, json};

/// 300 events of ~4 KB: languages ja, en and 🌍 in turn, hashtags from a long tail with two
/// hot ones.
fn events() -> String {
    let langs = ["ja", "en", "🌍"];
    (0..300)
        .map(|i| {
            let mut tags = vec![format!("tail{i}")];
            if i % 2 == 0 {
                tags.push("rust".into());
            }
            if i % 3 == 0 {
                tags.push("Ünïcode".into());
            }
            let text = "🦀 ünïcode text ".repeat(200);
            json!({"id": i, "lang": langs[i % 3], "hashtags": tags, "user": {"id": i % 7}, "text": text})
                .to_string()
                + "\n"
        })
        .collect()
}

async fn post(t: &Tailrace, body: &Value) -> (u16, Value) {
    post_text(t, &body.to_string()).await
}

async fn post_text(t: &Tailrace, body: &str) -> (u16, Value) {
    t.post_json("/api/aggregate", body).await
}

async fn answer(t: &Tailrace, collection: &str, pipeline: Value) -> Value {
    let (status, body) = post(t, &json!({"collection": collection, "pipeline": pipeline})).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_window_answers_aggregations() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.ndjson");
    std::fs::write(&file, events()).unwrap();
    let sources = format!(
        r#"[{{ name = "f", kind = "file", path = "{}", follow = true }}]"#,
        file.display()
    );
    let t = Tailrace::start(
        &dir.path().join("data"),
        &[
            ("TAILRACE_SOURCES", &sources),
            ("TAILRACE_HTTP__QUERY_MAX_BYTES", "1048576"),
        ],
    )
    .await;
    t.wait_until("300 events written", Duration::from_secs(60), async |t| {
        t.json("/api/status").await["ingest"]["written"].as_u64() >= Some(300)
    })
    .await;

    // How many events in each language?
    let a = answer(
        &t,
        "events",
        json!([{"$group": {"_id": "$lang", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]),
    )
    .await;
    assert_eq!(
        a["docs"],
        json!([{"_id": "en", "n": 100}, {"_id": "ja", "n": 100}, {"_id": "🌍", "n": 100}])
    );
    assert_eq!(a["read"], 300);
    assert_eq!(
        a["stages"][0],
        json!({"stage": "$group", "ran": "tailrace", "out": 3})
    );

    // A sort by several keys sorts by them in the order the request's text gives them.
    let (status, a) = post_text(
        &t,
        r#"{"collection": "events", "pipeline": [{"$group": {"_id": "$user.id", "n": {"$sum": 1}}}, {"$sort": {"n": 1, "_id": 1}}, {"$limit": 2}]}"#,
    )
    .await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["docs"], json!([{"_id": 6, "n": 42}, {"_id": 0, "n": 43}]));

    // The top hashtags of the window, in Japanese only.
    let a = answer(
        &t,
        "events",
        json!([{"$match": {"lang": "ja"}}, {"$unwind": "$hashtags"}, {"$sortByCount": "$hashtags"}, {"$limit": 2}]),
    )
    .await;
    assert_eq!(
        a["docs"],
        json!([{"_id": "Ünïcode", "count": 100}, {"_id": "rust", "count": 50}])
    );

    // Events per minute of receipt: every event lands in some minute, and the counts add up.
    let a = answer(
        &t,
        "events",
        json!([{"$group": {
            "_id": {"$dateTrunc": {"date": "$_tailrace.received", "unit": "minute"}},
            "n": {"$sum": 1}}}]),
    )
    .await;
    let total: u64 = a["docs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["n"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 300, "{a}");
    // Added up from the engine's counts of events received each second, not read.
    assert_eq!(a["stages"][0]["ran"], "timeline", "{a}");
    assert!(a["read"].as_u64() < Some(300), "{a}");
    assert!(
        a["docs"][0]["_id"]["$date"]
            .as_str()
            .unwrap()
            .ends_with(":00.000Z"),
        "{a}"
    );

    // A range of received times: all of them, and one in the future that reads nothing.
    let range = |from: &str, to: &str| {
        json!([{"$match": {"_tailrace.received": {"$gte": {"$date": from}, "$lt": {"$date": to}}}},
               {"$count": "n"}])
    };
    let a = answer(
        &t,
        "events",
        range("2000-01-01T00:00:00Z", "2999-01-01T00:00:00Z"),
    )
    .await;
    assert_eq!(a["docs"], json!([{"n": 300}]), "{a}");
    let a = answer(
        &t,
        "events",
        range("2999-01-01T00:00:00Z", "2999-01-02T00:00:00Z"),
    )
    .await;
    assert_eq!((&a["docs"], &a["read"]), (&json!([]), &json!(0)), "{a}");

    // Distinct users, and the per-source summary in the rollups.
    let a = answer(
        &t,
        "events",
        json!([{"$group": {"_id": "$user.id"}}, {"$count": "users"}]),
    )
    .await;
    assert_eq!(a["docs"], json!([{"users": 7}]));
    let a = answer(
        &t,
        "rollups",
        json!([{"$match": {"_id": "source:f"}}, {"$project": {"_id": 1}}]),
    )
    .await;
    assert_eq!(a["docs"], json!([{"_id": "source:f"}]));

    // Refused with a 400 that names the problem; the process stays up.
    for (body, says) in [
        (
            json!({"collection": "events", "pipeline": [{"$lookup": {}}]}),
            "pipeline[0].$lookup: stage $lookup is not supported",
        ),
        (
            json!({"collection": "nope", "pipeline": []}),
            "collection: \"nope\" is not one of",
        ),
        (json!({"collection": "events"}), "missing field `pipeline`"),
        // A sort of the whole window holds every document: past the 1 MiB configured.
        (
            json!({"collection": "events", "pipeline": [{"$sort": {"id": -1}}]}),
            "pipeline[0].$sort: holds more than the query bound of 1048576 bytes",
        ),
    ] {
        let (status, body) = post(&t, &body).await;
        let text = body.to_string();
        let short = &text[..text.floor_char_boundary(400)];
        assert_eq!(status, 400, "{short}");
        assert!(
            body["error"].as_str().unwrap_or_default().contains(says),
            "{short}"
        );
    }
    // 100,000 levels of nesting, written as text (a JSON value that deep would overflow
    // this test's own stack when dropped).
    let depth = 100_000;
    let deep = format!(
        r#"{{"collection": "events", "pipeline": [{{"$group": {{"_id": {}"$id"{}}}}}]}}"#,
        r#"{"$toDate": "#.repeat(depth),
        "}".repeat(depth)
    );
    let client = ingest::source::http::client().build().unwrap();
    let resp = client
        .post(format!("http://{}/api/aggregate", t.addr))
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert_eq!(t.get("/healthz").await.0, 200);

    // The same question from a terminal: a table, or NDJSON for a program.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tailrace"))
            .arg("query")
            .args(args)
            .args(["--url", &format!("http://{}", t.addr)])
            .env_remove("TAILRACE_CONFIG")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let by_lang = r#"[{"$sortByCount": "$lang"}]"#;
    let (ok, table, how) = cli(&[by_lang]);
    assert!(ok, "{how}");
    assert_eq!(table, "_id  count\nen   100\nja   100\n🌍   100\n");
    assert!(how.contains("3 rows · read 300 from events"), "{how}");
    let (ok, ndjson, _) = cli(&[by_lang, "--format", "ndjson"]);
    assert!(ok);
    assert_eq!(ndjson.lines().next(), Some(r#"{"_id":"en","count":100}"#));
    let (ok, _, why) = cli(&[r#"[{"$out": "x"}]"#]);
    assert!(!ok);
    assert!(why.contains("stage $out is not supported"), "{why}");

    events_pages(&t).await;
}

/// `GET /api/events`: pages of stored events, newest or oldest first, filtered and in a time
/// range, each full page linking to the next.
async fn events_pages(t: &Tailrace) {
    let client = ingest::source::http::client().build().unwrap();
    // Follows the `Link: rel=next` headers from `path`: every event's `id`, page by page.
    let walk = async |path: String| {
        let (mut ids, mut next, mut pages) = (Vec::new(), Some(path), 0);
        while let Some(path) = next.take() {
            let resp = client
                .get(format!("http://{}{path}", t.addr))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 200, "{path}");
            assert!(resp.headers().contains_key("x-tailrace-read"));
            next = resp
                .headers()
                .get("link")
                .and_then(|l| l.to_str().ok())
                .and_then(|l| Some(l.strip_prefix('<')?.split_once('>')?.0.to_owned()));
            let page: Vec<Value> = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
            ids.extend(page.iter().map(|e| e["doc"]["id"].as_u64().unwrap()));
            pages += 1;
            assert!(pages < 20, "the links end");
        }
        ids
    };
    // Newest first, the Japanese ones (every third), 40 a page.
    let ja = walk("/api/events?filter=%7B%22lang%22%3A%22ja%22%7D&limit=40".into()).await;
    let want: Vec<u64> = (0..300).rev().filter(|i| i % 3 == 0).collect();
    assert_eq!(ja, want);
    // Oldest first, all of them, in a range that holds them all.
    let all = walk(
        "/api/events?order=oldest&limit=128&from=2000-01-01T00:00:00Z&to=2999-01-01T00:00:00Z"
            .into(),
    )
    .await;
    assert_eq!(all, (0..300).collect::<Vec<_>>());
    // A range in the future holds none.
    assert_eq!(
        walk("/api/events?from=2999-01-01T00:00:00Z".into()).await,
        Vec::<u64>::new()
    );
    for (path, says) in [
        ("/api/events?limit=0", "limit: 0 is not within"),
        ("/api/events?order=up", "is not newest or oldest"),
        ("/api/events?from=yesterday", "is not an RFC 3339 time"),
        ("/api/events?filter=%7B", "filter: not JSON"),
        (
            "/api/events?filter=%7B%22a%22%3A%7B%22%24regex%22%3A1%7D%7D",
            "unknown operator $regex",
        ),
        ("/api/events?sort=x", "unknown field `sort`"),
    ] {
        let (status, body) = t.get(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
}
