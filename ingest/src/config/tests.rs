//! Tests of loading, validation, error messages and redaction.

// `result_large_err`: `Jail::expect_with` closures must return `figment::Result`.
#![allow(clippy::unwrap_used, clippy::result_large_err)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use figment::providers::{Format, Serialized, Toml};
use figment::value::Value;
use figment::{Figment, Jail};

use super::redact::redact_url;
use super::*;
use crate::source::file::{FileConfig, Pace};
use crate::source::http::{HttpConfig, HttpFormat};
use crate::source::synthetic::SyntheticConfig;
use crate::source::{SourceConfig, SourceKind};
use ::store::embedded::EmbeddedSettings;
use ::store::mongo::MongoSettings;
use std::collections::BTreeSet;

/// The annotated reference configuration shipped in the repository.
const REFERENCE: &str = include_str!("../../../config/tailrace.toml");

/// Defaults + this TOML (no environment: safe outside a jail).
fn with_toml(toml: &str) -> Result<Config, ConfigError> {
    Config::from_figment(Figment::from(Config::defaults()).merge(Toml::string(toml)))
}

/// The error message of loading defaults + this TOML.
fn toml_err(toml: &str) -> String {
    match with_toml(toml) {
        Ok(config) => panic!("expected an error for {toml:?}, loaded {config:?}"),
        Err(e) => e.to_string(),
    }
}

/// The validation problems of `config`.
fn problems(config: &Config) -> Vec<String> {
    match config.validate() {
        Ok(()) => Vec::new(),
        Err(ConfigError::Invalid { problems }) => problems,
        Err(other) => panic!("validate returned a non-validation error: {other}"),
    }
}

/// Asserts that one of `problems` is exactly `expected`.
#[track_caller]
fn assert_problem(problems: &[String], expected: &str) {
    assert!(
        problems.iter().any(|p| p == expected),
        "expected problem {expected:?}, got {problems:#?}"
    );
}

/// Loads with `path` inside a jail (whose environment the caller set up), expecting an error.
fn load_err(path: Option<&str>) -> String {
    match Config::load(path.map(Path::new)) {
        Ok(config) => panic!("expected an error, loaded {config:?}"),
        Err(e) => e.to_string(),
    }
}

/// The problems of defaults + this TOML (loading and validation together).
fn toml_problems(toml: &str) -> Vec<String> {
    match with_toml(toml) {
        Ok(_) => Vec::new(),
        Err(e) => e.problems(),
    }
}

#[test]
fn reference_file_spells_out_every_key() {
    fn leaves(value: &Value, path: String, out: &mut BTreeSet<String>) {
        match value {
            Value::Dict(_, dict) if !dict.is_empty() => {
                for (k, v) in dict {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(v, p, out);
                }
            }
            Value::Array(_, items) if items.iter().any(|v| matches!(v, Value::Dict(..))) => {
                for (i, v) in items.iter().enumerate() {
                    leaves(v, format!("{path}[{i}]"), out);
                }
            }
            _ => {
                out.insert(path);
            }
        }
    }
    let mut defaults = BTreeSet::new();
    let value: Value = Figment::from(Serialized::defaults(Config::default()))
        .extract()
        .unwrap();
    leaves(&value, String::new(), &mut defaults);
    let mut reference = BTreeSet::new();
    let value: Value = Figment::from(Toml::string(REFERENCE)).extract().unwrap();
    leaves(&value, String::new(), &mut reference);
    let missing: Vec<_> = defaults.difference(&reference).collect();
    assert!(
        missing.is_empty(),
        "keys missing from config/tailrace.toml: {missing:?}"
    );
    assert!(defaults.len() > 30, "suspiciously few keys: {defaults:?}");
    // The other engines' keys are there too, commented out (a key of another engine is
    // refused).
    for name in Engine::NAMES {
        let engine = Engine::named(name).unwrap();
        for key in engine.keys() {
            let documented = REFERENCE.lines().any(|line| {
                let line = line.trim_start_matches(['#', ' ']);
                line.starts_with(&format!("{key} = "))
            });
            assert!(
                documented,
                "store.{key} of engine {name} missing from config/tailrace.toml"
            );
        }
    }
}

#[test]
fn reference_file_loads_from_disk() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("tailrace.toml", REFERENCE)?;
        let config = Config::load(Some(Path::new("tailrace.toml")));
        assert!(
            matches!(&config, Ok(c) if *c == Config::default()),
            "{config:?}"
        );
        Ok(())
    });
}

#[test]
fn env_overrides_defaults() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("TAILRACE_STORE__ENGINE", "mongodb");
        jail.set_env("TAILRACE_HTTP__LISTEN", "127.0.0.1:0");
        jail.set_env("TAILRACE_STATS__PERIOD", "30");
        jail.set_env("TAILRACE_INGEST__ROLLUP_FIELDS", r#"["lang"]"#);
        let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            config.store.engine,
            Engine::Mongodb(MongoSettings::default())
        );
        assert_eq!(config.http.listen, SocketAddr::from(([127, 0, 0, 1], 0)));
        assert_eq!(config.stats.period, 30);
        assert_eq!(config.ingest.rollup_fields, ["lang"]);
        // Untouched keys keep their defaults.
        assert_eq!(config.store.database, "tailrace");
        Ok(())
    });
}

/// The test tools' variables share the prefix but are not config keys: a shell (CI) that
/// exported them still runs tailrace; a misspelt config key is still refused.
#[test]
fn the_test_tools_variables_are_not_config_keys() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("TAILRACE_TEST_MONGODB_URI", "mongodb://127.0.0.1:1/");
        jail.set_env("TAILRACE_FERRETDB_BIN", "/cache/ferretdb");
        jail.set_env("TAILRACE_FERRETDB_HOME", "/tmp/ferretdb");
        Config::load(None).unwrap_or_else(|e| panic!("{e}"));
        jail.set_env("TAILRACE_FERRETDB_PORT", "1");
        let e = Config::load(None).expect_err("an unknown key is refused");
        assert!(e.to_string().contains("ferretdb_port"), "{e}");
        Ok(())
    });
}

#[test]
fn env_overrides_file_which_overrides_defaults() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "tailrace.toml",
            "[stats]\nperiod = 5\nk = 3.5\n[store]\ndurability = \"acknowledged\"\n",
        )?;
        jail.set_env("TAILRACE_STATS__PERIOD", "7");
        let config =
            Config::load(Some(Path::new("tailrace.toml"))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.stats.period, 7, "env must win over the file");
        assert_eq!(config.stats.k, 3.5, "file must win over defaults");
        assert_eq!(config.store.durability, Durability::Acknowledged);
        assert_eq!(config.stats.topk, 10, "defaults fill the rest");
        Ok(())
    });
}

