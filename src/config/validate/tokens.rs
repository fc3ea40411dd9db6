//! `[server]` tokens: `check_token` (or `check_token_file`) and the admin token
//! (`$THROTTLE_ADMIN_TOKEN` or `admin_token_file`). Each is refused when it could not be
//! sent as `Authorization: Bearer <token>`, when it is shorter than `MIN_TOKEN` bytes, or
//! when it is a placeholder this repository ships; errors name the key or the variable,
//! never the value.

use super::*;

/// The longest token accepted.
pub(super) const MAX_TOKEN: usize = 4096;

/// The shortest token accepted: a shorter one is guessed.
pub(super) const MIN_TOKEN: usize = 16;

/// The environment variable the admin token comes from.
pub(super) const ADMIN_TOKEN_ENV: &str = "THROTTLE_ADMIN_TOKEN";

/// Placeholders in the shipped files (deploy/kubernetes/secret.yaml, docker-compose.yml,
/// the README, CI): a token equal to one (case-insensitively) is refused.
const PLACEHOLDERS: &[&str] = &[
    "REPLACE-ME-admin-token",
    "REPLACE-ME-check-token",
    "change-me",
    "changeme",
    "ci-placeholder",
];

/// What is wrong with `token`, named `what` (a key or a variable), if anything.
pub(super) fn weakness(what: &str, token: &str) -> Option<String> {
    if token.is_empty() {
        Some(format!("{what} must not be empty"))
    } else if !token.bytes().all(|b| b.is_ascii_graphic()) {
        Some(format!("{what} must be visible ASCII without spaces: it is sent as `Authorization: Bearer <token>`"))
    } else if token.len() > MAX_TOKEN {
        Some(format!("{what} is longer than {MAX_TOKEN} bytes"))
    } else if token.len() < MIN_TOKEN {
        Some(format!("{what} is shorter than {MIN_TOKEN} bytes: use a random one, e.g. `openssl rand -hex 32`"))
    } else if PLACEHOLDERS.iter().any(|p| p.eq_ignore_ascii_case(token)) {
        Some(format!("{what} is a placeholder shipped with throttle: set a random one, e.g. `openssl rand -hex 32`"))
    } else {
        None
    }
}

/// `check_token` or `check_token_file` (one of them at most).
pub(super) fn check_token(cx: &Ctx<'_>, s: &ServerFile) -> Result<Option<Secret>, ConfigError> {
    match (&s.check_token, &s.check_token_file) {
        (Some(_), Some(f)) => Err(cx.err(
            f.span(),
            "check_token_file and check_token are both set: use one",
        )),
        (Some(v), None) => {
            let token = env_value(cx, "check_token", v)?;
            match weakness("check_token", &token) {
                // A value from the environment is never echoed: the variable is named.
                Some(msg) if v.get_ref().starts_with("${") => {
                    Err(cx.err(v.span(), format!("{msg} ({})", super::server::shown(v, ""))))
                }
                Some(msg) => Err(cx.err(v.span(), msg)),
                None => Ok(Some(Secret::new(&token))),
            }
        }
        (None, Some(f)) => token_file(cx, "check_token_file", f).map(Some),
        (None, None) => Ok(None),
    }
}

/// The admin token: `$THROTTLE_ADMIN_TOKEN` (set and not empty) or `admin_token_file`,
/// not both (which one a reader of the config would believe is unclear).
pub(super) fn admin_token(cx: &Ctx<'_>, s: &ServerFile) -> Result<Option<Secret>, ConfigError> {
    let env = (cx.env)(ADMIN_TOKEN_ENV).ok().filter(|t| !t.is_empty());
    match (env, &s.admin_token_file) {
        (Some(_), Some(f)) => Err(cx.err(
            f.span(),
            format!("admin_token_file and ${ADMIN_TOKEN_ENV} are both set: use one"),
        )),
        (Some(token), None) => match weakness(&format!("${ADMIN_TOKEN_ENV}"), &token) {
            Some(msg) => Err(ConfigError::file(cx.name, msg)),
            None => Ok(Some(Secret::new(&token))),
        },
        (None, Some(f)) => token_file(cx, "admin_token_file", f).map(Some),
        (None, None) => Ok(None),
    }
}

/// A token file (`key = "path"`): its content without surrounding whitespace (a trailing
/// newline); relative paths are the config file's directory's. An unreadable file or a
/// weak token is an error at the value.
fn token_file(cx: &Ctx<'_>, key: &str, v: &Spanned<String>) -> Result<Secret, ConfigError> {
    let dir = std::path::Path::new(cx.name)
        .parent()
        .unwrap_or(std::path::Path::new(""));
    let path = dir.join(env_value(cx, key, v)?);
    let fail = |msg: String| cx.err(v.span(), format!("{key}: {msg}"));
    let raw = std::fs::read_to_string(&path)
        .map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
    let token = raw.trim();
    if token.is_empty() {
        return Err(fail(format!("{} is empty", path.display())));
    }
    match weakness(&format!("the token in {}", path.display()), token) {
        Some(msg) => Err(fail(msg)),
        None => Ok(Secret::new(token)),
    }
}
