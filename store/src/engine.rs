//! Store engines as a registered kind: `[store]` names one (`engine = "embedded"`), and the
//! rest of its keys are that engine's settings, a type in the engine's own folder
//! ([`crate::embedded::EmbeddedSettings`], [`crate::mongo::MongoSettings`]) with its keys, its
//! defaults, its rules, how it opens and where its data lives ([`EngineSettings`]).
//!
//! **Adding an engine** = its folder (the [`crate::Store`] contract and a settings type
//! implementing [`EngineSettings`]), one line in the [`engines!`] list below, and its file of
//! the contract suite (`store/tests/contract/`). Nothing outside the store names an engine:
//! the pipeline opens whatever the configuration names through [`Engine::settings`], and asks
//! an opened store what it can do ([`crate::Store::capabilities`]).

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::{Result, Store};

/// What opening an engine needs beyond its own settings: the keys of `[store]` every engine
/// shares, and the pipeline's.
#[derive(Debug, Clone)]
pub struct OpenWith {
    /// `store.database`: the database holding the collections.
    pub database: String,
    /// Writes waiting for a collection's writer; when full, writers wait (backpressure).
    pub queue_capacity: usize,
}

/// What every engine's settings provide.
pub trait EngineSettings: Send + Sync {
    /// The rules serde cannot check, each as (key inside `[store]`, what is wrong and the
    /// fix).
    fn problems(&self) -> Vec<(&'static str, String)>;

    /// Opens the engine, creating what is missing.
    fn open<'a>(&'a self, with: &'a OpenWith) -> BoxFuture<'a, Result<Arc<dyn Store>>>;

    /// Where the data lives, for humans and logs (no secrets).
    fn location(&self, database: &str) -> String;

    /// The local directory the engine writes, if it writes one (the bench probes that disk).
    fn data_dir(&self) -> Option<&Path> {
        None
    }

    /// Points the engine at storage of its own under `dir`, empty the first time (the bench
    /// gives each scenario its own). An engine that keeps nothing locally ignores it; the
    /// database name, which every engine has, is changed by the caller.
    fn use_scratch(&mut self, dir: &Path) {
        let _ = dir;
    }

    /// Replaces secrets (a password in a connection string) with `***`, for printing.
    fn redact(&mut self) {}
}

/// Declares the engines: the [`Engine`] enum (externally tagged by the engine's name, which
/// the configuration reads from `engine = "..."`) and its accessors.
macro_rules! engines {
    ($($(#[$doc:meta])* $variant:ident($settings:ty) = $name:literal,)+) => {
        /// An engine with its settings: `[store]`'s `engine` and that engine's own keys.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub enum Engine {
            $($(#[$doc])* #[serde(rename = $name)] $variant($settings),)+
        }

        impl Engine {
            /// Every engine's name, as `engine = "..."` spells it.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The engine's name (`embedded`, `mongodb`): the config's and metrics' label.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Engine::$variant(_) => $name,)+
                }
            }

            /// The engine called `name` with its default settings.
            pub fn named(name: &str) -> Option<Engine> {
                match name {
                    $($name => Some(Engine::$variant(<$settings>::default())),)+
                    _ => None,
                }
            }

            /// The settings, behind the trait every engine implements.
            pub fn settings(&self) -> &dyn EngineSettings {
                match self {
                    $(Engine::$variant(s) => s,)+
                }
            }

            /// The settings, to change them (the bench's scratch directories, redaction).
            pub fn settings_mut(&mut self) -> &mut dyn EngineSettings {
                match self {
                    $(Engine::$variant(s) => s,)+
                }
            }
        }
    };
}

engines! {
    /// The journal engine, in-process: files under `path`, no server. The default.
    Embedded(crate::embedded::EmbeddedSettings) = "embedded",
    /// A MongoDB replica set, or a server that speaks its protocol, at `uri`.
    Mongodb(crate::mongo::MongoSettings) = "mongodb",
}

impl Default for Engine {
    fn default() -> Self {
        Engine::Embedded(Default::default())
    }
}

impl Engine {
    /// Sets one of the engine's keys by name (a command-line flag such as the bench's
    /// `--uri`); a key the engine does not have, or a value of the wrong type, is refused.
    pub fn set(&mut self, key: &str, value: serde_json::Value) -> std::result::Result<(), String> {
        let name = self.name();
        let mut tagged = serde_json::to_value(&*self).map_err(|e| e.to_string())?;
        let Some(keys) = tagged.get_mut(name).and_then(|v| v.as_object_mut()) else {
            return Err(format!("engine {name} has no settings"));
        };
        if !keys.contains_key(key) {
            let allowed: Vec<&str> = keys.keys().map(String::as_str).collect();
            return Err(format!(
                "engine {name} has no key {key} (its keys: {})",
                allowed.join(", ")
            ));
        }
        keys.insert(key.to_owned(), value);
        *self = serde_json::from_value(tagged).map_err(|e| format!("{name}.{key}: {e}"))?;
        Ok(())
    }

    /// The keys of this engine's settings as written in `[store]` (its default settings'
    /// keys: every key is written, none skipped).
    pub fn keys(&self) -> Vec<String> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(tagged)) => tagged
                .into_iter()
                .flat_map(|(_, body)| match body {
                    serde_json::Value::Object(keys) => keys.into_iter().map(|(k, _)| k).collect(),
                    _ => Vec::new(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_is_named_and_found_by_its_name() {
        for name in Engine::NAMES {
            let engine = Engine::named(name).unwrap_or_else(|| panic!("{name} not found"));
            assert_eq!(engine.name(), *name);
            assert!(!engine.keys().is_empty(), "{name} has no keys");
        }
        assert_eq!(Engine::named("postgres"), None);
        assert_eq!(Engine::default().name(), "embedded");
    }

    #[test]
    fn a_key_is_set_by_name_and_a_foreign_one_refused() {
        let mut engine = Engine::default();
        engine
            .set("path", serde_json::json!("/srv/tailrace"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            engine.settings().data_dir(),
            Some(Path::new("/srv/tailrace"))
        );
        let e = engine.set("uri", serde_json::json!("mongodb://h/"));
        assert!(e.is_err_and(|e| e.contains("no key uri")));
        let e = engine.set("oplog_max_entries", serde_json::json!("many"));
        assert!(e.is_err_and(|e| e.contains("oplog_max_entries")));
    }

    #[test]
    fn an_engine_is_written_as_its_name_and_keys() {
        let json = serde_json::to_value(Engine::default()).unwrap_or_default();
        let mut keys: Vec<&str> = json["embedded"]
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        assert_eq!(keys, ["oplog_max_entries", "path"]);
        let mut keys = Engine::default().keys();
        keys.sort_unstable();
        assert_eq!(keys, ["oplog_max_entries", "path"]);
    }
}