#[test]
fn env_values_that_look_like_other_types() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let uri = "mongodb://u:p@h1:27017,h2:27017/?replicaSet=rs0&w=majority";
        jail.set_env("TAILRACE_STORE__PATH", "/var/lib/tailrace");
        let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            config.store.engine,
            Engine::Embedded(EmbeddedSettings::at("/var/lib/tailrace"))
        );
        jail.set_env("TAILRACE_STORE__ENGINE", "mongodb");
        jail.set_env("TAILRACE_STORE__URI", uri);
        let message = load_err(None);
        assert_eq!(
            message,
            "unknown key store.path (allowed: engine, database, durability, events, \
             dead_letters, uri) (from env TAILRACE_STORE__PATH) (path is a key of engine = \
             \"embedded\")"
        );
        jail.clear_env();
        jail.set_env("TAILRACE_STORE__ENGINE", "mongodb");
        jail.set_env("TAILRACE_STORE__URI", uri);
        let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.store.engine, Engine::Mongodb(MongoSettings::at(uri)));

        jail.set_env("TAILRACE_STORE__DATABASE", "123");
        let message = load_err(None);
        assert_eq!(
            message,
            "store.database: expected a string, found integer 123 (quote it to keep it a \
             string: TAILRACE_STORE__DATABASE='\"...\"') (from env TAILRACE_STORE__DATABASE)"
        );
        jail.set_env("TAILRACE_STORE__DATABASE", "\"123\"");
        let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.store.database, "123");
        Ok(())
    });
}

#[test]
fn cli_variables_are_not_config_keys() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("TAILRACE_CONFIG", "/nonexistent/tailrace.toml");
        jail.set_env("TAILRACE_LOG", "debug");
        jail.set_env("TAILRACE_LOG_FORMAT", "json");
        // Keys under [log] are still reachable.
        jail.set_env("TAILRACE_LOG__STATUS_INTERVAL_SECS", "0");
        let config = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.log.status_interval_secs, 0);
        Ok(())
    });
}

#[test]
fn unknown_key_in_file_names_dotted_key_and_file() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("tailrace.toml", "[store]\nenigne = \"mongodb\"\n")?;
        let message = load_err(Some("tailrace.toml"));
        assert_eq!(
            message,
            "unknown key store.enigne (allowed: engine, database, durability, events, \
             dead_letters, path, oplog_max_entries) (from file tailrace.toml)"
        );
        Ok(())
    });
}

#[test]
fn unknown_key_in_array_element_names_index() {
    let message = toml_err("[[sources]]\nname = \"a\"\nkind = \"stdin\"\nurll = \"x\"\n");
    assert_eq!(
        message,
        "unknown key sources[0].urll (allowed: name, kind, geo) (from TOML source string)"
    );
    let message = toml_err("[store.dead_letters]\nindexes = [\"id\"]\n");
    assert!(
        message.starts_with("unknown key store.dead_letters.indexes "),
        "{message}"
    );
}

#[test]
fn unknown_env_var_is_named() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("TAILRACE_STORE__ENIGNE", "mongodb");
        let message = load_err(None);
        assert!(message.contains("unknown key store.enigne"), "{message}");
        assert!(
            message.ends_with("(from env TAILRACE_STORE__ENIGNE)"),
            "{message}"
        );

        jail.clear_env();
        jail.set_env("TAILRACE_BOGUS", "1");
        let message = load_err(None);
        assert_eq!(
            message,
            "unknown key bogus (allowed: http, log, store, ingest, stats, sources, feeds) \
             (from env TAILRACE_BOGUS)"
        );

        jail.clear_env();
        jail.set_env("TAILRACE_STORE_ENGINE", "mongodb");
        let message = load_err(None);
        assert!(
            message.contains("did you mean TAILRACE_STORE__ENGINE?"),
            "{message}"
        );
        assert!(
            message.contains("(from env TAILRACE_STORE_ENGINE)"),
            "{message}"
        );
        Ok(())
    });
}

#[test]
fn bad_enum_value_lists_allowed_values() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("tailrace.toml", "[store]\ndurability = \"fast\"\n")?;
        let message = load_err(Some("tailrace.toml"));
        assert_eq!(
            message,
            "store.durability: \"fast\" is not one of unacknowledged, acknowledged, journaled, \
             majority (from file tailrace.toml)"
        );

        jail.set_env("TAILRACE_STORE__ENGINE", "postgres");
        let message = load_err(None);
        // The engines the store registers, in their order (embedded, mongodb, ...).
        assert_eq!(
            message,
            format!(
                "store.engine: \"postgres\" is not one of {} (from env TAILRACE_STORE__ENGINE)",
                Engine::NAMES.join(", ")
            )
        );
        assert!(message.contains("embedded, mongodb"), "{message}");
        Ok(())
    });
    let message =
        toml_err("[[feeds]]\nname = \"a\"\nkind = \"changes\"\nfilter = { ops = [\"upsert\"] }\n");
    assert!(
        message.starts_with(
            "feeds[0].filter.ops[0]: \"upsert\" is not one of insert, update, replace, delete"
        ),
        "{message}"
    );
}

#[test]
fn missing_file_names_the_path() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let result = Config::load(Some(Path::new("conf/nope.toml")));
        match result {
            Err(ConfigError::MissingFile { ref path }) => {
                assert_eq!(path, Path::new("conf/nope.toml"))
            }
            other => panic!("expected MissingFile, got {other:?}"),
        }
        let message = load_err(Some("conf/nope.toml"));
        assert!(message.contains("conf/nope.toml"), "{message}");
        Ok(())
    });
}

#[test]
fn syntax_error_is_one_line_naming_the_file() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("broken.toml", "[store\nengine = 1\n")?;
        let message = load_err(Some("broken.toml"));
        assert!(
            message.starts_with("file broken.toml: TOML parse error at line 1"),
            "{message}"
        );
        assert!(!message.contains('\n'), "{message:?}");
        Ok(())
    });
}

#[test]
fn wrong_types_name_key_found_and_expected() {
    let message = toml_err("[stats]\nperiod = \"x\"\n");
    assert_eq!(
        message,
        "stats.period: expected a non-negative integer, found string \"x\" (from TOML source string)"
    );
    let message = toml_err("[ingest]\nbatch_max_events = -1\n");
    assert!(
        message.starts_with("ingest.batch_max_events: integer -1 is out of range"),
        "{message}"
    );
    let message = toml_err("[http]\nlisten = \"localhost\"\n");
    assert!(
        message
            .starts_with("http.listen: \"localhost\" is not valid: invalid socket address syntax"),
        "{message}"
    );
    let message = toml_err("[[sources]]\nkind = \"stdin\"\n");
    assert!(
        message.starts_with("sources[0].name: missing (required)"),
        "{message}"
    );
}

