//! Where an event comes from: the place the ingester stamps under `_tailrace.geo`
//! ([`store::GEO_PATH`]), `{lon, lat, precision, country}`, from the first rule of a source's
//! [`GeoConfig`] that finds one:
//!
//! 1. **point**: a GeoJSON point (`{"type": "Point", "coordinates": [lon, lat]}`) →
//!    precision `point`;
//! 2. **place**: a GeoJSON polygon, such as a place's bounding box (Twitter's
//!    `place.bounding_box`) → the centre of its outer ring's extent (a box's centroid, across
//!    the antimeridian too), precision `place`;
//! 3. **country**: an ISO 3166-1 alpha-2 code (`place.country_code`) → the country's
//!    representative point, precision `country`;
//! 4. **language**: a BCP 47 tag (`ja`, `pt-BR`), a list of them (the first counts), or a host
//!    name whose first label is one (Wikimedia's `ja.wikipedia.org`; not `www`) → the tag's
//!    likely region from CLDR's likely subtags, as country, and that country's point;
//!    precision `language`. The language subtag must be in lower case, as streams write it
//!    (`NaN` is not Min Nan).
//!
//! The first two take their `country` from the **country** field when it holds a known code
//! (else null). A rule whose field is absent or malformed (a wrong type, a number out of range, a
//! string no code or tag reads) does not apply, and the next is tried; an event no rule places
//! gets no `geo` and counts as `none`. None of this can fail or reject an event: a missing or
//! odd place is not a bad event. Every value stamped or used as a metric label is bounded: a
//! country is one of the ISO 3166-1 alpha-2 codes, a precision one of five words, numbers are
//! finite `f64`s in range.
//!
//! Where the data comes from (docs/ARCHITECTURE.md, "Dependencies, and why"): the likely
//! subtags are `icu_locale`'s compiled CLDR data (the extended set, which knows Twitter's `in`
//! and `tl` and Wikipedia's `la` and `sco`); the country codes and their points are `keshvar`'s
//! (the `countries` data set). No table of either is written here.
//!
//! Presets ([`GeoConfig::preset`]) fill in the rules of the public streams tailrace knows when a
//! source sets no `geo`: the synthetic stream, Wikimedia's recent changes, Bluesky's
//! Jetstream, Mastodon's streaming API.

use std::collections::HashMap;
use std::sync::LazyLock;

use icu_locale::{Locale, LocaleExpander};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use store::Document;
use store::update::get_path;

use crate::config::problems::Problems;
use crate::source::SourceKind;

/// A language tag longer than this is not read (BCP 47 tags in the wild are a few bytes; a
/// host name's first label is shorter still): a 100 KB string costs a length check.
pub const MAX_TAG_BYTES: usize = 64;

/// Where to find an event's place: dotted paths into the event, each optional (the `geo` key
/// of a `[[sources]]` table). The rules are tried in the order of the fields (module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeoConfig {
    /// A GeoJSON point: `{"type": "Point", "coordinates": [lon, lat]}` (Twitter's
    /// `coordinates`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point: Option<String>,
    /// A GeoJSON polygon whose centre places the event (Twitter's `place.bounding_box`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<String>,
    /// An ISO 3166-1 alpha-2 country code (Twitter's `place.country_code`): the country of
    /// the two rules above, and a place of its own when they find none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    /// A language tag, a list of them (the first counts) or a host name whose first label is
    /// one: the last resort, its likely region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// How precisely an event was placed: the rule that placed it, or `none`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// A point of its own.
    Point,
    /// The centre of its place's polygon.
    Place,
    /// Its country's representative point.
    Country,
    /// The likely country of its language.
    Language,
    /// No rule placed it.
    None,
}

impl Precision {
    /// Every precision, for registering the counters at zero.
    pub const ALL: [Precision; 5] = [
        Precision::Point,
        Precision::Place,
        Precision::Country,
        Precision::Language,
        Precision::None,
    ];

    /// The stamped value and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Point => "point",
            Precision::Place => "place",
            Precision::Country => "country",
            Precision::Language => "language",
            Precision::None => "none",
        }
    }
}

/// A country tailrace knows: its ISO 3166-1 alpha-2 code and representative point.
#[derive(Debug, PartialEq)]
pub struct Country {
    /// The code, upper case (`JP`).
    pub code: String,
    /// Its ISO 3166-1 numeric code, three digits (`392`): the ids of the live page's map
    /// outlines (world-atlas), which the page reads through a table checked against this.
    pub numeric: &'static str,
    /// Longitude of its representative point, degrees east.
    pub lon: f64,
    /// Latitude, degrees north.
    pub lat: f64,
}

