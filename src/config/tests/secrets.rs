//! A value that came from `"${VAR}"` is never echoed in an error: the variable is named
//! instead (a password in a URL stays out of `throttle check`'s output and the logs).

use super::*;

const SECRET: &str = "s3cr3t-P4ss";

/// Every key that takes `"${VAR}"`, with a value that is refused, for each of several
/// malformed values holding the secret: the error names the variable, never the value.
#[test]
fn an_error_names_the_variable_not_its_value() {
    let values = [
        format!("http://u:{SECRET}@h:1 x"),
        format!("redis://u:{SECRET}@h:1/x y"),
        format!("{SECRET} with space"),
        format!("/nonexist/{SECRET}/f"),
        format!("postgres://u:{SECRET}@"),
        format!("ftp://u:{SECRET}@h/"),
    ];
    let configs = [
        "[tracing]\notlp_endpoint = \"${X}\"\n",
        "[server]\naccess_log = \"${X}\"\n",
        "[auth.jwt]\nalgorithms = [\"RS256\"]\njwks_url = \"${X}\"\ndefault_tier = \"free\"\n[tiers.free]\nkey = { per_minute = 1 }\n",
        "[server]\ncheck_token = \"${X}\"\n",
        "[store]\nbackend = \"redis\"\nurl = \"${X}\"\n",
        "[database]\nurl = \"${X}\"\n",
    ];
    let mut refused = 0;
    for value in &values {
        let env = |var: &str| match var {
            "X" => Ok(value.clone()),
            _ => Err(std::env::VarError::NotPresent),
        };
        for config in configs {
            if let Err(e) = parse_env("f.toml", &with_route(config), &env) {
                refused += 1;
                let shown = e.to_string();
                assert!(
                    !shown.contains(SECRET),
                    "{config} echoed the value: {shown}"
                );
                assert!(
                    shown.contains("${X}"),
                    "{config} names the variable: {shown}"
                );
            }
        }
    }
    // otlp_endpoint, access_log and jwks_url refuse every value, check_token some.
    assert!(refused >= 3 * values.len(), "{refused}");
    // A literal value is still quoted, so the operator sees what was written.
    let e = parse_env(
        "f.toml",
        &with_route("[tracing]\notlp_endpoint = \"not a url\"\n"),
        &|_: &str| Err(std::env::VarError::NotPresent),
    )
    .unwrap_err();
    assert!(e.to_string().contains("\"not a url\""), "{e}");
}
