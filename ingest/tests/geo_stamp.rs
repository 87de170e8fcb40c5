//! Where events come from, through the ingester into the embedded store: each stored event's
//! `_tailrace.geo`, and the counts of `tailrace_events_geo_total` and
//! `tailrace_events_geo_country_total` (read from the process's recorder, which only this
//! test binary's one test counts into).

#![allow(clippy::unwrap_used)]

#[allow(dead_code, unused_imports)]
mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ingest::geo::GeoConfig;
use ingest::ingester::{Handed, IngestOptions, IngestStats, Ingester};
use ingest::source::http::HttpConfig;
use ingest::source::{Raw, SourceKind};
use ingest::telemetry::{EVENTS_GEO, EVENTS_GEO_COUNTRY};
use serde_json::{Value, json};
use store::embedded::{EmbeddedOptions, EmbeddedStore};
use store::{CappedSpec, Durability, STAMP_FIELD, Stamp, Start, Store};
use tokio::sync::mpsc;

use common::{Metrics, T, recorder};

#[tokio::test]
async fn events_are_stamped_with_their_place_and_counted() {
    let recorder = recorder();
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let spec = CappedSpec {
        max_docs: 1000,
        max_bytes: 1 << 24,
        indexes: vec!["_tailrace.source".into(), "source".into()],
    };
    let events = store.capped("events", &spec).await.unwrap();
    let twitter = GeoConfig {
        point: Some("coordinates".into()),
        place: Some("place.bounding_box".into()),
        country: Some("place.country_code".into()),
        language: Some("lang".into()),
    };
    let wikimedia = GeoConfig::preset(&SourceKind::Http(HttpConfig::new(
        "https://stream.wikimedia.org/v2/stream/recentchange",
    )))
    .unwrap();
    let ingester = Ingester {
        events: events.clone(),
        dead_letters: store.capped("dead_letters", &spec).await.unwrap(),
        rollups: store.keyed("rollups").await.unwrap(),
        options: IngestOptions {
            batch_max_events: 4,
            batch_max_wait: Duration::from_millis(1),
            max_event_bytes: 1 << 20,
            rollup_fields: vec![],
            summary_fields: vec![],
            durability: Durability::Acknowledged,
            geo: [
                ("tweets".to_owned(), twitter),
                ("wiki".to_owned(), wikimedia),
            ]
            .into_iter()
            .collect(),
        },
        engine: "embedded",
        stats: Arc::new(IngestStats::default()),
        health: Default::default(),
        observer: None,
    };
    let huge = "x".repeat(100_000);
    let point = |lon: i64, lat: i64| json!({"type": "Point", "coordinates": [lon, lat]});
    let bbox = json!({"type": "Polygon", "coordinates": [[[2.0, 48.0], [3.0, 48.0], [3.0, 49.0], [2.0, 49.0]]]});
    // (source, event, the geo expected in its stamp; `[code, precision]`: that country's
    // point)
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "tweets",
            json!({"n": 1, "coordinates": point(139, 35), "place": {"country_code": "JP"}, "lang": "en"}),
            json!({"lon": 139.0, "lat": 35.0, "precision": "point", "country": "JP"}),
        ),
        (
            "tweets",
            json!({"n": 2, "place": {"bounding_box": bbox, "country_code": "FR"}}),
            json!({"lon": 2.5, "lat": 48.5, "precision": "place", "country": "FR"}),
        ),
        (
            "tweets",
            json!({"n": 3, "place": {"country_code": "BR"}, "coordinates": null}),
            json!(["BR", "country"]),
        ),
        (
            "tweets",
            json!({"n": 4, "lang": "ko"}),
            json!(["KR", "language"]),
        ),
        ("tweets", json!({"n": 5, "text": "nowhere"}), Value::Null),
        (
            "tweets",
            json!({"n": 6, "place": {"country_code": format!("ZZ-{huge}"), "bounding_box": [[1]]}, "lang": huge, "coordinates": "NaN"}),
            Value::Null,
        ),
        (
            "tweets",
            json!({"n": 7, "_id": 7, "_tailrace": {"geo": "theirs"}, "coordinates": point(-3, 40)}),
            json!({"lon": -3.0, "lat": 40.0, "precision": "point", "country": null}),
        ),
        (
            "wiki",
            json!({"n": 8, "$schema": "/mediawiki/recentchange/1.0.0", "meta": {"domain": "ja.wikipedia.org"}}),
            json!(["JP", "language"]),
        ),
        (
            "wiki",
            json!({"n": 9, "meta": {"domain": "commons.wikimedia.org"}}),
            Value::Null,
        ),
        (
            "other",
            json!({"n": 10, "coordinates": point(1, 1)}),
            Value::Null,
        ),
    ];
    let (tx, rx) = mpsc::channel::<Handed>(64);
    let task = tokio::spawn(ingester.run(rx));
    for (i, (source, event, _)) in cases.iter().enumerate() {
        let h = |raw| Handed {
            source: Arc::from(*source),
            raw,
            received_us: 1_700_000_000_000_000 + 2 * i as i64,
            position: None,
        };
        tx.send(h(Raw::Json(event.clone()))).await.unwrap();
        if i == 4 {
            // Not an event: a dead letter, not stamped, not counted as placed or not.
            tx.send(h(Raw::Json(json!([1, 2])))).await.unwrap();
        }
    }
    drop(tx);
    tokio::time::timeout(T, task).await.unwrap().unwrap();

    let mut tail = events.tail(Start::Oldest);
    let mut stored = Vec::new();
    while stored.len() < cases.len() {
        let r = tokio::time::timeout(T, tail.next())
            .await
            .unwrap_or_else(|_| panic!("only {} events stored", stored.len()))
            .unwrap()
            .unwrap();
        stored.push(Value::Object(Arc::unwrap_or_clone(r.doc)));
    }
    stored.sort_by_key(|e| e["n"].as_u64());
    for ((source, _, expected), event) in cases.iter().zip(&stored) {
        let n = &event["n"];
        let geo = event[STAMP_FIELD]
            .get("geo")
            .cloned()
            .unwrap_or(Value::Null);
        match expected {
            Value::Array(said) => {
                let code = said[0].as_str().unwrap();
                let c = ingest::geo::country(code).unwrap();
                assert_eq!(
                    geo,
                    json!({"lon": c.lon, "lat": c.lat, "precision": said[1], "country": code}),
                    "event {n} of {source}"
                );
            }
            _ => assert_eq!(&geo, expected, "event {n} of {source}"),
        }
        if !geo.is_null() {
            assert!(
                geo["lon"].is_f64() && geo["lat"].is_f64(),
                "event {n}: numbers stored as doubles: {geo}"
            );
            assert!(
                geo.as_object().unwrap().keys().all(|k| !k.starts_with('$')),
                "{geo}"
            );
        }
        let stamp = Stamp::of(event.as_object().unwrap()).unwrap();
        assert_eq!(stamp.source, *source, "event {n}: the stamp still reads");
    }
    assert_eq!(
        stored[6][STAMP_FIELD]["original"],
        json!({"_id": 7, "_tailrace": {"geo": "theirs"}}),
        "an event's own `_tailrace` is kept, apart from the stamp's geo"
    );

    let m = Metrics::parse(&recorder.render());
    let by = |name: &str, label: &str, value: &str| m.one(name, &[(label, value)]);
    for (precision, count) in [
        ("point", 2.0),
        ("place", 1.0),
        ("country", 1.0),
        ("language", 2.0),
        ("none", 4.0),
    ] {
        assert_eq!(
            by(EVENTS_GEO, "precision", precision),
            Some(count),
            "{EVENTS_GEO}{{precision={precision:?}}}"
        );
    }
    for (country, count) in [
        ("JP", 2.0),
        ("FR", 1.0),
        ("BR", 1.0),
        ("KR", 1.0),
        ("none", 5.0),
    ] {
        assert_eq!(
            by(EVENTS_GEO_COUNTRY, "country", country),
            Some(count),
            "{EVENTS_GEO_COUNTRY}{{country={country:?}}}"
        );
    }
    let labels: Vec<&String> = m
        .samples
        .iter()
        .filter(|(name, _, _)| name == EVENTS_GEO_COUNTRY)
        .filter_map(|(_, labels, _)| labels.get("country"))
        .collect();
    assert_eq!(
        labels.len(),
        5,
        "one series per country seen, and none: {labels:?}"
    );
    assert_eq!(
        m.sum(EVENTS_GEO_COUNTRY, &[]),
        cases.len() as f64,
        "every stamped event counted once by country"
    );
}
