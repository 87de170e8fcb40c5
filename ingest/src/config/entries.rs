//! `[[sources]]` and `[[feeds]]` tables: a `name`, a `kind`, and the keys of that kind.
//!
//! Each kind owns its settings type (a source kind's lives in its own file under `source/`),
//! with its defaults and with unknown keys refused, so a key of another kind is an unknown key
//! naming the keys this kind allows. The kinds are a serde enum, externally tagged
//! (`{"http": {...}}`); a table is read by moving its `kind` out into that tag and letting
//! serde pick the variant, and written back flat (`{name, kind, ...}`), as users write it.
//!
//! Why not serde's internally tagged enums (`#[serde(tag = "kind")]`): they buffer the table
//! before choosing the variant, and errors found afterwards lose the key they are about; this
//! way every error keeps its dotted key (`sources[2].rate_per_sec`).

use figment::error::{Actual, Kind};
use figment::value::{Dict, Value};
use serde::Deserialize;
use serde::de::{DeserializeOwned, Error as _};
use serde::ser::{Error as _, SerializeMap};
use serde::{Serialize, Serializer};

/// A table with a name and a kind-specific body.
pub trait Entry: Sized {
    /// The kinds with their settings: a serde enum, externally tagged, variant names
    /// lowercase (`synthetic`, `http`, ...).
    type Kind: Serialize + DeserializeOwned;

    /// The keys every table of the section takes besides `name` and `kind`, whatever its kind
    /// (a source's `geo`): a struct of them, unknown keys refused. Written back flat, after
    /// the kind's keys.
    type Shared: Serialize + DeserializeOwned;

    /// Their names: these keys of a table are read into [`Entry::Shared`], the others by the
    /// kind; an unknown key's error lists them among the allowed ones.
    const SHARED: &'static [&'static str];

    /// Puts an entry together.
    fn new(name: String, kind: Self::Kind, shared: Self::Shared) -> Self;

    /// Its shared keys, to write them back.
    fn shared(&self) -> Self::Shared;

    /// Its name.
    fn name(&self) -> &str;

    /// Its kind and settings.
    fn kind(&self) -> &Self::Kind;
}

/// Why a table could not be read.
#[derive(Debug)]
pub struct EntryError {
    /// The error, its path inside the table (`url`, `filter.ops.1`; `kind` for an unknown
    /// kind).
    pub error: figment::Error,
    /// The table's kind, when it was read (to say which kind requires a missing key).
    pub kind: Option<String>,
}

/// Reads one table.
pub fn parse<E: Entry>(value: &Value) -> Result<E, Box<EntryError>> {
    parse_inner(value).map_err(|(error, kind)| {
        Box::new(EntryError {
            error,
            kind: (!kind.is_empty()).then_some(kind),
        })
    })
}

#[allow(clippy::result_large_err)] // boxed once, by `parse`
fn parse_inner<E: Entry>(value: &Value) -> Result<E, (figment::Error, String)> {
    let no_kind = String::new();
    let Value::Dict(tag, dict) = value else {
        return Err((
            Kind::InvalidType(actual(value), "a table".into()).into(),
            no_kind,
        ));
    };
    let name: String = match dict.get("name") {
        Some(v) => v
            .deserialize()
            .map_err(|e: figment::Error| (e.with_path("name"), no_kind.clone()))?,
        None => return Err((figment::Error::missing_field("name"), no_kind)),
    };
    let kind: String = match dict.get("kind") {
        Some(v) => v
            .deserialize()
            .map_err(|e: figment::Error| (e.with_path("kind"), no_kind.clone()))?,
        None => return Err((figment::Error::missing_field("kind"), no_kind)),
    };
    let (shared, body): (Dict, Dict) = dict
        .iter()
        .filter(|(k, _)| *k != "name" && *k != "kind")
        .map(|(k, v)| (k.clone(), v.clone()))
        .partition(|(k, _)| E::SHARED.contains(&k.as_str()));
    let shared = E::Shared::deserialize(&Value::Dict(*tag, shared))
        .map_err(|e: figment::Error| (e, kind.clone()))?;
    let tagged = Value::Dict(*tag, Dict::from([(kind.clone(), Value::Dict(*tag, body))]));
    match E::Kind::deserialize(&tagged) {
        Ok(k) => Ok(E::new(name, k, shared)),
        Err(mut e) => {
            let at_top = e.path.is_empty() || e.path == [kind.clone()];
            if matches!(e.kind, Kind::UnknownVariant(..)) && at_top {
                // No such kind.
                e.path = vec!["kind".into()];
            } else if e.path.first() == Some(&kind) {
                // The variant's own segment: the user wrote these keys flat.
                e.path.remove(0);
            }
            Err((e, kind))
        }
    }
}

/// What a value is, for an error that expected a table.
pub(super) fn actual(value: &Value) -> Actual {
    match value {
        Value::String(_, s) => Actual::Str(s.clone()),
        Value::Char(_, c) => Actual::Char(*c),
        Value::Bool(_, b) => Actual::Bool(*b),
        Value::Num(..) => Actual::Other("a number".into()),
        Value::Empty(..) => Actual::Unit,
        Value::Array(..) => Actual::Seq,
        Value::Dict(..) => Actual::Map,
    }
}

/// Writes one table flat: `{name, kind, ...the kind's keys}`.
pub fn serialize<E: Entry, S: Serializer>(entry: &E, s: S) -> Result<S::Ok, S::Error> {
    let tagged = serde_json::to_value(entry.kind()).map_err(S::Error::custom)?;
    let (kind, body) = match tagged {
        serde_json::Value::Object(o) if o.len() == 1 => o
            .into_iter()
            .next()
            .ok_or_else(|| S::Error::custom("a kind serialized to an empty object"))?,
        // A kind without settings (a unit variant) serializes to its name.
        serde_json::Value::String(kind) => (kind, serde_json::Value::Object(Default::default())),
        other => {
            return Err(S::Error::custom(format!(
                "a kind must serialize as {{kind: settings}}, got {other}"
            )));
        }
    };
    let body = match body {
        serde_json::Value::Object(o) => o,
        serde_json::Value::Null => Default::default(),
        other => {
            return Err(S::Error::custom(format!(
                "the settings of kind {kind} must serialize as a table, got {other}"
            )));
        }
    };
    let shared = match serde_json::to_value(entry.shared()).map_err(S::Error::custom)? {
        serde_json::Value::Object(o) => o,
        serde_json::Value::Null => Default::default(),
        other => {
            return Err(S::Error::custom(format!(
                "the shared keys must serialize as a table, got {other}"
            )));
        }
    };
    let mut map = s.serialize_map(Some(body.len() + shared.len() + 2))?;
    map.serialize_entry("name", entry.name())?;
    map.serialize_entry("kind", &kind)?;
    for (k, v) in body.iter().chain(&shared) {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

/// [`Entry::Shared`] of a section whose tables take no keys beside `name`, `kind` and their
/// kind's.
#[derive(Debug, Default, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoShared {}
