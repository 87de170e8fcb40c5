//! Turning what went wrong into one line per problem: the dotted key (`store.durability`,
//! `sources[0].rate_per_sec`), what was found, what is allowed, and where the value came from
//! (a file or an environment variable).

use std::path::PathBuf;

use figment::error::{Actual, Kind};
use figment::value::Value;
use figment::{Figment, Metadata, Profile, Source};

use super::env::{ENV_METADATA_NAME, env_var_name, is_index};

/// Why the configuration could not be loaded. Every message is one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file given does not exist (figment alone would silently skip it).
    #[error(
        "config file {} does not exist (give the path of an existing TOML file, or none to run on the defaults and TAILRACE_* variables)",
        .path.display()
    )]
    MissingFile {
        /// The path as given.
        path: PathBuf,
    },
    /// The file or an environment variable could not be read into the tree: syntax, unknown
    /// key, wrong type, unknown enum value. One entry per problem.
    #[error("{}", .problems.join("; "))]
    Load {
        /// One-line descriptions, each naming the key and where it came from.
        problems: Vec<String>,
    },
    /// The tree was read but breaks rules ([`super::Config::validate`]), or some `[[sources]]`
    /// / `[[feeds]]` table could not be read (reported with the rules the rest breaks, so one
    /// run shows every problem). One entry per problem.
    #[error("{}", .problems.join("; "))]
    Invalid {
        /// One-line descriptions, each starting with the dotted key.
        problems: Vec<String>,
    },
}

impl ConfigError {
    /// The individual problems (one for [`ConfigError::MissingFile`]).
    pub fn problems(&self) -> Vec<String> {
        match self {
            ConfigError::MissingFile { .. } => vec![self.to_string()],
            ConfigError::Load { problems } | ConfigError::Invalid { problems } => problems.clone(),
        }
    }

    /// Turns a figment error (possibly several chained) into one-line problems.
    pub(super) fn from_figment(figment: &Figment, error: figment::Error) -> ConfigError {
        let problems = error
            .into_iter()
            .map(|e| single_line(&describe_figment_error(figment, &e)))
            .collect();
        ConfigError::Load { problems }
    }
}

/// A problem as one line whatever it quotes: control characters (a line break in a quoted
/// TOML key, which the dotted key shows as it is) are written as escapes (found by fuzzing).
pub(super) fn single_line(problem: &str) -> String {
    if !problem.contains(char::is_control) {
        return problem.to_owned();
    }
    problem
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `store.events.max_docs`, `sources[0].url`: array indices in brackets.
pub(super) fn dotted_key<S: AsRef<str>>(path: &[S]) -> String {
    let mut key = String::new();
    for segment in path {
        let segment = segment.as_ref();
        if !key.is_empty() && is_index(segment) {
            key.push('[');
            key.push_str(segment);
            key.push(']');
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(segment);
        }
    }
    key
}

/// Where a value came from, e.g. `file config/tailrace.toml` or `env TAILRACE_STORE__ENGINE`;
/// `None` for the built-in defaults or when unknown.
fn origin(md: &Metadata, profile: &Profile, path: &[String]) -> Option<String> {
    match &md.source {
        Some(Source::File(file)) => Some(format!("file {}", file.display())),
        Some(Source::Code(_)) => None,
        Some(Source::Custom(custom)) => Some(format!("{} {custom}", md.name)),
        None if md.name == ENV_METADATA_NAME && !path.is_empty() => {
            Some(format!("env {}", md.interpolate(profile, path)))
        }
        None if md.name == ENV_METADATA_NAME => Some("environment variables".to_owned()),
        None => Some(md.name.to_string()),
        // `Source` is non-exhaustive.
        Some(_) => Some(md.name.to_string()),
    }
}

/// Where the value that a figment error is about came from.
pub(super) fn error_origin(error: &figment::Error) -> Option<String> {
    let profile = error.profile.clone().unwrap_or_default();
    origin(error.metadata.as_ref()?, &profile, &error.path)
}

/// Where the value at `path` (or, if it is absent, its nearest present parent) came from.
pub(super) fn value_origin(figment: &Figment, path: &[String]) -> Option<String> {
    (1..=path.len()).rev().find_map(|len| {
        let value = find_value(figment, &path[..len])?;
        let md = figment.get_metadata(value.tag())?;
        let profile = value.tag().profile().unwrap_or_default();
        Some(origin(md, &profile, &path[..len]))
    })?
}

/// Gives an error found after the layers were merged (in a table read by its kind) the
/// metadata of the value it is about, so that it says where that value came from, and gets
/// the hints of an environment variable, as an error of the layered read does.
pub(super) fn with_origin(figment: &Figment, mut error: figment::Error) -> figment::Error {
    if error.metadata.is_none() {
        let value = (1..=error.path.len())
            .rev()
            .find_map(|len| find_value(figment, &error.path[..len]));
        if let Some(value) = value {
            error.metadata = figment.get_metadata(value.tag()).cloned();
            error.profile = value.tag().profile();
        }
    }
    error
}

/// `sources[1].url` back to `["sources", "1", "url"]`.
pub(super) fn key_path(key: &str) -> Vec<String> {
    key.split(['.', '[', ']'])
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Plain words for serde's "expected" strings.
fn expected_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a sequence" => "an array".to_owned(),
        "a map" => "a table".to_owned(),
        e if e.starts_with("struct ") => "a table".to_owned(),
        e => e.to_owned(),
    }
}