#[test]
fn env_array_elements_cannot_be_set_one_by_one() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("TAILRACE_SOURCES__0__NAME", "x");
        let message = load_err(None);
        assert!(
            message.starts_with("sources: expected an array, found a table"),
            "{message}"
        );
        assert!(
            message.contains("set TAILRACE_SOURCES to the whole array"),
            "{message}"
        );

        jail.clear_env();
        jail.set_env(
            "TAILRACE_SOURCES",
            r#"[{ name = "x", kind = "synthetic", rate_per_sec = 0 }]"#,
        );
        let message = load_err(None);
        assert!(
            message.contains(
                "sources[0].rate_per_sec: must be > 0 (got 0) (from env TAILRACE_SOURCES)"
            ),
            "{message}"
        );
        Ok(())
    });
}

#[test]
fn validation_problems_say_where_the_value_came_from() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "tailrace.toml",
            "[[sources]]\nname = \"web\"\nkind = \"http\"\n",
        )?;
        jail.set_env("TAILRACE_STATS__PERIOD", "1");
        let message = load_err(Some("tailrace.toml"));
        assert_eq!(
            message,
            "stats.period: must be >= 2 (got 1) (from env TAILRACE_STATS__PERIOD); \
             sources[0].url: required for kind = \"http\" (from file tailrace.toml)"
        );
        Ok(())
    });
}

#[test]
fn header_values_interpolate_environment_variables() {
    let env = |name: &str| (name == "TOKEN").then(|| "s3cret".to_owned());
    assert_eq!(
        interpolate_env("Bearer ${TOKEN}", env).as_deref(),
        Ok("Bearer s3cret")
    );
    assert_eq!(interpolate_env("a$$b $x", env).as_deref(), Ok("a$b $x"));
    assert_eq!(
        interpolate_env("${MISSING}", env),
        Err("environment variable MISSING is not set".to_owned())
    );
    assert!(
        interpolate_env("${TOKEN", env)
            .unwrap_err()
            .contains("unclosed")
    );
    assert!(
        interpolate_env("${A-B}", env)
            .unwrap_err()
            .contains("not a variable")
    );
}

#[test]
fn limits() {
    let mut config = Config::default();
    config.store.engine = Engine::Embedded(EmbeddedSettings {
        oplog_max_entries: 999,
        ..EmbeddedSettings::default()
    });
    config.store.events.max_docs = 0;
    config.store.dead_letters.max_bytes = 4095;
    config.ingest.batch_max_events = 10_001;
    config.ingest.queue_capacity = 10_000;
    config.ingest.max_event_bytes = 63;
    config.stats.topk = 0;
    config.stats.k = f64::NAN;
    config.stats.value_field = "user..id".into();
    config.store.events.indexes = vec!["id".into(), "id".into()];
    let found = problems(&config);
    assert_problem(&found, "store.oplog_max_entries: must be >= 1000 (got 999)");
    assert_problem(&found, "store.events.max_docs: must be >= 1 (got 0)");
    assert_problem(
        &found,
        "store.dead_letters.max_bytes: must be >= 4096 (got 4095)",
    );
    assert_problem(
        &found,
        "ingest.batch_max_events: must be in 1..=10000 (got 10001)",
    );
    assert_problem(
        &found,
        "ingest.queue_capacity: must be >= ingest.batch_max_events = 10001 (got 10000)",
    );
    assert_problem(&found, "ingest.max_event_bytes: must be >= 64 (got 63)");
    assert_problem(&found, "stats.topk: must be >= 1 (got 0)");
    assert_problem(&found, "stats.k: must be > 0 (got NaN)");
    assert_problem(
        &found,
        "stats.value_field: \"user..id\" is not a field path (dot-separated names, e.g. \"user.id\")",
    );
    assert_problem(&found, "store.events.indexes[1]: \"id\" is listed twice");
    assert_eq!(found.len(), 10, "{found:#?}");
}

#[test]
fn mongodb_engine_needs_a_mongodb_uri() {
    let mut config = Config::default();
    config.store.engine = Engine::Mongodb(MongoSettings::at(""));
    assert_eq!(
        problems(&config),
        [
            "store.uri: required for engine = \"mongodb\" (e.g. \"mongodb://localhost:27017/?replicaSet=rs0\")"
        ]
    );
    config.store.engine = Engine::Mongodb(MongoSettings::at("postgres://u:secret@h/db"));
    let found = problems(&config);
    assert_eq!(
        found,
        ["store.uri: must start with mongodb:// or mongodb+srv:// (got scheme \"postgres\")"]
    );
    config.store.engine = Engine::Embedded(EmbeddedSettings::at(""));
    assert_eq!(
        problems(&config),
        ["store.path: required for engine = \"embedded\" (a directory, e.g. \"data\")"]
    );
}

/// A key of another engine is refused, saying whose it is; one of no engine lists the keys.
#[test]
fn a_key_of_another_engine_says_which_engine_has_it() {
    assert_eq!(
        toml_err("[store]\nuri = \"mongodb://h/\"\n"),
        "unknown key store.uri (allowed: engine, database, durability, events, dead_letters, \
         path, oplog_max_entries) (from TOML source string) (uri is a key of engine = \
         \"mongodb\")"
    );
    assert_eq!(
        toml_err("[store]\nengine = \"mongodb\"\noplog_max_entries = 5000\n"),
        "unknown key store.oplog_max_entries (allowed: engine, database, durability, events, \
         dead_letters, uri) (from TOML source string) (oplog_max_entries is a key of engine = \
         \"embedded\")"
    );
    let c = with_toml("[store]\nengine = \"mongodb\"\nuri = \"mongodb://h/\"\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.store.engine,
        Engine::Mongodb(MongoSettings::at("mongodb://h/"))
    );
    assert_eq!(
        c.store.database, "tailrace",
        "the shared keys keep their defaults"
    );
    // A nested table's unknown key lists that table's keys only.
    assert_eq!(
        toml_err("[store.events]\nmax_doc = 1\n"),
        "unknown key store.events.max_doc (allowed: max_docs, max_bytes, indexes) \
         (from TOML source string)"
    );
}

