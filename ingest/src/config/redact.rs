//! A copy of the configuration that is safe to print (`tailrace check-config`, logs): secrets
//! replaced with `***`.

use super::Config;

/// The replacement for secrets in [`Config::redacted`].
pub const REDACTED: &str = "***";

impl Config {
    /// A copy safe to print: URL passwords (`store.uri`, source URLs) and header values
    /// replaced with `***`; each source kind hides its own secrets.
    pub fn redacted(&self) -> Config {
        let mut config = self.clone();
        config.store.uri = redact_url(&config.store.uri);
        for source in &mut config.sources {
            source.settings_mut().redact();
        }
        config
    }
}

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
