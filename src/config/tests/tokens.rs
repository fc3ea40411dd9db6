//! `[server]` tokens (`check_token`, `check_token_file`, `$THROTTLE_ADMIN_TOKEN`,
//! `admin_token_file`) and the admin and rate-limit listeners' per-client caps.

use super::*;

/// The environment of these tests: `THROTTLE_ADMIN_TOKEN` as given, `V_<value>` naming
/// `<value>` itself.
fn env_with(admin: Option<&'static str>) -> impl Fn(&str) -> Result<String, std::env::VarError> {
    move |var: &str| match (var, admin) {
        ("THROTTLE_ADMIN_TOKEN", Some(t)) => Ok(t.to_string()),
        (v, _) if v.starts_with("V_") => Ok(v.trim_start_matches("V_").replace('_', "-")),
        _ => Err(std::env::VarError::NotPresent),
    }
}

/// A temporary directory holding token files, removed on drop.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(tag: &str, files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("throttle-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, content) in files {
            std::fs::write(dir.join(name), content).unwrap();
        }
        Self(dir)
    }

    fn config(&self) -> String {
        self.0.join("gw.toml").display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Short tokens and the shipped placeholders are refused wherever a token comes from,
/// naming the key or variable at its position and never echoing the value; tokens of 16
/// bytes and more pass.
#[test]
fn weak_tokens_are_refused_by_name() {
    let dir = Dir::new(
        "weak-tokens",
        &[
            ("short", "tiny-token\n"),
            ("placeholder", "REPLACE-ME-admin-token\n"),
            ("good", "a-file-token-0123456789\n"),
        ],
    );
    let name = dir.config();
    let cases: &[(&str, Option<&'static str>, Result<(), &str>)] = &[
        (
            "check_token = \"short-tok\"",
            None,
            Err(":2:15: check_token is shorter than 16 bytes"),
        ),
        (
            "check_token = \"${V_abc}\"",
            None,
            Err(":2:15: check_token is shorter than 16 bytes"),
        ),
        (
            "check_token = \"REPLACE-ME-check-token\"",
            None,
            Err(":2:15: check_token is a placeholder"),
        ),
        (
            "check_token = \"replace-me-CHECK-token\"",
            None,
            Err(":2:15: check_token is a placeholder"),
        ),
        ("check_token = \"check-token-0123456\"", None, Ok(())),
        (
            "check_token_file = \"short\"",
            None,
            Err(":2:20: check_token_file: the token in"),
        ),
        ("check_token_file = \"good\"", None, Ok(())),
        (
            "admin_token_file = \"short\"",
            None,
            Err(":2:20: admin_token_file: the token in"),
        ),
        (
            "admin_token_file = \"placeholder\"",
            None,
            Err(":2:20: admin_token_file: the token in"),
        ),
        ("admin_token_file = \"good\"", None, Ok(())),
        (
            "",
            Some("change-me"),
            Err(": $THROTTLE_ADMIN_TOKEN is shorter than 16 bytes"),
        ),
        (
            "",
            Some("REPLACE-ME-admin-token"),
            Err(": $THROTTLE_ADMIN_TOKEN is a placeholder"),
        ),
        ("", Some("an-admin-token-0123"), Ok(())),
        ("", Some(""), Ok(())),
    ];
    for (server, admin, want) in cases {
        let env = env_with(*admin);
        let src = with_route(&format!("[server]\n{server}\n"));
        let got = parse_env(&name, &src, &env);
        match (want, got) {
            (Ok(()), Ok(_)) => {}
            (Err(msg), Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.starts_with(&format!("{name}{msg}")),
                    "{server} {admin:?}: {e}"
                );
                // The variable a value came from is named (`${V_abc}`): not its value.
                let shown = without_variables(&e);
                for secret in ["tiny-token", "short-tok", "abc", "change-me"] {
                    assert!(
                        !shown.contains(secret),
                        "{server}: the value is echoed: {e}"
                    );
                }
            }
            (want, got) => panic!("{server} {admin:?}: want {want:?}, got {got:?}"),
        }
    }
}

/// `admin_token_file` and `check_token_file`: the file's token (whitespace around it
/// dropped), relative to the config's directory; an empty or missing file is an error at
/// the value.
#[test]
fn tokens_come_from_files() {
    let dir = Dir::new(
        "token-files",
        &[("token", "t0ken-from-file-0123\n"), ("empty", "  \n")],
    );
    let name = dir.config();
    let env = env_with(None);
    let load = |server: &str| parse_env(&name, &with_route(&format!("[server]\n{server}\n")), &env);
    let c = load("admin_token_file = \"token\"\ncheck_token_file = \"token\"").unwrap();
    assert_eq!(
        c.server.admin_token.unwrap().expose(),
        "t0ken-from-file-0123"
    );
    let check = c.server.check_token.unwrap();
    assert!(check.authorizes([&b"Bearer t0ken-from-file-0123"[..]]));
    for key in ["admin_token_file", "check_token_file"] {
        let err = load(&format!("{key} = \"empty\"")).unwrap_err().to_string();
        assert!(
            err.contains(&format!(":2:20: {key}:")) && err.ends_with("is empty"),
            "{err}"
        );
        let err = load(&format!("{key} = \"nope\"")).unwrap_err().to_string();
        assert!(err.contains(&format!("{key}: cannot read")), "{err}");
    }
}

/// A token from a file and from the environment or the config at once is an error at the
/// file key: which one counts would be a guess.
#[test]
fn one_source_per_token() {
    let dir = Dir::new("token-sources", &[("token", "t0ken-from-file-0123\n")]);
    let name = dir.config();
    let env = env_with(Some("an-admin-token-0123"));
    let src = with_route("[server]\nadmin_token_file = \"token\"\n");
    let err = parse_env(&name, &src, &env).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("{name}:2:20: admin_token_file and $THROTTLE_ADMIN_TOKEN are both set: use one")
    );
    let env = env_with(None);
    let src = with_route(
        "[server]\ncheck_token = \"check-token-0123456\"\ncheck_token_file = \"token\"\n",
    );
    let err = parse_env(&name, &src, &env).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("{name}:3:20: check_token_file and check_token are both set: use one")
    );
    let c = parse_env(
        &name,
        &with_route("[server]\n"),
        &env_with(Some("an-admin-token-0123")),
    );
    assert_eq!(
        c.unwrap().server.admin_token.unwrap().expose(),
        "an-admin-token-0123"
    );
}

/// `admin_max_connections_per_ip` and `rls_max_connections_per_ip`: 8 by default, at
/// least 1.
#[test]
fn listener_caps_per_client() {
    let env = env_with(None);
    let load = |server: &str| {
        parse_env(
            "f.toml",
            &with_route(&format!("[server]\n{server}\n")),
            &env,
        )
    };
    let s = load("").unwrap().server;
    assert_eq!(
        (s.admin_max_connections_per_ip, s.rls_max_connections_per_ip),
        (8, 8)
    );
    let s = load("admin_max_connections_per_ip = 2\nrls_max_connections_per_ip = 40")
        .unwrap()
        .server;
    assert_eq!(
        (s.admin_max_connections_per_ip, s.rls_max_connections_per_ip),
        (2, 40)
    );
    for key in ["admin_max_connections_per_ip", "rls_max_connections_per_ip"] {
        let err = load(&format!("{key} = 0")).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("f.toml:2:{}: {key} must be at least 1", key.len() + 4)
        );
    }
}

/// `e` without its `${NAME}` references.
fn without_variables(e: &str) -> String {
    let mut out = String::new();
    let mut rest = e;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        rest = rest[at..].split_once('}').map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out
}
