//! Loading: the defaults, the file and the environment, layered; then the `[[sources]]` and
//! `[[feeds]]` tables, each by its kind; then the rules. Every problem found is reported at
//! once.

use std::path::Path;

use figment::error::Kind;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Deserialize;

use super::env::{ENV_IGNORED, ENV_METADATA_NAME, ENV_PREFIX, ENV_SEPARATOR, env_var_name};
use super::errors::{
    ConfigError, Tagged, describe_entry_error, key_path, single_line, value_origin, with_origin,
};
use super::store::StoreError;
use super::validate::{self, Loaded, Problem};
use super::{
    Config, FeedConfig, HttpConfig, IngestConfig, LogConfig, SourceConfig, StatsConfig,
    StoreConfig, entries,
};

/// `TAILRACE_*` variables, minus the CLI's own, split into levels at `__`; its metadata
/// names the variable of a key, so errors can point at it.
struct EnvProvider;

impl EnvProvider {
    fn env() -> Env {
        Env::prefixed(ENV_PREFIX)
            .ignore(&ENV_IGNORED)
            .split(ENV_SEPARATOR)
    }
}

impl Provider for EnvProvider {
    fn metadata(&self) -> Metadata {
        Metadata::named(ENV_METADATA_NAME)
            .interpolater(|_: &Profile, keys: &[&str]| env_var_name(keys))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Self::env().data()
    }
}

/// The tree as serde reads it in one go: the `[[sources]]` and `[[feeds]]` tables are kept
/// as values and read by kind afterwards (see [`entries`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tree {
    #[serde(default)]
    http: HttpConfig,
    #[serde(default)]
    log: LogConfig,
    store: Option<Value>,
    #[serde(default)]
    ingest: IngestConfig,
    #[serde(default)]
    stats: StatsConfig,
    #[serde(default)]
    sources: Vec<Value>,
    #[serde(default)]
    feeds: Vec<Value>,
}

impl Config {
    /// Loads the configuration: defaults, then the TOML file at `path` (which must exist),
    /// then `TAILRACE_*` environment variables; then validates it.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        if let Some(missing) = path.filter(|p| !p.exists()) {
            return Err(ConfigError::MissingFile {
                path: missing.to_path_buf(),
            });
        }
        Config::from_figment(Config::figment(path))
    }

    /// The built-in defaults as a layer. The default engine's own keys are left out: they are
    /// its settings' defaults, and a file that names another engine would find them unknown.
    pub fn defaults() -> Serialized<serde_json::Value> {
        let config = Config::default();
        let mut tree = serde_json::to_value(&config).unwrap_or_default();
        if let Some(store) = tree.get_mut("store").and_then(|s| s.as_object_mut()) {
            for key in config.store.engine.keys() {
                store.remove(&key);
            }
        }
        Serialized::defaults(tree)
    }

    /// The layered sources without extracting them: defaults, the file (if any, taken as
    /// given, not searched for in parent directories), then the environment. Does not check
    /// that the file exists; [`Config::load`] does.
    pub fn figment(path: Option<&Path>) -> Figment {
        let figment = Figment::from(Config::defaults());
        let figment = match path {
            Some(path) => figment.merge(Toml::file_exact(path)),
            None => figment,
        };
        figment.merge(EnvProvider)
    }

    /// Reads the tree, then every `[[sources]]` / `[[feeds]]` table by its kind, then checks
    /// the rules; every problem is reported, each saying where its value came from.
    pub fn from_figment(figment: Figment) -> Result<Config, ConfigError> {
        let tree: Tree = figment
            .extract()
            .map_err(|e| ConfigError::from_figment(&figment, e))?;
        let store = match &tree.store {
            Some(value) => read_store(&figment, value)?,
            None => StoreConfig::default(),
        };
        let sources = read_entries::<SourceConfig>(&figment, "sources", &tree.sources);
        let feeds = read_entries::<FeedConfig>(&figment, "feeds", &tree.feeds);
        let mut config = Config {
            http: tree.http,
            log: tree.log,
            store,
            ingest: tree.ingest,
            stats: tree.stats,
            sources: Vec::new(),
            feeds: Vec::new(),
        };
        let problems = validate::problems(
            &config,
            sources.iter().map(Loaded::as_ref),
            feeds.iter().map(Loaded::as_ref),
        );
        if !problems.is_empty() {
            return Err(ConfigError::Invalid {
                problems: problems
                    .into_iter()
                    .map(|p| match p {
                        Problem::Rule { key, message } => {
                            match value_origin(&figment, &key_path(&key)) {
                                Some(origin) => format!("{key}: {message} (from {origin})"),
                                None => format!("{key}: {message}"),
                            }
                        }
                        Problem::Unreadable(line) => line,
                    })
                    .map(|p| single_line(&p))
                    .collect(),
            });
        }
        config.sources = sources.into_iter().filter_map(Loaded::ok).collect();
        config.feeds = feeds.into_iter().filter_map(Loaded::ok).collect();
        Ok(config)
    }
}

/// Reads `[store]` by its engine; what cannot be read is one error line.
fn read_store(figment: &Figment, value: &Value) -> Result<StoreConfig, ConfigError> {
    StoreConfig::from_value(value).map_err(|e| {
        let StoreError { mut error, engine } = *e;
        error.path.insert(0, "store".to_owned());
        let error = with_origin(figment, error);
        let leading = StoreConfig::leading_keys();
        let tagged = engine.as_deref().map(|value| Tagged {
            key: "engine",
            value,
            leading: &leading,
            depth: 1,
        });
        let mut line = describe_entry_error(figment, &error, tagged.as_ref());
        if let (Kind::UnknownField(field, _), Some(engine)) = (&error.kind, &engine)
            && let Some(other) = StoreConfig::engine_with_key(engine, field)
        {
            line.push_str(&format!(" ({field} is a key of engine = {other:?})"));
        }
        ConfigError::Load {
            problems: vec![single_line(&line)],
        }
    })
}

/// Reads each table of `section` by its kind; a table that cannot be read becomes its error
/// line (dotted key, what is wrong, where it came from).
fn read_entries<E: entries::Entry>(
    figment: &Figment,
    section: &str,
    values: &[Value],
) -> Vec<Loaded<E>> {
    values
        .iter()
        .enumerate()
        .map(|(i, value)| match entries::parse::<E>(value) {
            Ok(entry) => Loaded::Ok(entry),
            Err(e) => {
                let entries::EntryError { mut error, kind } = *e;
                let mut path = vec![section.to_owned(), i.to_string()];
                path.append(&mut error.path);
                error.path = path;
                let leading: Vec<&str> = ["name", "kind"]
                    .into_iter()
                    .chain(E::SHARED.iter().copied())
                    .collect();
                let tagged = kind.as_deref().map(|value| Tagged {
                    key: "kind",
                    value,
                    leading: &leading,
                    depth: 2,
                });
                Loaded::Unreadable(describe_entry_error(figment, &error, tagged.as_ref()))
            }
        })
        .collect()
}
