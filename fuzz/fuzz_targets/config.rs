//! The config loader (`ingest::config::Config::from_figment`) on a TOML file layered on the
//! defaults, as `tailrace --config FILE` loads it (without the environment, so runs repeat).
//!
//! Input: the file's text. Properties:
//! - an error is at least one problem, each one line (no CR or LF: the CLI prints one line
//!   per problem, and logs are line-based), and the whole message is one line;
//! - no error contains the value of a header (`sources[*].headers`: tokens, API keys), nor a
//!   part of one of 8 characters or more (4 of them letters or digits). A match can be chance (a value that happens to
//!   spell a key name), so it is confirmed on a second file where only the header values
//!   changed (each letter and digit shifted by one): an error that follows the change echoes
//!   the value;
//! - a configuration that loads, printed as TOML (what `check-config` shows) and loaded
//!   again, is the same configuration.
#![no_main]

use std::sync::OnceLock;

use figment::Figment;
use figment::providers::{Format, Toml};
use ingest::config::{Config, ConfigError};
use libfuzzer_sys::fuzz_target;

fn load(text: &str) -> Result<Config, ConfigError> {
    // The defaults are serialized once (they are the same for every input).
    static DEFAULTS: OnceLock<Figment> = OnceLock::new();
    let defaults = DEFAULTS.get_or_init(|| Figment::from(Config::defaults()));
    Config::from_figment(defaults.clone().merge(Toml::string(text)))
}

/// Every scalar under `v` (a header value, or the whole `headers` when it is not a table),
/// as text.
fn leaves(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::String(s) => out.push(s.clone()),
        toml::Value::Integer(i) => out.push(i.to_string()),
        toml::Value::Float(f) => out.push(f.to_string()),
        toml::Value::Datetime(d) => out.push(d.to_string()),
        toml::Value::Boolean(_) => {}
        toml::Value::Array(items) => items.iter().for_each(|i| leaves(i, out)),
        toml::Value::Table(t) => t.values().for_each(|i| leaves(i, out)),
    }
}

/// Every key and scalar of `v`, as text.
fn texts(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::Table(t) => t.iter().for_each(|(k, v)| {
            out.push(k.clone());
            texts(v, out);
        }),
        toml::Value::Array(items) => items.iter().for_each(|i| texts(i, out)),
        other => leaves(other, out),
    }
}

/// The headers of every `[[sources]]` table, mutably.
fn headers_of(doc: &mut toml::Table) -> Vec<&mut toml::Value> {
    match doc.get_mut("sources") {
        Some(toml::Value::Array(sources)) => sources
            .iter_mut()
            .filter_map(|s| match s {
                toml::Value::Table(t) => t.get_mut("headers"),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn shift_text(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'z' => 'a',
            'Z' => 'A',
            '9' => '0',
            'a'..='y' | 'A'..='Y' | '0'..='8' => char::from(c as u8 + 1),
            c => c,
        })
        .collect()
}

/// The same value with each letter and digit shifted by one (types kept).
fn shifted(v: &toml::Value) -> toml::Value {
    match v {
        toml::Value::String(s) => toml::Value::String(shift_text(s)),
        toml::Value::Integer(i) => shift_text(&i.to_string())
            .parse()
            .map_or_else(|_| v.clone(), toml::Value::Integer),
        toml::Value::Array(items) => toml::Value::Array(items.iter().map(shifted).collect()),
        toml::Value::Table(t) => {
            toml::Value::Table(t.iter().map(|(k, v)| (k.clone(), shifted(v))).collect())
        }
        other => other.clone(),
    }
}

/// Pieces of 8 characters of `secret` (all of it when shorter but at least 4), with at least
/// 4 letters or digits, found in `text`.
fn echoed(secret: &str, text: &str) -> Vec<String> {
    let chars: Vec<char> = secret.chars().collect();
    if chars.len() < 4 {
        return Vec::new();
    }
    chars
        .windows(8.min(chars.len()))
        // A piece must carry information to count as an echo: a run of replacement characters
        // or punctuation matches by chance (and the shift could not confirm it anyway).
        .filter(|w| w.iter().filter(|c| c.is_ascii_alphanumeric()).count() >= 4)
        .map(|w| w.iter().collect::<String>())
        .filter(|w| text.contains(w.as_str()))
        .collect()
}

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    match load(&text) {
        Err(e) => {
            let problems = e.problems();
            assert!(!problems.is_empty(), "an error without a problem: {e:?}");
            for p in &problems {
                assert!(!p.is_empty(), "an empty problem in {problems:?}");
                assert!(
                    !p.contains(['\n', '\r']),
                    "a problem on several lines: {p:?}"
                );
            }
            let message = e.to_string();
            assert!(
                !message.contains(['\n', '\r']),
                "an error on several lines: {message:?}"
            );

            let Ok(mut doc) = text.parse::<toml::Table>() else {
                return;
            };
            let mut secrets = Vec::new();
            for h in headers_of(&mut doc) {
                leaves(h, &mut secrets);
            }
            // What the rest of the file says: a piece found there may be echoed from there (the
            // fuzzer learns to copy the very strings this check looks for).
            // Header names stay (an error names them), their values go.
            let mut rest = doc.clone();
            for h in headers_of(&mut rest) {
                *h = match h {
                    toml::Value::Table(t) => toml::Value::Table(
                        t.keys()
                            .map(|k| (k.clone(), toml::Value::Boolean(true)))
                            .collect(),
                    ),
                    _ => toml::Value::Boolean(true),
                };
            }
            let mut elsewhere = Vec::new();
            texts(&toml::Value::Table(rest), &mut elsewhere);
            let only_in_headers = |piece: &str| !elsewhere.iter().any(|t| t.contains(piece));
            let suspects: Vec<(String, String)> = secrets
                .iter()
                .flat_map(|s| echoed(s, &message).into_iter().map(move |w| (s.clone(), w)))
                .filter(|(_, w)| only_in_headers(w) && only_in_headers(&shift_text(w)))
                .collect();
            if suspects.is_empty() {
                return;
            }
            for h in headers_of(&mut doc) {
                *h = shifted(h);
            }
            let Ok(changed) = toml_print::to_string(&doc) else {
                return;
            };
            let Err(again) = load(&changed) else {
                return;
            };
            let again = again.to_string();
            for (secret, piece) in suspects {
                let moved = shift_text(&piece);
                assert!(
                    moved == piece || !again.contains(&moved),
                    "the error echoes header value {secret:?} ({piece:?}): {message}"
                );
            }
        }
        Ok(config) => {
            let printed = toml_print::to_string(&config).expect("a loaded configuration prints as TOML");
            match load(&printed) {
                Ok(again) => assert_eq!(
                    again, config,
                    "printed and loaded again, it differs:\n{printed}"
                ),
                Err(e) => panic!("printed, it does not load again: {e}\n{printed}"),
            }
        }
    }
});