/// Every ISO 3166-1 alpha-2 country, sorted by code, built once from `keshvar`.
static COUNTRIES: LazyLock<Vec<Country>> = LazyLock::new(|| {
    let mut all: Vec<Country> = keshvar::SUPPORTED_ALPHA2_LIST
        .iter()
        .map(|a| {
            let geo = a.to_country().geo();
            Country {
                code: a.to_string().to_ascii_uppercase(),
                numeric: a.to_country().number(),
                lon: geo.longitude(),
                lat: geo.latitude(),
            }
        })
        .collect();
    all.sort_by(|a, b| a.code.cmp(&b.code));
    all
});

/// The country of an ISO 3166-1 alpha-2 code, in either case; `None` for anything else (a
/// reserved or user-assigned code such as `XK` or `ZZ`, a region such as `001`, a longer
/// string).
pub fn country(code: &str) -> Option<&'static Country> {
    let [a, b] = code.as_bytes() else {
        return None;
    };
    let code = [a.to_ascii_uppercase(), b.to_ascii_uppercase()];
    let all: &'static [Country] = &COUNTRIES;
    all.binary_search_by(|c| c.code.as_bytes().cmp(&code[..]))
        .ok()
        .map(|i| &all[i])
}

/// Every country [`country`] knows (the bounded set of `country` labels, besides `none`).
pub fn countries() -> &'static [Country] {
    &COUNTRIES
}

/// What `tailrace_events_geo_total` and `tailrace_events_geo_country_total` have counted, with
/// the newest sequence number of each source among the events counted: a point in the
/// stream where the counts are exact, from which a client adds the events it follows
/// (`GET /api/geo`, the live page's map). The ingester adds each batch once it is stamped,
/// in one step under a lock, so counts and sequence numbers always belong together.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GeoTally {
    /// Events per precision, in the order of [`Precision::ALL`] (`none` last).
    pub by_precision: [u64; 5],
    /// Events per country code; events without a country are `none`.
    pub by_country: std::collections::BTreeMap<&'static str, u64>,
    /// Each source's newest sequence number counted.
    pub seq: std::collections::BTreeMap<String, u64>,
}

impl GeoTally {
    /// Counts one event, placed by `geo` or not at all, as the metrics do.
    pub fn add(&mut self, geo: Option<&Geo>) {
        let precision = geo.map_or(Precision::None, |g| g.precision);
        if let Some(i) = Precision::ALL.iter().position(|p| *p == precision) {
            self.by_precision[i] += 1;
        }
        let country = geo.and_then(|g| g.country).unwrap_or("none");
        *self.by_country.entry(country).or_default() += 1;
    }

    /// Adds a batch's counts, and moves each source's sequence number to the batch's newest.
    pub fn merge<'a>(
        &mut self,
        batch: &GeoTally,
        last_seq: impl IntoIterator<Item = (&'a str, u64)>,
    ) {
        for (sum, n) in self.by_precision.iter_mut().zip(batch.by_precision) {
            *sum += n;
        }
        for (country, n) in &batch.by_country {
            *self.by_country.entry(country).or_default() += n;
        }
        for (source, seq) in last_seq {
            let at = self.seq.entry(source.to_owned()).or_default();
            *at = (*at).max(seq);
        }
    }

    /// `{"precision": {"point": n, ..., "none": n}, "country": {"JP": n, ..., "none": n},
    /// "seq": {"source": n}}`; every precision present, countries only once counted.
    pub fn to_value(&self) -> Value {
        let precision: serde_json::Map<String, Value> = Precision::ALL
            .iter()
            .zip(self.by_precision)
            .map(|(p, n)| (p.as_str().to_owned(), json!(n)))
            .collect();
        json!({"precision": precision, "country": self.by_country, "seq": self.seq})
    }
}

/// Where an event was placed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Geo {
    /// Longitude, degrees east, in [-180, 180].
    pub lon: f64,
    /// Latitude, degrees north, in [-90, 90].
    pub lat: f64,
    /// The rule that placed it (never [`Precision::None`]).
    pub precision: Precision,
    /// Its country's ISO 3166-1 alpha-2 code, when known.
    pub country: Option<&'static str>,
}