#[test]
fn redact_url_leaves_urls_without_password_alone() {
    for url in [
        "mongodb://localhost:27017/?replicaSet=rs0",
        "mongodb://user@host/db",
        "mongodb://host/db?authSource=a@b",
        "not a url",
    ] {
        assert_eq!(redact_url(url), url);
    }
    assert_eq!(
        redact_url("mongodb+srv://u:p@cluster/x"),
        "mongodb+srv://u:***@cluster/x"
    );
}

#[test]
fn every_load_error_is_one_line() {
    let inputs = [
        "[store]\nenigne = 1\n",
        "[store]\ndurability = \"fast\"\n",
        "[stats]\nperiod = [1, 2]\n",
        "[http]\nlisten = 1\n",
        "sources = 3\n",
        "[[sources]]\nname = \"a\"\n",
        "x = \n",
        "[ingest]\nrollup_fields = \"lang\"\n",
        "[[feeds]]\nname = \"a\"\nkind = \"tailable\"\nfilter = { ops = [\"insert\"], extra = 1 }\n",
    ];
    for input in inputs {
        let message = toml_err(input);
        assert!(
            !message.contains('\n'),
            "{input:?} gave a multi-line message: {message:?}"
        );
        assert!(!message.is_empty(), "{input:?} gave an empty message");
    }
}

fn source(name: &str, kind: SourceKind) -> SourceConfig {
    SourceConfig {
        name: name.into(),
        kind,
        geo: None,
    }
}

fn config_with_source(source: SourceConfig) -> Config {
    Config {
        sources: vec![source],
        ..Config::default()
    }
}

fn config_with_feed(feed: FeedConfig) -> Config {
    Config {
        feeds: vec![feed],
        ..Config::default()
    }
}

#[test]
fn defaults_validate() {
    let config = Config::default();
    assert_eq!(problems(&config), Vec::<String>::new());
    assert_eq!(config.sources.len(), 1, "{:?}", config.sources);
    assert_eq!(config.sources[0].name, "sample");
    match &config.sources[0].kind {
        SourceKind::Synthetic(s) => {
            assert_eq!((s.rate_per_sec, s.seed), (70.0, None));
        }
        other => panic!("the default source is synthetic, got {other:?}"),
    }
    let names: Vec<&str> = config.feeds.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["tail", "changes"]);
}

#[test]
fn reference_file_equals_defaults() {
    let loaded = with_toml(REFERENCE).unwrap_or_else(|e| panic!("reference file: {e}"));
    assert_eq!(loaded, Config::default());
    // Without the defaults layer too: the file alone describes the defaults.
    let alone = Config::from_figment(Figment::from(Toml::string(REFERENCE)))
        .unwrap_or_else(|e| panic!("reference file alone: {e}"));
    assert_eq!(alone, Config::default());
}

#[test]
fn validation_collects_every_problem() {
    let mut config = Config::default();
    config.stats.period = 1;
    config.stats.k = 0.0;
    config.ingest.batch_max_events = 0;
    config.store.events.max_bytes = 100;
    config.sources[0].kind = SourceKind::Synthetic(SyntheticConfig::at(-1.0));
    config.feeds[1].name = "tail".into();
    let found = problems(&config);
    for expected in [
        "stats.period: must be >= 2 (got 1)",
        "stats.k: must be > 0 (got 0)",
        "ingest.batch_max_events: must be in 1..=10000 (got 0)",
        "store.events.max_bytes: must be >= 4096 (got 100)",
        "ingest.max_event_bytes: must be <= store.events.max_bytes = 100 (got 65536): a larger event could never be stored",
        "sources[0].rate_per_sec: must be > 0 (got -1)",
        "feeds[1].name: \"tail\" is used twice (names must be unique)",
    ] {
        assert_problem(&found, expected);
    }
    assert_eq!(found.len(), 7, "{found:#?}");
    let message = config.validate().map_err(|e| e.to_string()).unwrap_err();
    assert_eq!(message, found.join("; "));
    assert!(!message.contains('\n'), "{message:?}");
}

#[test]
fn source_kinds_get_their_defaults_and_only_their_keys() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file(
            "t.toml",
            "[[sources]]\nname = \"w\"\nkind = \"http\"\nurl = \"http://127.0.0.1:1/\"\n\
             [[sources]]\nname = \"f\"\nkind = \"file\"\npath = \"e.ndjson\"\npace = \"timestamps\"\n\
             [[sources]]\nname = \"c\"\nkind = \"command\"\nprogram = \"x\"\n",
        )?;
        let c = Config::load(Some(Path::new("t.toml"))).unwrap_or_else(|e| panic!("{e}"));
        let SourceKind::Http(w) = &c.sources[0].kind else {
            panic!("{:?}", c.sources[0]);
        };
        assert_eq!(w, &HttpConfig::new("http://127.0.0.1:1/"), "http defaults");
        assert_eq!(w.format, HttpFormat::Ndjson);
        let SourceKind::File(f) = &c.sources[1].kind else {
            panic!("{:?}", c.sources[1]);
        };
        assert_eq!(
            f,
            &FileConfig {
                pace: Pace::Timestamps,
                ..FileConfig::new("e.ndjson")
            },
            "file defaults"
        );
        assert_eq!(
            (f.timestamp_field.as_str(), f.speed, f.follow),
            ("created_at", 1.0, false)
        );
        let SourceKind::Command(cmd) = &c.sources[2].kind else {
            panic!("{:?}", c.sources[2]);
        };
        assert!(cmd.restart, "command restarts by default");
        assert_eq!(cmd.reconnect_max_ms, 30_000);
        Ok(())
    });
    // A key of another kind is an unknown key of this one, naming what this kind allows.
    let found = toml_problems(
        "[[sources]]\nname = \"s\"\nkind = \"stdin\"\nfollow = true\n\
         [[sources]]\nname = \"h\"\nkind = \"http\"\nurl = \"http://x/\"\nrestart = false\n",
    );
    assert_eq!(
        found,
        [
            "unknown key sources[0].follow (allowed: name, kind, geo) (from TOML source string)",
            "unknown key sources[1].restart (allowed: name, kind, geo, url, format, headers, \
             connect_timeout_ms, idle_timeout_ms, reconnect_max_ms, events, resume) (from TOML source string)",
        ]
    );
    let found = toml_problems(
        "[[sources]]\nname = \"f\"\nkind = \"file\"\npath = \"e.ndjson.gz\"\nfollow = true\n",
    );
    assert!(
        found
            .iter()
            .any(|m| m.starts_with("sources[0].follow: a .gz file")),
        "{found:?}"
    );
    let found = toml_problems(
        "[[sources]]\nname = \"h\"\nkind = \"http\"\nurl = \"http://x/\"\nheaders = { Authorization = \"Bearer ${TOKEN\" }\n",
    );
    assert!(
        found
            .iter()
            .any(|m| m.starts_with("sources[0].headers.Authorization: has an unclosed ${")),
        "{found:?}"
    );
}

