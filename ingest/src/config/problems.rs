//! The problems a check of the configuration collects ([`Problems`]), shared by the rules of
//! the whole file (`validate.rs`) and each source and feed kind's own checks, so that every
//! broken rule is reported at once with its dotted key.

use std::collections::BTreeSet;
use std::fmt;

/// Validation problems: (dotted key, message), in the order they were found.
#[derive(Default, Debug)]
pub struct Problems(Vec<(String, String)>);

impl Problems {
    /// A problem with the value at `key`.
    pub fn push(&mut self, key: impl fmt::Display, message: impl fmt::Display) {
        self.0.push((key.to_string(), message.to_string()));
    }

    /// `value` must be at least `min`.
    pub fn at_least(&mut self, key: &str, value: u64, min: u64) {
        if value < min {
            self.push(key, format!("must be >= {min} (got {value})"));
        }
    }

    /// A dotted field path: non-empty segments, not starting with `$`.
    pub fn field_path(&mut self, key: &str, path: &str) {
        if let Err(e) = store::update::check_path(path) {
            self.push(key, e);
        }
    }

    /// A list of dotted field paths, none twice.
    pub fn field_paths(&mut self, key: &str, paths: &[String]) {
        let mut seen = BTreeSet::new();
        for (i, path) in paths.iter().enumerate() {
            self.field_path(&format!("{key}[{i}]"), path);
            if !seen.insert(path) {
                self.push(format!("{key}[{i}]"), format!("{path:?} is listed twice"));
            }
        }
    }

    /// `[a-z0-9_-]+`, unique among `names`.
    pub(super) fn name(&mut self, key: &str, name: &str, names: &mut BTreeSet<String>) {
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !valid {
            self.push(key, format!("{name:?} must match [a-z0-9_-]+"));
        } else if !names.insert(name.to_owned()) {
            self.push(
                key,
                format!("{name:?} is used twice (names must be unique)"),
            );
        }
    }

    /// Every problem so far, in order, leaving none.
    pub(super) fn take(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.0)
    }
}

/// The scheme of a URL for messages, without echoing the rest (it may hold a password).
pub fn scheme_of(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, _)) => format!("scheme {scheme:?}"),
        None => "no scheme".to_owned(),
    }
}