/// Plain words for what serde found.
fn actual_words(actual: &Actual) -> String {
    match actual {
        Actual::Bool(v) => format!("boolean {v}"),
        Actual::Unsigned(v) => format!("integer {v}"),
        Actual::Signed(v) => format!("integer {v}"),
        Actual::Float(v) => format!("number {v}"),
        Actual::Char(v) => format!("{:?}", v.to_string()),
        Actual::Str(v) => format!("string {v:?}"),
        Actual::Seq => "an array".to_owned(),
        Actual::Map => "a table".to_owned(),
        Actual::Unit | Actual::Option => "nothing".to_owned(),
        other => other.to_string(),
    }
}

/// What serde found, without its value: for values that may be secrets.
fn actual_kind(actual: &Actual) -> String {
    match actual {
        Actual::Bool(_) => "a boolean".to_owned(),
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer".to_owned(),
        Actual::Float(_) => "a number".to_owned(),
        Actual::Char(_) | Actual::Str(_) => "a string".to_owned(),
        Actual::Bytes(_) => "bytes".to_owned(),
        other => actual_words(other),
    }
}

/// Whether the value at `path` may be a secret (a header value: tokens, API keys), so that an
/// error about it names its type and never its value (found by fuzzing: `X-Api-Key = 1234…`
/// or `headers = "Bearer …"` came back in the error).
fn is_secret(path: &[String]) -> bool {
    path.iter().any(|segment| segment == "headers")
}

/// Comma-separated, as in `a, b, c`.
pub(super) fn list(items: &[&str]) -> String {
    items.join(", ")
}