#[test]
fn source_required_fields_per_kind() {
    let cases = [
        (
            "synthetic",
            "sources[0].rate_per_sec: required for kind = \"synthetic\"",
        ),
        ("http", "sources[0].url: required for kind = \"http\""),
        ("file", "sources[0].path: required for kind = \"file\""),
        (
            "command",
            "sources[0].program: required for kind = \"command\"",
        ),
    ];
    for (kind, expected) in cases {
        let found = toml_problems(&format!("[[sources]]\nname = \"s\"\nkind = \"{kind}\"\n"));
        assert_eq!(
            found,
            [format!("{expected} (from TOML source string)")],
            "kind {kind}"
        );
    }
    assert_eq!(
        toml_problems("[[sources]]\nname = \"s\"\nkind = \"stdin\"\n"),
        Vec::<String>::new()
    );
    let rated = FileConfig {
        pace: Pace::Rate,
        ..FileConfig::new("events.ndjson")
    };
    assert_eq!(
        problems(&config_with_source(source("s", SourceKind::File(rated)))),
        ["sources[0].rate_per_sec: required for kind = \"file\" with pace = \"rate\""]
    );
    let unrated = FileConfig {
        rate_per_sec: Some(5.0),
        ..FileConfig::new("events.ndjson")
    };
    assert_eq!(
        problems(&config_with_source(source("s", SourceKind::File(unrated)))),
        ["sources[0].rate_per_sec: only for pace = \"rate\""]
    );
    // And in a second source, from a file.
    let message = toml_err(
        "[[sources]]\nname = \"a\"\nkind = \"stdin\"\n[[sources]]\nname = \"b\"\nkind = \"http\"\n",
    );
    assert_eq!(
        message,
        "sources[1].url: required for kind = \"http\" (from TOML source string)"
    );
    let message = toml_err("[[sources]]\nname = \"a\"\nkind = \"smoke-signals\"\n");
    assert_eq!(
        message,
        "sources[0].kind: \"smoke-signals\" is not one of synthetic, http, file, stdin, \
         command, websocket (from TOML source string)"
    );
}

#[test]
fn source_values_are_checked() {
    let http = HttpConfig {
        headers: BTreeMap::from([
            ("bad name".to_owned(), "v".to_owned()),
            ("x-ok".to_owned(), "a\r\nInjected: 1".to_owned()),
        ]),
        reconnect_max_ms: 5,
        ..HttpConfig::new("ftp://u:secret@x")
    };
    let found = problems(&config_with_source(source("s", SourceKind::Http(http))));
    assert_eq!(
        found,
        [
            "sources[0].url: must start with http:// or https:// (got scheme \"ftp\")",
            "sources[0].headers: \"bad name\" is not a header name",
            "sources[0].headers.x-ok: must not contain line breaks",
            "sources[0].reconnect_max_ms: must be >= 100 (got 5)",
        ]
    );
    assert!(
        !found.iter().any(|p| p.contains("secret")),
        "a password leaked: {found:?}"
    );
    let synthetic = SyntheticConfig {
        burst_probability: 1.5,
        burst_multiplier: 0.5,
        burst_secs: 0,
        ..SyntheticConfig::at(10.0)
    };
    assert_eq!(
        problems(&config_with_source(source(
            "s",
            SourceKind::Synthetic(synthetic)
        ))),
        [
            "sources[0].burst_probability: must be in 0..=1 (got 1.5)",
            "sources[0].burst_multiplier: must be >= 1 (got 0.5)",
            "sources[0].burst_secs: must be >= 1 (got 0)",
        ]
    );
}

#[test]
fn names_are_checked_and_unique() {
    let mut config = Config::default();
    config
        .sources
        .push(source("Bad Name", SourceKind::Stdin(Default::default())));
    config
        .sources
        .push(source("sample", SourceKind::Stdin(Default::default())));
    config.feeds.push(FeedConfig::tailable("", "events"));
    assert_eq!(
        problems(&config),
        [
            "sources[1].name: \"Bad Name\" must match [a-z0-9_-]+",
            "sources[2].name: \"sample\" is used twice (names must be unique)",
            "feeds[2].name: \"\" must match [a-z0-9_-]+",
        ]
    );
}

#[test]
fn feed_fields_per_kind() {
    assert_eq!(
        problems(&config_with_feed(FeedConfig::tailable("t", "rollups"))),
        [
            "feeds[0].collection: \"rollups\" is not a capped collection (allowed: events, dead_letters)"
        ]
    );
    let found =
        toml_problems("[[feeds]]\nname = \"t\"\nkind = \"tailable\"\ncollections = [\"x\"]\n");
    assert_eq!(
        found,
        [
            "unknown key feeds[0].collections (allowed: name, kind, collection) (from TOML source string)"
        ]
    );
    let oplog = FeedConfig {
        name: "o".into(),
        kind: FeedKindConfig::Oplog(OplogFeedConfig(ChangeFeedConfig {
            collections: vec![],
            filter: Some(ChangeFilterConfig {
                ops: vec![ChangeOp::Delete, ChangeOp::Delete],
                key_prefix: Some(String::new()),
            }),
        })),
    };
    assert_eq!(
        problems(&config_with_feed(oplog)),
        [
            "feeds[0].collections: must name at least one collection (e.g. [\"rollups\"])",
            "feeds[0].filter.ops[1]: \"delete\" is listed twice",
            "feeds[0].filter.key_prefix: must not be empty (leave it out to match every key)",
        ]
    );
    let found =
        toml_problems("[[feeds]]\nname = \"o\"\nkind = \"oplog\"\ncollection = \"events\"\n");
    assert_eq!(
        found,
        [
            "unknown key feeds[0].collection (allowed: name, kind, collections, filter) (from TOML source string)"
        ]
    );
}

