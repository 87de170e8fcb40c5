//! Unit tests of `geo.rs`: each rule, their order, the presets, and what malformed input does.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::source::http::HttpConfig;
use crate::source::synthetic::SyntheticConfig;
use crate::source::websocket::WebSocketConfig;

fn doc(v: Value) -> Document {
    match v {
        Value::Object(o) => o,
        other => panic!("not an object: {other}"),
    }
}

/// Twitter's four paths.
fn twitter() -> GeoConfig {
    GeoConfig {
        point: Some("coordinates".into()),
        place: Some("place.bounding_box".into()),
        country: Some("place.country_code".into()),
        language: Some("lang".into()),
    }
}

fn bbox(west: f64, south: f64, east: f64, north: f64) -> Value {
    json!({"type": "Polygon", "coordinates": [[
        [west, south], [east, south], [east, north], [west, north]
    ]]})
}

#[track_caller]
fn assert_near(got: (f64, f64), want: (f64, f64), what: &str) {
    assert!(
        (got.0 - want.0).abs() < 1e-9 && (got.1 - want.1).abs() < 1e-9,
        "{what}: expected (lon, lat) {want:?}, got {got:?}"
    );
}

fn placed(rules: &GeoConfig, event: Value) -> Option<Geo> {
    rules.locate(&doc(event))
}

/// What each rule makes of an event that has only its field.
#[test]
fn each_rule_places_an_event_of_its_own() {
    let rules = twitter();
    let g = placed(
        &rules,
        json!({"coordinates": {"type": "Point", "coordinates": [139.69, 35.68]}}),
    )
    .unwrap();
    assert_eq!((g.precision, g.country), (Precision::Point, None));
    assert_near((g.lon, g.lat), (139.69, 35.68), "a point is itself");

    let g = placed(
        &rules,
        json!({"place": {"bounding_box": bbox(2.22, 48.81, 2.47, 48.90)}}),
    )
    .unwrap();
    assert_eq!((g.precision, g.country), (Precision::Place, None));
    assert_near((g.lon, g.lat), (2.345, 48.855), "a box's centroid");

    let jp = country("JP").unwrap();
    let g = placed(&rules, json!({"place": {"country_code": "JP"}})).unwrap();
    assert_eq!((g.precision, g.country), (Precision::Country, Some("JP")));
    assert_near((g.lon, g.lat), (jp.lon, jp.lat), "Japan's point");
    assert!(
        (129.0..146.0).contains(&g.lon) && (30.0..46.0).contains(&g.lat),
        "Japan's point lies in Japan: {g:?}"
    );

    for (lang, want) in [
        ("ja", "JP"),
        ("pt-BR", "BR"),
        ("pt", "BR"),
        ("en", "US"),
        ("en-GB", "GB"),
        ("zh-Hant", "TW"),
        ("in", "ID"),
        ("tl", "PH"),
        ("la", "VA"),
        ("be-tarask", "BY"),
    ] {
        let g = placed(&rules, json!({"lang": lang})).unwrap_or_else(|| panic!("{lang}"));
        assert_eq!(
            (g.precision, g.country),
            (Precision::Language, Some(want)),
            "{lang}"
        );
        let c = country(want).unwrap();
        assert_near((g.lon, g.lat), (c.lon, c.lat), lang);
    }
    for lang in [
        "und", "eo", "es-419", "zxx", "mul", "qaa", "NaN", "EN", "Ja-JP",
    ] {
        assert_eq!(
            placed(&rules, json!({"lang": lang})),
            None,
            "{lang}: no country (undetermined, a macro-region, no data, or not lower case)"
        );
    }
    assert_eq!(placed(&rules, json!({"text": "hello"})), None, "no field");
    assert_eq!(
        placed(&GeoConfig::default(), json!({"lang": "ja"})),
        None,
        "no rules"
    );
}

