//! Secrets replaced with `***` in what is printed (`tailrace check-config`, logs): the
//! marker and URL passwords. Here because an engine's connection string holds one
//! ([`crate::EngineSettings::redact`]); the configuration and each source kind use them too.

/// The replacement for secrets in what is printed.
pub const REDACTED: &str = "***";

/// Replaces the password of a URL's userinfo (`scheme://user:password@host`) with `***`.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    // The userinfo ends at the last '@' before the query or fragment.
    let before_query = rest.find(['?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..before_query].rfind('@') else {
        return url.to_owned();
    };
    let Some(colon) = rest[..at].find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}{}",
        &url[..rest_start + colon + 1],
        REDACTED,
        &url[rest_start + at..]
    )
}