/// Makes a possibly multi-line message (TOML syntax errors draw a snippet) one line.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        // The snippet: `  |`, `1 | a = `, `  |     ^`.
        .filter(|l| {
            !l.starts_with('|')
                && !l
                    .split_once(" |")
                    .is_some_and(|(n, _)| n.trim().bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    lines.join(": ")
}

/// The value at `path` in the merged configuration.
fn find_value(figment: &Figment, path: &[String]) -> Option<Value> {
    let (first, rest) = path.split_first()?;
    let mut value: Value = figment.find_value(first).ok()?;
    for key in rest {
        value = match value {
            Value::Dict(_, mut dict) => dict.remove(key)?,
            Value::Array(_, mut items) => {
                let index: usize = key.parse().ok()?;
                if index >= items.len() {
                    return None;
                }
                items.swap_remove(index)
            }
            _ => return None,
        };
    }
    Some(value)
}

/// One line: dotted key, what was found, what is allowed, where it came from.
pub(super) fn describe_figment_error(figment: &Figment, error: &figment::Error) -> String {
    let path = &error.path;
    let key = dotted_key(path);
    let secret = is_secret(path);
    let found = |actual: &Actual| {
        if secret {
            actual_kind(actual)
        } else {
            actual_words(actual)
        }
    };
    let mut message = match &error.kind {
        Kind::UnknownField(field, allowed) => {
            let mut full = path.clone();
            if full.last() != Some(field) {
                full.push(field.clone());
            }
            let mut text = format!(
                "unknown key {} (allowed: {})",
                dotted_key(&full),
                list(allowed)
            );
            let from_env = error
                .metadata
                .as_ref()
                .is_some_and(|md| md.name == ENV_METADATA_NAME);
            // TAILRACE_STORE_ENGINE: one `_` where the level separator `__` was meant.
            let meant = allowed.iter().find_map(|a| {
                let rest = field.strip_prefix(a)?.strip_prefix('_')?;
                let mut meant = path[..full.len() - 1].to_vec();
                meant.extend([(*a).to_owned(), rest.to_owned()]);
                Some(meant)
            });
            if let (true, Some(meant)) = (from_env, meant) {
                text.push_str(&format!(
                    " (levels are separated by __: did you mean {}?)",
                    env_var_name(&meant)
                ));
            }
            text
        }
        Kind::UnknownVariant(_, allowed) if secret => {
            format!("{key}: not one of {}", list(allowed))
        }
        Kind::UnknownVariant(found, allowed) => {
            format!("{key}: {found:?} is not one of {}", list(allowed))
        }
        Kind::MissingField(field) => {
            let mut full = path.clone();
            full.push(field.to_string());
            format!("{}: missing (required)", dotted_key(&full))
        }
        Kind::DuplicateField(field) => {
            let mut full = path.clone();
            full.push((*field).to_owned());
            format!("{}: given more than once", dotted_key(&full))
        }
        Kind::InvalidType(actual, expected) => {
            let mut text = format!(
                "{key}: expected {}, found {}",
                expected_words(expected),
                found(actual)
            );
            let from_env = error
                .metadata
                .as_ref()
                .is_some_and(|md| md.name == ENV_METADATA_NAME);
            if from_env && *actual == Actual::Map && expected == "a sequence" {
                text.push_str(&format!(
                    " (an array cannot be set element by element: set {} to the whole array, e.g. '[{{ name = \"a\", kind = \"stdin\" }}]')",
                    env_var_name(path)
                ));
            } else if from_env && expected == "a string" {
                // Environment values are parsed: 123 is a number, true a boolean.
                text.push_str(&format!(
                    " (quote it to keep it a string: {}='\"...\"')",
                    env_var_name(path)
                ));
            }
            text
        }
        Kind::InvalidValue(actual, expected) => format!(
            "{key}: {} is out of range, expected {}",
            found(actual),
            expected_words(expected)
        ),
        Kind::InvalidLength(len, expected) => {
            format!("{key}: {len} items, expected {expected}")
        }
        Kind::Message(text) if key.is_empty() => {
            // Not about a key: the file could not be read or parsed.
            return match error_origin(error) {
                Some(origin) => format!("{origin}: {}", one_line(text)),
                None => one_line(text),
            };
        }
        Kind::Message(text) if secret => format!("{key}: {}", one_line(text)),
        Kind::Message(text) => {
            match find_value(figment, path).and_then(|v| serde_json::to_string(&v).ok()) {
                Some(found) if text.contains("socket address") => format!(
                    "{key}: {found} is not valid: {} (expected ip:port, e.g. 127.0.0.1:9750)",
                    one_line(text)
                ),
                Some(found) => format!("{key}: {found} is not valid: {}", one_line(text)),
                None => format!("{key}: {}", one_line(text)),
            }
        }
        other => {
            let text = one_line(&other.to_string());
            if key.is_empty() {
                text
            } else {
                format!("{key}: {text}")
            }
        }
    };
    if let Some(origin) = error_origin(error) {
        message.push_str(" (from ");
        message.push_str(&origin);
        message.push(')');
    }
    message
}

/// The table an error is inside, when it is a tagged one: a `[[sources]]` / `[[feeds]]` table
/// (`kind`) or `[store]` (`engine`).
pub(super) struct Tagged<'a> {
    /// The key that names the table's kind (`kind`, `engine`).
    pub key: &'a str,
    /// Its value (`http`, `mongodb`).
    pub value: &'a str,
    /// The keys every table of the section allows, before the kind's own (`name`, `kind`).
    pub leading: &'a [&'a str],
    /// How many segments of an error's path name the table (`sources.1`: 2, `store`: 1).
    pub depth: usize,
}