/// The first rule that finds a place wins; one that finds none (absent or malformed) passes
/// to the next.
#[test]
fn the_first_rule_that_finds_a_place_wins() {
    let rules = twitter();
    let point = json!({"type": "Point", "coordinates": [-0.12, 51.5]});
    let full = json!({
        "coordinates": point,
        "place": {"bounding_box": bbox(-0.5, 51.3, 0.3, 51.7), "country_code": "GB"},
        "lang": "ja",
    });
    let g = placed(&rules, full.clone()).unwrap();
    assert_eq!((g.precision, g.country), (Precision::Point, Some("GB")));
    assert_near(
        (g.lon, g.lat),
        (-0.12, 51.5),
        "the point, with the place's country",
    );

    let mut no_point = full.clone();
    no_point["coordinates"] = json!({"type": "Point", "coordinates": [200.0, 51.5]});
    let g = placed(&rules, no_point.clone()).unwrap();
    assert_eq!((g.precision, g.country), (Precision::Place, Some("GB")));
    assert_near((g.lon, g.lat), (-0.1, 51.5), "the box's centre");

    let mut no_box = no_point.clone();
    no_box["place"]["bounding_box"] = json!({"type": "Polygon", "coordinates": [[]]});
    let g = placed(&rules, no_box.clone()).unwrap();
    assert_eq!((g.precision, g.country), (Precision::Country, Some("GB")));

    let mut no_country = no_box.clone();
    no_country["place"]["country_code"] = json!("ZZ");
    let g = placed(&rules, no_country.clone()).unwrap();
    assert_eq!((g.precision, g.country), (Precision::Language, Some("JP")));

    let mut nothing = no_country;
    nothing["lang"] = json!("und");
    assert_eq!(placed(&rules, nothing), None);

    // A point with a country of no known code keeps its point, without a country.
    let mut odd_country = full;
    odd_country["place"]["country_code"] = json!("XK");
    let g = placed(&rules, odd_country).unwrap();
    assert_eq!((g.precision, g.country), (Precision::Point, None));
}

/// A box wider than half the globe crosses the antimeridian: its centre is on that side.
#[test]
fn a_box_across_the_antimeridian_is_centred_there() {
    let rules = twitter();
    let centre = |b: Value| {
        let g = placed(&rules, json!({"place": {"bounding_box": b}})).unwrap();
        (g.lon, g.lat)
    };
    // Fiji's islands: 177°E to 178°W.
    assert_near(
        centre(bbox(177.0, -19.0, -178.0, -16.0)),
        (179.5, -17.5),
        "Fiji",
    );
    assert_near(
        centre(bbox(170.0, 0.0, -160.0, 2.0)),
        (-175.0, 1.0),
        "past it",
    );
    assert_near(centre(bbox(-10.0, 0.0, 10.0, 2.0)), (0.0, 1.0), "Greenwich");
    // A degenerate box (a venue) is its point; an unclosed ring still has an extent.
    assert_near(
        centre(bbox(5.0, 6.0, 5.0, 6.0)),
        (5.0, 6.0),
        "a point-sized box",
    );
}

/// Wikimedia's recent changes place an edit by its wiki's language; Jetstream, Mastodon and
/// the synthetic stream by their fields; other sources have no preset.
#[test]
fn presets_place_the_known_streams() {
    let http = |url: &str| SourceKind::Http(HttpConfig::new(url));
    let wikimedia = GeoConfig::preset(&http("https://stream.wikimedia.org/v2/stream/recentchange"))
        .expect("a preset for Wikimedia");
    let edit = |domain: &str| json!({"meta": {"domain": domain}, "wiki": "x"});
    let g = placed(&wikimedia, edit("ja.wikipedia.org")).unwrap();
    assert_eq!((g.precision, g.country), (Precision::Language, Some("JP")));
    for (domain, want) in [
        ("de.wikipedia.org", Some("DE")),
        ("pt.wiktionary.org", Some("BR")),
        ("JA.wikipedia.org", None),
        ("be-tarask.wikipedia.org", Some("BY")),
        ("commons.wikimedia.org", None),
        ("www.wikidata.org", None),
        ("WWW.mediawiki.org", None),
        ("meta.wikimedia.org", None),
        ("simple.wikipedia.org", None),
        ("test2.wikipedia.org", None),
        ("zh-min-nan.wikipedia.org", None),
        ("wikisource.org", None),
        ("", None),
    ] {
        assert_eq!(
            placed(&wikimedia, edit(domain)).and_then(|g| g.country),
            want,
            "{domain:?}"
        );
    }

    let ws = |url: &str| SourceKind::Websocket(WebSocketConfig::new(url));
    let jetstream = GeoConfig::preset(&ws(
        "wss://jetstream2.us-east.bsky.network/subscribe?wantedCollections=app.bsky.feed.post",
    ))
    .expect("a preset for Jetstream");
    let post = json!({"commit": {"record": {"langs": ["pt-BR", "en"]}}});
    let g = placed(&jetstream, post).unwrap();
    assert_eq!(g.country, Some("BR"), "the first of langs");
    assert_eq!(
        placed(&jetstream, json!({"commit": {"record": {"langs": []}}})),
        None
    );
    assert_eq!(GeoConfig::preset(&ws("wss://example.com/subscribe")), None);
    assert_eq!(
        GeoConfig::preset(&ws(
            "ws://127.0.0.1:9/subscribe?wantedCollections=app.bsky.feed.post"
        )),
        Some(jetstream.clone()),
        "a replay of Jetstream on another host"
    );

    let mastodon = GeoConfig::preset(&http(
        "https://streaming.mastodon.social/api/v1/streaming/public",
    ))
    .expect("a preset for Mastodon");
    assert_eq!(
        placed(&mastodon, json!({"language": "de"})).and_then(|g| g.country),
        Some("DE")
    );
    assert_eq!(placed(&mastodon, json!({"language": null})), None);
    assert_eq!(GeoConfig::preset(&http("https://example.com/events")), None);
    assert_eq!(
        GeoConfig::preset(&http("http://127.0.0.1:9/v2/stream/recentchange")),
        Some(wikimedia.clone()),
        "a replay of EventStreams on another host"
    );

    let synthetic = GeoConfig::preset(&SourceKind::Synthetic(SyntheticConfig::at(70.0)))
        .expect("a preset for the synthetic stream");
    let mut generator = crate::source::realistic::Realistic::new(7, Default::default());
    let (mut points, mut languages) = (0, 0);
    for _ in 0..2000 {
        let event = generator.event("2024-05-01T12:00:00.000Z");
        match placed(&synthetic, event.clone()).map(|g| g.precision) {
            Some(Precision::Point) => points += 1,
            Some(Precision::Language) => languages += 1,
            other => assert!(
                event["lang"] == "und",
                "only `und` events go unplaced: {other:?} for {event}"
            ),
        }
    }
    assert!(
        points > 20 && languages > 1000,
        "the realistic stream's points and languages: {points} points, {languages} languages"
    );
}

