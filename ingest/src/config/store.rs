//! `[store]`: the engine, named by `engine`, with that engine's own keys (its settings type
//! lives in the engine's folder of the store crate: [`store::Engine`]), and the keys every
//! engine shares (database, durability, the capped collections' bounds).
//!
//! Written flat, as users write it (`engine = "mongodb"` beside `uri`); read by taking the
//! shared keys out, then the rest as the named engine's settings, so a key of another engine
//! is an unknown key naming the keys this one allows.

use figment::error::Kind;
use figment::value::{Dict, Value};
use serde::ser::{Error as _, SerializeMap};
use serde::{Deserialize, Serialize, Serializer};

use super::Durability;
pub use ::store::Engine;

/// The store.
///
/// Deserializing reads the shared keys only: [`StoreConfig::from_value`] reads the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// The storage engine and its own settings: `engine = "embedded"` (no dependencies, files
    /// under `path`) or `"mongodb"` (a server at `uri`).
    #[serde(skip_deserializing, flatten, serialize_with = "write_engine")]
    pub engine: Engine,
    /// Database name holding the collections.
    pub database: String,
    /// Write concern of every write; trades latency for what survives a crash.
    pub durability: Durability,
    /// The capped collection of ingested events.
    pub events: EventsCollectionConfig,
    /// The capped collection of rejected events (too large, unparsable), for inspection.
    pub dead_letters: DeadLettersConfig,
}

/// The capped `events` collection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EventsCollectionConfig {
    /// Newest documents kept; older ones are evicted. At least 1.
    pub max_docs: u64,
    /// Total size bound in bytes; whichever bound is hit first evicts. At least 4096.
    pub max_bytes: u64,
    /// Fields (dotted paths) indexed so that `latest(field = value)` is a lookup, not a scan.
    pub indexes: Vec<String>,
}

/// The capped `dead_letters` collection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DeadLettersConfig {
    /// Newest rejected events kept. At least 1.
    pub max_docs: u64,
    /// Total size bound in bytes. At least 4096.
    pub max_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            engine: Engine::default(),
            database: "tailrace".to_owned(),
            durability: Durability::Journaled,
            events: EventsCollectionConfig::default(),
            dead_letters: DeadLettersConfig::default(),
        }
    }
}

impl Default for EventsCollectionConfig {
    fn default() -> Self {
        EventsCollectionConfig {
            max_docs: 100_000,
            max_bytes: 64 * 1024 * 1024,
            indexes: vec!["user.screen_name".into(), "user.id".into(), "id".into()],
        }
    }
}

impl Default for DeadLettersConfig {
    fn default() -> Self {
        DeadLettersConfig {
            max_docs: 10_000,
            max_bytes: 16 * 1024 * 1024,
        }
    }
}

/// The key naming the engine.
const ENGINE: &str = "engine";

/// The shared keys, in the order they are declared (serde's own list of them).
fn shared_keys() -> &'static [&'static str] {
    // An unknown field's error carries the struct's declared fields; asking for one is the
    // way serde exposes them without a second list to keep in step.
    match StoreConfig::deserialize(&Value::from(Dict::from([(
        "\u{0}".to_owned(),
        Value::from(0),
    )]))) {
        Err(figment::Error {
            kind: Kind::UnknownField(_, fields),
            ..
        }) => fields,
        _ => &[],
    }
}

/// Why `[store]` could not be read.
pub(super) struct StoreError {
    /// The error; its path is inside the table (`uri`, `events.max_docs`; `engine` for an
    /// unknown engine).
    pub error: figment::Error,
    /// The engine named, when it was read.
    pub engine: Option<String>,
}

impl StoreConfig {
    /// Reads `[store]` as layered.
    pub(super) fn from_value(value: &Value) -> Result<StoreConfig, Box<StoreError>> {
        let fail = |error: figment::Error, engine: Option<&str>| {
            Box::new(StoreError {
                error,
                engine: engine.map(str::to_owned),
            })
        };
        let Value::Dict(tag, dict) = value else {
            let error = Kind::InvalidType(super::entries::actual(value), "a table".into());
            return Err(fail(error.into(), None));
        };
        let name: String = match dict.get(ENGINE) {
            Some(v) => v
                .deserialize()
                .map_err(|e: figment::Error| fail(e.with_path(ENGINE), None))?,
            None => Engine::default().name().to_owned(),
        };
        let shared_keys = shared_keys();
        let (shared, own): (Dict, Dict) = dict
            .iter()
            .filter(|(k, _)| *k != ENGINE)
            .map(|(k, v)| (k.clone(), v.clone()))
            .partition(|(k, _)| shared_keys.contains(&k.as_str()));
        let mut config = StoreConfig::deserialize(&Value::Dict(*tag, shared))
            .map_err(|e| fail(e, Some(&name)))?;
        let tagged = Value::Dict(*tag, Dict::from([(name.clone(), Value::Dict(*tag, own))]));
        config.engine = Engine::deserialize(&tagged).map_err(|mut e| {
            if matches!(e.kind, Kind::UnknownVariant(..)) {
                e.path = vec![ENGINE.to_owned()];
                return fail(e, None);
            }
            if e.path.first() == Some(&name) {
                // The variant's own segment: the user wrote these keys flat.
                e.path.remove(0);
            }
            fail(e, Some(&name))
        })?;
        Ok(config)
    }

    /// The keys `[store]` allows before the engine's own: `engine` and the shared ones.
    pub(super) fn leading_keys() -> Vec<&'static str> {
        let mut keys = vec![ENGINE];
        keys.extend(shared_keys());
        keys
    }

    /// For a key the engine `name` does not have: the other engine that has it, if one does
    /// (`uri` with `engine = "embedded"`).
    pub(super) fn engine_with_key(name: &str, key: &str) -> Option<&'static str> {
        Engine::NAMES.iter().copied().find(|other| {
            *other != name
                && Engine::named(other).is_some_and(|e| e.keys().iter().any(|k| k == key))
        })
    }
}

/// The engine written flat, as users write it: `engine` and the engine's keys.
fn write_engine<S: Serializer>(engine: &Engine, s: S) -> Result<S::Ok, S::Error> {
    let own = match serde_json::to_value(engine).map_err(S::Error::custom)? {
        serde_json::Value::Object(tagged) => tagged
            .into_iter()
            .next()
            .and_then(|(_, body)| match body {
                serde_json::Value::Object(keys) => Some(keys),
                _ => None,
            })
            .unwrap_or_default(),
        _ => Default::default(),
    };
    let mut map = s.serialize_map(Some(1 + own.len()))?;
    map.serialize_entry(ENGINE, engine.name())?;
    for (k, v) in &own {
        map.serialize_entry(k, v)?;
    }
    map.end()
}
