//! Secrets replaced with `***` in what is printed (`tailrace check-config`, logs):
//! [`super::Config::redacted`] and each source kind use them. The store's own, as an engine's
//! connection string holds one too.

pub use store::redact::{REDACTED, redact_url};