impl Geo {
    /// The stamped value: `{lon, lat, precision, country}`, numbers as `f64`, `country` a
    /// code or null.
    pub fn to_value(&self) -> Value {
        json!({
            "lon": self.lon,
            "lat": self.lat,
            "precision": self.precision.as_str(),
            "country": self.country,
        })
    }

    fn at(c: &'static Country, precision: Precision) -> Geo {
        Geo {
            lon: c.lon,
            lat: c.lat,
            precision,
            country: Some(&c.code),
        }
    }
}

impl GeoConfig {
    /// Where `doc` (an event as sent, before its stamp) comes from, by the first rule that
    /// finds a place; `None` when none does. Never panics, whatever the event holds.
    pub fn locate(&self, doc: &Document) -> Option<Geo> {
        let field = |path: &Option<String>| path.as_deref().and_then(|p| get_path(doc, p));
        let country = field(&self.country)
            .and_then(Value::as_str)
            .and_then(country);
        let code = country.map(|c| c.code.as_str());
        if let Some((lon, lat)) = field(&self.point).and_then(point) {
            return Some(Geo {
                lon,
                lat,
                precision: Precision::Point,
                country: code,
            });
        }
        if let Some((lon, lat)) = field(&self.place).and_then(polygon_centre) {
            return Some(Geo {
                lon,
                lat,
                precision: Precision::Place,
                country: code,
            });
        }
        if let Some(c) = country {
            return Some(Geo::at(c, Precision::Country));
        }
        field(&self.language)
            .and_then(language_country)
            .map(|c| Geo::at(c, Precision::Language))
    }

    /// Checks the paths (`at` is the key of this table, `sources[2].geo`).
    pub fn validate(&self, at: &str, p: &mut Problems) {
        for (key, path) in [
            ("point", &self.point),
            ("place", &self.place),
            ("country", &self.country),
            ("language", &self.language),
        ] {
            if let Some(path) = path {
                p.field_path(&format!("{at}.{key}"), path);
            }
        }
    }

    /// The rules of a stream tailrace knows, used when its source sets no `geo`:
    /// - `synthetic`: its `coordinates` (a point, on about one event in twenty) and `lang`;
    /// - an `http` source of Wikimedia's EventStreams (host `stream.wikimedia.org`, or a path
    ///   `/v2/stream/...`): the language of `meta.domain` (`ja.wikipedia.org`;
    ///   `commons.wikimedia.org` and `www.wikidata.org` name no language, and place nothing);
    /// - an `http` source of a Mastodon streaming API (a path `/api/v1/streaming...`):
    ///   `language`;
    /// - a `websocket` source of Bluesky's Jetstream (a path `/subscribe` on a
    ///   `jetstream*.bsky.network` host, or with Jetstream's `wantedCollections` parameter):
    ///   `commit.record.langs` (its first element).
    ///
    /// The paths count, not only the hosts, so a mirror or a replay of these streams (the
    /// tests' local servers) gets the same rules. `None` for any other source: it places no
    /// event until it sets `geo`.
    pub fn preset(kind: &SourceKind) -> Option<GeoConfig> {
        let language = |path: &str| GeoConfig {
            language: Some(path.to_owned()),
            ..GeoConfig::default()
        };
        match kind {
            SourceKind::Synthetic(_) => Some(GeoConfig {
                point: Some("coordinates".into()),
                language: Some("lang".into()),
                ..GeoConfig::default()
            }),
            SourceKind::Http(c) => {
                let url = reqwest::Url::parse(&c.url).ok()?;
                if url.host_str() == Some("stream.wikimedia.org")
                    || url.path().starts_with("/v2/stream/")
                {
                    Some(language("meta.domain"))
                } else if url.path().starts_with("/api/v1/streaming") {
                    Some(language("language"))
                } else {
                    None
                }
            }
            SourceKind::Websocket(c) => {
                let url = reqwest::Url::parse(&c.url).ok()?;
                let bluesky = url
                    .host_str()
                    .is_some_and(|h| h.ends_with(".bsky.network") && h.starts_with("jetstream"));
                let wanted = url.query_pairs().any(|(k, _)| k == "wantedCollections");
                let jetstream = url.path() == "/subscribe" && (bluesky || wanted);
                jetstream.then(|| language("commit.record.langs"))
            }
            SourceKind::File(_) | SourceKind::Stdin(_) | SourceKind::Command(_) => None,
        }
    }
}