/// Nasty values at every path: nothing panics, no rule takes them, and the event is
/// unplaced.
#[test]
fn malformed_places_place_nothing() {
    let huge = "x".repeat(100_000);
    let mut nested = json!([1.0, 2.0]);
    for _ in 0..50 {
        nested = json!([nested]);
    }
    let nasty = [
        json!(null),
        json!(true),
        json!(0),
        json!(-1.5e300),
        json!(huge),
        json!(format!("ZZ-{huge}")),
        json!(format!("ja.{huge}")),
        json!("🇯🇵"),
        json!("日本"),
        json!("NaN"),
        json!("Infinity"),
        json!("-inf"),
        json!(""),
        json!("."),
        json!("www."),
        json!("ZZ"),
        json!("XK"),
        json!("001"),
        json!("U"),
        json!("USA"),
        json!(" US"),
        json!([]),
        json!([[]]),
        nested,
        json!({}),
        json!({"$numberDouble": "NaN"}),
        json!({"$type": "Point", "coordinates": [1.0, 2.0]}),
        json!({"type": "Point"}),
        json!({"type": "Point", "coordinates": "1,2"}),
        json!({"type": "Point", "coordinates": ["1", "2"]}),
        json!({"type": "Point", "coordinates": ["NaN", 0]}),
        json!({"type": "Point", "coordinates": [1.0]}),
        json!({"type": "Point", "coordinates": [1.0, 2.0, 3.0, 4.0]}),
        json!({"type": "Point", "coordinates": [180.5, 0.0]}),
        json!({"type": "Point", "coordinates": [0.0, -90.5]}),
        json!({"type": "Point", "coordinates": {"lon": 1, "lat": 2}}),
        json!({"type": "point", "coordinates": [1.0, 2.0]}),
        json!({"type": "Polygon", "coordinates": []}),
        json!({"type": "Polygon", "coordinates": [[]]}),
        json!({"type": "Polygon", "coordinates": [[[1.0, 2.0], "x"]]}),
        json!({"type": "Polygon", "coordinates": [[[1.0, 2.0], [500.0, 2.0]]]}),
        json!({"type": "Polygon", "coordinates": [[1.0, 2.0]]}),
        json!({"type": "Polygon", "coordinates": {"0": [[1.0, 2.0]]}}),
        json!({"type": ["Point"], "coordinates": [1.0, 2.0]}),
    ];
    let rules = twitter();
    for v in &nasty {
        let event = json!({
            "coordinates": v,
            "place": {"bounding_box": v, "country_code": v},
            "lang": v,
        });
        assert_eq!(placed(&rules, event), None, "{}", short(v));
        // Where an object was expected, the value itself.
        let event = json!({"place": v});
        assert_eq!(placed(&rules, event), None, "place = {}", short(v));
    }
}

fn short(v: &Value) -> String {
    let text = v.to_string();
    text.chars().take(80).collect()
}