#[test]
fn kind_defaults_are_filled_in_when_loading() {
    let config = with_toml(
        r#"
        [[sources]]
        name = "web"
        kind = "http"
        url = "https://example.com/stream"
        [[sources]]
        name = "replay"
        kind = "file"
        path = "events.ndjson"
        [[feeds]]
        name = "t"
        kind = "tailable"
        [[feeds]]
        name = "o"
        kind = "oplog"
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Any [[sources]] / [[feeds]] replaces the default lists.
    assert_eq!(config.sources.len(), 2, "{:?}", config.sources);
    assert!(
        matches!(&config.sources[0].kind, SourceKind::Http(h) if h.format == HttpFormat::Ndjson),
        "{:?}",
        config.sources[0]
    );
    assert!(
        matches!(&config.sources[1].kind, SourceKind::File(f) if f.pace == Pace::Fast),
        "{:?}",
        config.sources[1]
    );
    assert_eq!(config.feeds.len(), 2, "{:?}", config.feeds);
    assert_eq!(config.feeds[0], FeedConfig::tailable("t", "events"));
    assert_eq!(
        config.feeds[1].kind,
        FeedKindConfig::Oplog(OplogFeedConfig(ChangeFeedConfig {
            collections: vec!["rollups".into()],
            filter: None,
        }))
    );
}

#[test]
fn redacted_hides_secrets_only() {
    let mut config = Config::default();
    config.store.engine = Engine::Mongodb(MongoSettings::at(
        "mongodb://admin:s3cr%40t@db1:27017,db2:27017/?replicaSet=rs0&w=majority",
    ));
    let http = HttpConfig {
        headers: BTreeMap::from([("authorization".to_owned(), "Bearer abc".to_owned())]),
        ..HttpConfig::new("https://bot:tok@example.com/stream?user=a@b")
    };
    config.sources.push(source("web", SourceKind::Http(http)));
    let redacted = config.redacted();
    assert_eq!(
        redacted.store.engine,
        Engine::Mongodb(MongoSettings::at(
            "mongodb://admin:***@db1:27017,db2:27017/?replicaSet=rs0&w=majority"
        ))
    );
    let SourceKind::Http(h) = &redacted.sources[1].kind else {
        panic!("{:?}", redacted.sources[1]);
    };
    assert_eq!(h.url, "https://bot:***@example.com/stream?user=a@b");
    assert_eq!(h.headers["authorization"], "***");
    let printed = serde_json::to_string(&redacted).unwrap();
    for secret in ["s3cr", "tok@", "Bearer"] {
        assert!(!printed.contains(secret), "{secret:?} in {printed}");
    }
    // The original is untouched, and everything else is the same.
    let SourceKind::Http(h) = &config.sources[1].kind else {
        panic!("{:?}", config.sources[1]);
    };
    assert_eq!(h.headers["authorization"], "Bearer abc");
    let mut restored = redacted.clone();
    restored.store.engine = config.store.engine.clone();
    restored.sources[1] = config.sources[1].clone();
    assert_eq!(restored, config);
}

#[test]
fn prints_flat_tables_and_reads_them_back() {
    let mut config = Config::default();
    config.sources.push(source(
        "web",
        SourceKind::Http(HttpConfig::new("https://example.com/s")),
    ));
    config
        .sources
        .push(source("in", SourceKind::Stdin(Default::default())));
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(json["store"]["engine"], serde_json::json!("embedded"));
    assert_eq!(json["sources"][1]["kind"], serde_json::json!("http"));
    assert_eq!(
        json["sources"][1]["url"],
        serde_json::json!("https://example.com/s")
    );
    assert_eq!(
        json["sources"][2],
        serde_json::json!({"name": "in", "kind": "stdin"}),
        "a kind without settings prints as its name"
    );
    assert_eq!(
        json["feeds"][0],
        serde_json::json!({"name": "tail", "kind": "tailable", "collection": "events"})
    );
    let back = Config::from_figment(Figment::from(Serialized::defaults(&config)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, config, "printed and read back");
    let text = toml::to_string_pretty(&config).unwrap();
    let back = Config::from_figment(Figment::from(Toml::string(&text)))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, config, "as TOML, as check-config prints it");
}

#[test]
fn stats_fields_that_the_rollups_also_write_are_refused() {
    // The poison pill of issue 11: with value_field = "count" every event's rollup update did
    // `$inc count` then `$set count`; one non-numeric count stopped ingestion for good.
    let found = toml_problems("[stats]\nvalue_field = \"count\"\n");
    assert_eq!(
        found,
        [
            "stats.value_field: \"count\" collides with `count`, the rollup's event counter, in each source:<name> rollup (both are written on every event); choose another field (from TOML source string)"
        ]
    );
    let found = toml_problems("[stats]\ntopk_field = \"_tailrace.source\"\n");
    assert!(
        found[0].starts_with("stats.topk_field: \"_tailrace.source\" collides with `_tailrace`"),
        "{found:?}"
    );
    let found = toml_problems("[stats]\nvalue_field = \"meta.len\"\ntopk_field = \"meta\"\n");
    assert!(
        found[0].starts_with("stats.topk_field: \"meta\" and stats.value_field \"meta.len\" nest"),
        "{found:?}"
    );
    // Side by side, or the same field for both, is fine.
    assert!(
        toml_problems("[stats]\nvalue_field = \"count_x\"\ntopk_field = \"meta.tags\"\n")
            .is_empty()
    );
    assert!(toml_problems("[stats]\nvalue_field = \"n\"\ntopk_field = \"n\"\n").is_empty());
}

/// Paths that name a `$`-prefixed segment are refused, each with a one-line error that names
/// the key (events keep such fields; configuration cannot address them).
#[test]
fn dollar_prefixed_paths_are_one_line_errors_naming_the_key() {
    let ws = "[[sources]]\nname = \"jet\"\nkind = \"websocket\"\nurl = \"ws://127.0.0.1:1/s\"\n";
    let file =
        "[[sources]]\nname = \"f\"\nkind = \"file\"\npath = \"x.ndjson\"\npace = \"timestamps\"\n";
    let http = "[[sources]]\nname = \"h\"\nkind = \"http\"\nurl = \"http://x/\"\n";
    for (toml, key) in [
        (
            "[store.events]\nindexes = [\"wiki\", \"$schema\"]\n".to_owned(),
            "store.events.indexes[1]",
        ),
        (
            "[ingest]\nrollup_fields = [\"meta.$dt\"]\n".to_owned(),
            "ingest.rollup_fields[0]",
        ),
        (
            "[stats]\nvalue_field = \"$len\"\n".to_owned(),
            "stats.value_field",
        ),
        (
            "[stats]\ntopk_field = \"commit.record.$type\"\n".to_owned(),
            "stats.topk_field",
        ),
        (
            format!("{ws}resume = {{ field = \"$cursor\", param = \"cursor\" }}\n"),
            "sources[0].resume.field",
        ),
        (
            format!("{file}timestamp_field = \"meta.$dt\"\n"),
            "sources[0].timestamp_field",
        ),
        (
            format!("{http}resume = {{ field = \"$seq\", param = \"since\" }}\n"),
            "sources[0].resume.field",
        ),
        (
            format!("{http}geo = {{ country = \"place.$cc\" }}\n"),
            "sources[0].geo.country",
        ),
    ] {
        let err = toml_err(&toml);
        assert_eq!(
            err.lines().count(),
            1,
            "{key}: expected one line, got {err:?}"
        );
        assert!(
            err.starts_with(&format!("{key}: ")) && err.contains("starts with $"),
            "{key}: expected the key first and why, got {err:?}"
        );
    }
}

#[test]
fn sse_event_names_are_checked() {
    let http = |extra: &str| {
        format!("[[sources]]\nname = \"h\"\nkind = \"http\"\nurl = \"http://x/\"\n{extra}")
    };
    let c = with_toml(&http(
        "format = \"sse\"\nevents = [\"update\", \"status.update\"]\n",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    match &c.sources[0].kind {
        SourceKind::Http(h) => assert_eq!(h.events, ["update", "status.update"]),
        other => panic!("not http: {other:?}"),
    }
    let c = with_toml(&http("format = \"sse\"\n")).unwrap_or_else(|e| panic!("{e}"));
    match &c.sources[0].kind {
        SourceKind::Http(h) => assert_eq!(h.events, ["message"], "the default"),
        other => panic!("not http: {other:?}"),
    }
    assert_eq!(
        toml_err(&http("events = [\"update\"]\n")),
        "sources[0].events: only for format = \"sse\" (event names are an SSE notion) (from TOML source string)"
    );
    assert_eq!(
        toml_err(&http("format = \"sse\"\nevents = []\n")),
        "sources[0].events: must name at least one event type (\"message\" for events without `event:`) (from TOML source string)"
    );
    assert_eq!(
        toml_err(&http("format = \"sse\"\nevents = [\"ok\", \"a\\nb\"]\n")),
        "sources[0].events[1]: \"a\\nb\" is not an event name (1-256 bytes, no line break or NUL) (from TOML source string)"
    );
}

#[test]
fn ndjson_resume_is_checked() {
    let http = |extra: &str| {
        format!("[[sources]]\nname = \"h\"\nkind = \"http\"\nurl = \"http://x/\"\n{extra}")
    };
    let c = with_toml(&http(
        "resume = { field = \"meta.seq\", param = \"since\" }\n",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    match &c.sources[0].kind {
        SourceKind::Http(h) => {
            let r = h.resume.as_ref().expect("resumes from a cursor");
            assert_eq!((r.field.as_str(), r.param.as_str()), ("meta.seq", "since"));
        }
        other => panic!("not http: {other:?}"),
    }
    let c = with_toml(&http("")).unwrap_or_else(|e| panic!("{e}"));
    match &c.sources[0].kind {
        SourceKind::Http(h) => assert_eq!(h.resume, None, "the default"),
        other => panic!("not http: {other:?}"),
    }
    assert_eq!(
        toml_err(&http(
            "format = \"sse\"\nresume = { field = \"n\", param = \"since\" }\n"
        )),
        "sources[0].resume: only for format = \"ndjson\" (SSE resumes by Last-Event-ID on its own) (from TOML source string)"
    );
    assert_eq!(
        toml_err(&http("resume = { field = \"\", param = \"since\" }\n")),
        "sources[0].resume.field: \"\" is not a field path (dot-separated names, e.g. \"user.id\") (from TOML source string)"
    );
    assert_eq!(
        toml_err(&http("resume = { field = \"n\", param = \"\" }\n")),
        "sources[0].resume.param: must not be empty (the query parameter that carries the cursor, e.g. \"since\") (from TOML source string)"
    );
    let err = toml_err(&http(
        "resume = { field = \"n\", param = \"since\", after = 3 }\n",
    ));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("unknown key sources[0].resume.after "),
        "an unknown key is refused by its dotted key: {err}"
    );
}

/// Every ready-made configuration in `config/examples/` loads, validates and builds its
/// sources (so they never rot), and says what the README promises of it.
#[test]
fn every_example_loads_and_builds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert_eq!(names, ["bluesky.toml", "mastodon.toml", "wikimedia.toml"]);
    for name in names {
        let text = std::fs::read_to_string(dir.join(&name)).unwrap();
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("MASTODON_TOKEN", "token-for-the-test");
            jail.create_file(&name, &text)?;
            let c = Config::load(Some(Path::new(&name))).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(c.sources.len(), 1, "{name}: one source");
            assert!(
                c.sources[0].geo.is_none() && c.sources[0].geo_rules().is_some(),
                "{name}: places its events by its stream's geo preset"
            );
            assert!(
                !c.store.events.indexes.is_empty() && !c.ingest.rollup_fields.is_empty(),
                "{name}: sets indexes and rollup fields"
            );
            let stem = name.trim_end_matches(".toml");
            assert_eq!(
                c.store.engine,
                Engine::Embedded(EmbeddedSettings::at(Path::new("data").join(stem))),
                "{name}: its own data directory"
            );
            assert_eq!(
                c.sources[0].name, stem,
                "{name}: the source is named after the stream"
            );
            let (kind, url) = match &c.sources[0].kind {
                SourceKind::Http(h) => {
                    assert_eq!(h.format, HttpFormat::Sse, "{name}");
                    ("http", h.url.clone())
                }
                SourceKind::Websocket(w) => ("websocket", w.url.clone()),
                other => panic!("{name}: unexpected kind {other:?}"),
            };
            match stem {
                "wikimedia" => {
                    assert_eq!(
                        (kind, url.as_str()),
                        (
                            "http",
                            "https://stream.wikimedia.org/v2/stream/recentchange"
                        )
                    );
                    assert_eq!(c.stats.topk_field, "wiki");
                    for f in ["wiki", "user", "type"] {
                        assert!(c.store.events.indexes.iter().any(|i| i == f), "{f}");
                    }
                }
                "bluesky" => {
                    assert_eq!(kind, "websocket");
                    assert!(
                        url.contains("wantedCollections=app.bsky.feed.post"),
                        "{url}"
                    );
                    let SourceKind::Websocket(w) = &c.sources[0].kind else {
                        unreachable!()
                    };
                    let r = w.resume.as_ref().expect("resumes from a cursor");
                    assert_eq!((r.field.as_str(), r.param.as_str()), ("time_us", "cursor"));
                }
                "mastodon" => {
                    let SourceKind::Http(h) = &c.sources[0].kind else {
                        unreachable!()
                    };
                    assert_eq!(h.events, ["update"]);
                    assert_eq!(h.headers["Authorization"], "Bearer ${MASTODON_TOKEN}");
                    assert_eq!(c.stats.topk_field, "tags");
                }
                other => panic!("no expectations for {other}"),
            }
            let built = crate::source::build(&c.sources, c.ingest.max_event_bytes as usize)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(built[0].kind(), kind);
            Ok(())
        });
    }
}

/// `config/ferretdb.toml` loads and asks only for what FerretDB serves: the MongoDB engine, no
/// `changes` feed (no change streams there), no long-tail rollup field.
#[test]
fn the_ferretdb_config_loads_and_asks_for_no_change_stream() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/ferretdb.toml");
    let text = std::fs::read_to_string(path).unwrap();
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("ferretdb.toml", &text)?;
        let c = Config::load(Some(Path::new("ferretdb.toml"))).unwrap();
        assert_eq!(c.store.engine.name(), "mongodb");
        let kinds: Vec<&str> = c.feeds.iter().map(|f| f.kind()).collect();
        assert_eq!(kinds, ["tailable", "oplog"]);
        assert!(!c.ingest.rollup_fields.iter().any(|f| f == "hashtags"));
        Ok(())
    });
}

