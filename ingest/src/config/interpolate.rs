//! `${NAME}` in header values: secrets stay in the environment, not in the config file.

/// Replaces `${NAME}` in `value` with what `lookup(NAME)` gives and `$$` with `$`; any other
/// `$` is kept as it is. An unset variable or an unclosed `${` is an error naming it.
pub fn interpolate_env(
    value: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('{') {
            let Some(end) = inner.find('}') else {
                return Err("has an unclosed ${ (write ${NAME}, or $$ for a literal $)".into());
            };
            let name = &inner[..end];
            let valid =
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                // Not echoed: what sits between the braces may be the secret itself, pasted
                // where its variable's name belongs (found by fuzzing).
                return Err(
                    "has a ${...} that is not a variable reference (write ${NAME} with letters, digits and _, or $$ for a literal $)"
                        .into(),
                );
            }
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => return Err(format!("environment variable {name} is not set")),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks the `${NAME}` references of a header value (syntax only: the variables are read
/// when the source starts, so `check-config` does not need the secrets).
pub fn check_env_refs(value: &str) -> Result<(), String> {
    interpolate_env(value, |_| Some(String::new())).map(|_| ())
}