/// The stamped value has four fixed keys (none with `$`), numbers as `f64` even where the
/// event had integers, and a country that is a known code or null.
#[test]
fn the_stamp_is_bounded_and_fit_for_mongodb() {
    let rules = twitter();
    let g = placed(
        &rules,
        json!({"coordinates": {"type": "Point", "coordinates": [139, 35]}, "place": {"country_code": "jp"}}),
    )
    .unwrap();
    let v = g.to_value();
    let o = v.as_object().unwrap();
    assert_eq!(
        o.keys().map(String::as_str).collect::<Vec<_>>(),
        ["country", "lat", "lon", "precision"]
    );
    assert!(
        v["lon"].is_f64() && v["lat"].is_f64(),
        "numbers as f64 (a MongoDB double): {v}"
    );
    assert_eq!(
        v,
        json!({"lon": 139.0, "lat": 35.0, "precision": "point", "country": "JP"})
    );
    let g = placed(
        &rules,
        json!({"coordinates": {"type": "Point", "coordinates": [1, 2]}}),
    )
    .unwrap();
    assert_eq!(g.to_value()["country"], Value::Null);
}

/// The countries are the ISO 3166-1 alpha-2 codes, each with a point in range.
#[test]
fn countries_are_the_iso_codes_with_points() {
    let all = countries();
    assert!(
        (240..=260).contains(&all.len()),
        "ISO 3166-1 has 249 codes: {}",
        all.len()
    );
    for c in all {
        assert!(
            c.code.len() == 2 && c.code.bytes().all(|b| b.is_ascii_uppercase()),
            "{c:?}"
        );
        assert!(
            (-180.0..=180.0).contains(&c.lon) && (-90.0..=90.0).contains(&c.lat),
            "{c:?}"
        );
        assert!(
            c.numeric.len() == 3 && c.numeric.bytes().all(|b| b.is_ascii_digit()),
            "{c:?}"
        );
        assert_eq!(country(&c.code.to_ascii_lowercase()), Some(c), "{c:?}");
    }
    for code in ["ZZ", "XK", "EU", "UK", "001", "", "J", "JPN", "Jp\u{0}"] {
        assert_eq!(country(code), None, "{code:?}");
    }
}

/// Known numeric codes, as ISO 3166-1 gives them (and world-atlas' ids spell them).
#[test]
fn countries_carry_their_numeric_codes() {
    for (code, numeric) in [("JP", "392"), ("AF", "004"), ("US", "840"), ("FJ", "242")] {
        assert_eq!(country(code).map(|c| c.numeric), Some(numeric), "{code}");
    }
    let mut numerics: Vec<_> = countries().iter().map(|c| c.numeric).collect();
    numerics.sort_unstable();
    numerics.dedup();
    assert_eq!(
        numerics.len(),
        countries().len(),
        "one numeric code per country"
    );
}

/// The tally counts as the metrics do (`none` for no place, `none` for no country), and a
/// batch merged moves each source's sequence number forward only.
#[test]
fn a_tally_counts_batches_and_keeps_the_newest_sequence_numbers() {
    let rules = twitter();
    let mut batch = GeoTally::default();
    for event in [
        json!({"coordinates": {"type": "Point", "coordinates": [139.7, 35.7]}}),
        json!({"coordinates": {"type": "Point", "coordinates": [0.0, 0.0]}, "place": {"country_code": "jp"}}),
        json!({"place": {"country_code": "JP"}}),
        json!({"lang": "fr"}),
        json!({"text": "nowhere"}),
    ] {
        batch.add(placed(&rules, event).as_ref());
    }
    let mut total = GeoTally::default();
    total.merge(&batch, [("a", 4), ("b", 9)]);
    total.merge(&batch, [("a", 2)]);
    assert_eq!(
        total.to_value(),
        json!({
            "precision": {"point": 4, "place": 0, "country": 2, "language": 2, "none": 2},
            "country": {"FR": 2, "JP": 4, "none": 4},
            "seq": {"a": 4, "b": 9},
        })
    );
}

proptest! {
    /// Whatever strings and numbers an event holds where places are read, locating never
    /// panics and yields only bounded values: a known country, a position in range.
    #[test]
    fn any_value_yields_a_bounded_place_or_none(
        text in ".{0,80}",
        lon in proptest::num::f64::ANY,
        lat in proptest::num::f64::ANY,
        as_point in any::<bool>(),
    ) {
        let coordinates = |a: f64, b: f64| {
            json!([serde_json::Number::from_f64(a), serde_json::Number::from_f64(b)])
        };
        let event = json!({
            "coordinates": {"type": "Point", "coordinates": coordinates(lon, lat)},
            "place": {
                "bounding_box": {"type": "Polygon", "coordinates": [[coordinates(lon, lat), coordinates(lat, lon)]]},
                "country_code": text,
            },
            "lang": if as_point { json!(text) } else { json!([text]) },
        });
        if let Some(g) = placed(&twitter(), event) {
            prop_assert!((-180.0..=180.0).contains(&g.lon) && (-90.0..=90.0).contains(&g.lat), "{:?}", g);
            prop_assert!(g.precision != Precision::None);
            if let Some(c) = g.country {
                prop_assert!(country(c).is_some(), "{:?}", g);
            }
        }
    }
}