/// A source's `geo` is read beside its kind's keys, whatever the kind; each bad value is one
/// line naming its key and what is allowed; printed, it reads back the same.
#[test]
fn geo_is_a_key_of_every_source_kind() {
    use crate::geo::GeoConfig;
    let stdin = "[[sources]]\nname = \"in\"\nkind = \"stdin\"\n";
    let c = with_toml(&format!(
        "{stdin}geo = {{ point = \"coordinates\", place = \"place.bounding_box\", country = \"place.country_code\", language = \"lang\" }}\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let twitter = GeoConfig {
        point: Some("coordinates".into()),
        place: Some("place.bounding_box".into()),
        country: Some("place.country_code".into()),
        language: Some("lang".into()),
    };
    assert_eq!(c.sources[0].geo.as_ref(), Some(&twitter));
    let c = with_toml(&format!("{stdin}geo = {{ language = \"lang\" }}\n")).unwrap();
    assert_eq!(
        c.sources[0].geo,
        Some(GeoConfig {
            language: Some("lang".into()),
            ..GeoConfig::default()
        }),
        "every key optional"
    );

    for (geo, expected) in [
        (
            "geo = { pont = \"coordinates\" }",
            "unknown key sources[0].geo.pont (allowed: point, place, country, language) (from TOML source string)",
        ),
        (
            "geo = \"coordinates\"",
            "sources[0].geo: expected a table, found string \"coordinates\" (from TOML source string)",
        ),
        (
            "geo = { point = 3 }",
            "sources[0].geo.point: expected a string, found integer 3 (from TOML source string)",
        ),
        (
            "geo = { language = \"\" }",
            "sources[0].geo.language: \"\" is not a field path (dot-separated names, e.g. \"user.id\") (from TOML source string)",
        ),
        (
            "geo = { place = \"place..bounding_box\" }",
            "sources[0].geo.place: \"place..bounding_box\" is not a field path (dot-separated names, e.g. \"user.id\") (from TOML source string)",
        ),
    ] {
        assert_eq!(toml_err(&format!("{stdin}{geo}\n")), expected, "{geo}");
    }
    // Feeds take no `geo`.
    let err = toml_err("[[feeds]]\nname = \"t\"\nkind = \"tailable\"\ngeo = {}\n");
    assert!(
        err.starts_with("unknown key feeds[0].geo (allowed: name, kind, collection)"),
        "{err}"
    );

    // From the environment too, with the rest of the table.
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env(
            "TAILRACE_SOURCES",
            "[{ name = \"in\", kind = \"stdin\", geo = { country = \"cc\" } }]",
        );
        let c = Config::load(None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.sources[0].geo.as_ref().and_then(|g| g.country.as_deref()),
            Some("cc")
        );
        Ok(())
    });

    let mut config = Config::default();
    let mut with_geo = source("in", SourceKind::Stdin(Default::default()));
    with_geo.geo = Some(twitter);
    config.sources.push(with_geo);
    let mut none = source("off", SourceKind::Stdin(Default::default()));
    none.geo = Some(GeoConfig::default());
    config.sources.push(none);
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(json["sources"][1]["geo"]["point"], "coordinates");
    assert_eq!(json["sources"][2]["geo"], serde_json::json!({}));
    assert!(
        json["sources"][0].get("geo").is_none(),
        "no geo, none printed"
    );
    let text = toml::to_string_pretty(&config).unwrap();
    let back = Config::from_figment(Figment::from(Toml::string(&text)))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, config, "as TOML, as check-config prints it");
}