/// The rules of each source by name, presets filled in (what the ingester stamps by).
pub type GeoRules = HashMap<String, GeoConfig>;

/// `[lon, lat]` (or `[lon, lat, altitude]`) as finite numbers in range.
fn position(v: &Value) -> Option<(f64, f64)> {
    let items = v.as_array()?;
    if !(2..=3).contains(&items.len()) {
        return None;
    }
    let lon = items[0].as_f64()?;
    let lat = items[1].as_f64()?;
    ((-180.0..=180.0).contains(&lon) && (-90.0..=90.0).contains(&lat)).then_some((lon, lat))
}

/// A GeoJSON object of `kind` (`"Point"`, `"Polygon"`): its `coordinates`.
fn geometry<'a>(v: &'a Value, kind: &str) -> Option<&'a Value> {
    let o = v.as_object()?;
    (o.get("type")?.as_str()? == kind).then_some(())?;
    o.get("coordinates")
}

/// A GeoJSON point's position.
fn point(v: &Value) -> Option<(f64, f64)> {
    position(geometry(v, "Point")?)
}

/// The centre of a GeoJSON polygon's outer ring's extent: a bounding box's centroid. A ring
/// wider than 180° of longitude is taken to cross the antimeridian (a box around Fiji spans
/// 177°E to 178°W, not 355° the other way), and its centre is found on that side.
fn polygon_centre(v: &Value) -> Option<(f64, f64)> {
    let ring = geometry(v, "Polygon")?.as_array()?.first()?.as_array()?;
    let mut positions = Vec::with_capacity(ring.len());
    for p in ring {
        positions.push(position(p)?);
    }
    let lats = positions.iter().map(|p| p.1);
    let (south, north) = extent(lats)?;
    let (west, east) = extent(positions.iter().map(|p| p.0))?;
    let lon = if east - west > 180.0 {
        let shifted = positions
            .iter()
            .map(|p| if p.0 < 0.0 { p.0 + 360.0 } else { p.0 });
        let (west, east) = extent(shifted)?;
        let mid = (west + east) / 2.0;
        if mid > 180.0 { mid - 360.0 } else { mid }
    } else {
        (west + east) / 2.0
    };
    Some((lon, (south + north) / 2.0))
}

/// The least and greatest of some numbers; `None` for none.
fn extent(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((v.min(lo), v.max(hi))),
    })
}

/// The likely country of a language tag, a list of tags (the first), or a host name whose
/// first label is a tag.
fn language_country(v: &Value) -> Option<&'static Country> {
    let tag = match v {
        Value::String(s) => s.as_str(),
        Value::Array(items) => items.first()?.as_str()?,
        _ => return None,
    };
    if tag.len() > MAX_TAG_BYTES {
        return None;
    }
    // No tag has a `.`: a host name, whose first label may be one. `www` is the web's host
    // label, not the language Wawa (which CLDR places in Cameroon).
    let tag = match tag.split_once('.') {
        Some(("www", _)) => return None,
        Some((label, _)) => label,
        None => tag,
    };
    // The language subtag as every stream writes it, in lower case (BCP 47's canonical
    // form): a value such as "NaN" or "Infinity" is a number gone wrong, not Min Nan.
    let language = tag.split('-').next().unwrap_or_default();
    if !language.bytes().all(|b| b.is_ascii_lowercase()) {
        return None;
    }
    LIKELY.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some(found) = cache.get(tag) {
            return *found;
        }
        let found = likely_country(tag);
        // A stream has a few hundred tags; one that writes garbage cannot grow this unbounded.
        if cache.len() >= MAX_CACHED_TAGS {
            cache.clear();
        }
        cache.insert(tag.to_owned(), found);
        found
    })
}

/// Tags whose likely country a thread remembers: parsing a tag and looking up its likely
/// subtags cost most of placing an event by its language, and a stream repeats its tags.
const MAX_CACHED_TAGS: usize = 4096;

thread_local! {
    static LIKELY: std::cell::RefCell<std::collections::HashMap<String, Option<&'static Country>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// The likely country of a language tag, by CLDR.
fn likely_country(tag: &str) -> Option<&'static Country> {
    let mut locale = tag.parse::<Locale>().ok()?;
    // CLDR's likely subtags, the extended set: compiled in, so making one costs nothing (and
    // it cannot be shared between threads).
    LocaleExpander::new_extended().maximize(&mut locale.id);
    country(locale.id.region?.as_str())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