/// One line for an error inside a tagged table (the error's path already starts with the
/// table: `sources.1.url`, `store.uri`): like [`describe_figment_error`], but a missing key
/// says which kind requires it, and the allowed keys include the section's own.
pub(super) fn describe_entry_error(
    figment: &Figment,
    error: &figment::Error,
    tagged: Option<&Tagged<'_>>,
) -> String {
    let key = dotted_key(&error.path);
    let origin = || {
        error_origin(error)
            .or_else(|| value_origin(figment, &error.path))
            .map(|o| format!(" (from {o})"))
            .unwrap_or_default()
    };
    match (&error.kind, tagged) {
        (Kind::MissingField(field), Some(t)) => {
            format!(
                "{key}.{field}: required for {} = {:?}{}",
                t.key,
                t.value,
                origin()
            )
        }
        (Kind::UnknownField(field, allowed), Some(t)) => {
            let in_path = error.path.last() == Some(field);
            let at_top = error.path.len() == t.depth + usize::from(in_path);
            // A nested table's own keys (`filter.ops`) are not the section's.
            let mut all = if at_top {
                t.leading.to_vec()
            } else {
                Vec::new()
            };
            all.extend(allowed.iter().copied());
            let full = if in_path {
                key
            } else {
                format!("{key}.{field}")
            };
            format!("unknown key {full} (allowed: {}){}", list(&all), origin())
        }
        _ => {
            let text = describe_figment_error(figment, error);
            if text.contains(" (from ") {
                text
            } else {
                format!("{text}{}", origin())
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use figment::providers::{Format, Toml};

    use super::*;
    use crate::config::Config;

    fn problems(toml: &str) -> Vec<String> {
        let figment = Figment::from(Config::defaults()).merge(Toml::string(toml));
        Config::from_figment(figment).unwrap_err().problems()
    }

    #[test]
    fn errors_about_header_values_never_echo_them() {
        // Found by the config fuzz target: each of these put the value (a token) in the error.
        let source = "[[sources]]\nname = \"h\"\nkind = \"http\"\nurl = \"http://x/\"\n";
        for (headers, secret, says) in [
            (
                "headers = { \"X-Api-Key\" = 123456789012 }",
                "123456789012",
                "sources[0].headers.X-Api-Key: expected a string, found an integer",
            ),
            (
                "headers = \"Bearer sk-live-abcdef0123456789\"",
                "sk-live-abcdef",
                "sources[0].headers: expected a table, found a string",
            ),
            (
                "headers = { Authorization = \"Bearer ${sk-live-abcdef0123}\" }",
                "sk-live-abcdef",
                "sources[0].headers.Authorization: has a ${...} that is not a variable reference",
            ),
        ] {
            let found = problems(&format!("{source}{headers}\n"));
            assert!(
                found.iter().any(|p| p.starts_with(says)),
                "{headers}: expected a problem starting {says:?}, got {found:?}"
            );
            assert!(
                !found.iter().any(|p| p.contains(secret)),
                "{headers}: the secret {secret:?} is in {found:?}"
            );
        }
        // A key with a line break (a quoted TOML key) stays on the problem's one line.
        for toml in [
            format!("{source}headers = {{ \"X-A\\nB\" = \"${{X\" }}\n"),
            "\"a\\nb\" = 1\n".to_owned(),
        ] {
            let found = problems(&toml);
            assert!(
                !found.is_empty() && found.iter().all(|p| !p.contains(['\n', '\r'])),
                "{toml:?}: expected one-line problems, got {found:?}"
            );
            assert!(
                found.iter().any(|p| p.contains("\\n")),
                "{toml:?}: expected the line break escaped in {found:?}"
            );
        }
        // Elsewhere the value is still shown: it helps, and it is no secret.
        let found = problems("[log]\nstatus_interval_secs = \"ten\"\n");
        assert!(
            found.iter().any(|p| p.contains("string \"ten\"")),
            "expected the value in {found:?}"
        );
    }
}