/// A source without `geo` gets its stream's preset, if tailrace knows the stream; `geo = {}`
/// turns the preset off; the ingester is given the rules of every source that has some.
#[test]
fn geo_presets_fill_in_only_where_no_geo_is_set() {
    use crate::geo::GeoConfig;
    let wiki = "[[sources]]\nname = \"wiki\"\nkind = \"http\"\nurl = \"https://stream.wikimedia.org/v2/stream/recentchange\"\nformat = \"sse\"\n";
    let file = "[[sources]]\nname = \"f\"\nkind = \"file\"\npath = \"x.ndjson\"\n";
    let c = with_toml(&format!("{wiki}{file}")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.sources[0].geo, None, "nothing set ...");
    let preset = c.sources[0].geo_rules();
    assert_eq!(
        preset.as_ref().and_then(|g| g.language.as_deref()),
        Some("meta.domain"),
        "... so the preset: {preset:?}"
    );
    assert_eq!(c.sources[1].geo_rules(), None, "a file has no preset");
    let options = crate::pipeline::parts::ingest_options(&c);
    assert_eq!(
        options.geo.keys().collect::<Vec<_>>(),
        ["wiki"],
        "the ingester gets the rules of the sources that have some"
    );

    let c = with_toml(&format!("{wiki}geo = {{}}\n")).unwrap();
    assert_eq!(
        c.sources[0].geo_rules(),
        Some(GeoConfig::default()),
        "turned off"
    );
    let c = with_toml(&format!("{wiki}geo = {{ country = \"cc\" }}\n")).unwrap();
    assert_eq!(
        c.sources[0].geo_rules().and_then(|g| g.language),
        None,
        "a geo of one's own replaces the preset whole"
    );
    assert!(
        Config::default().sources[0].geo_rules().is_some(),
        "the default synthetic source has a preset"
    );
}
