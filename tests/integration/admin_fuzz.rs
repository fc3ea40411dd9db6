//! The live admin API fuzzed against its OpenAPI document with schemathesis (PyPI),
//! against a real gateway on a real test database: no 5xx, every response conforms to
//! the schema. Limited to 10 examples per operation (the CI box has 2 cores).

use std::path::PathBuf;
use std::process::Command;

use crate::db::connected;
use crate::support::postgres::TestDb;
use crate::support::{Upstream, ADMIN_TOKEN};

const VERSION: &str = "4.32.5";

/// schemathesis installed once into target/tools (as .ci/run installs its PyPI tools);
/// None, with the reason printed, when it cannot be.
fn schemathesis() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("target/tools/schemathesis-{VERSION}"));
    if dir.join("bin/st").exists() {
        return Some(dir);
    }
    let tmp = dir.with_extension("tmp");
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--target",
        ])
        .arg(&tmp)
        .arg(format!("schemathesis=={VERSION}"))
        .output();
    match out {
        Ok(o) if o.status.success() && std::fs::rename(&tmp, &dir).is_ok() => Some(dir),
        Ok(o) => {
            eprintln!(
                "SKIPPED: schemathesis {VERSION} could not be installed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("SKIPPED: schemathesis needs python3 and pip: {e}");
            None
        }
    }
}

/// schemathesis finds no 5xx and no response outside the schema on any operation.
#[tokio::test(flavor = "multi_thread")]
async fn admin_api_conforms_to_its_openapi_document() {
    let Some(st) = schemathesis() else { return };
    let Some(db) = TestDb::migrated() else { return };
    let up = Upstream::start("u").await;
    let gw = connected(&db.url, &up).await;
    let spec = gw.admin_url("/v1/openapi.json");
    let base = gw.admin_url("");
    let scratch = tempfile::tempdir().unwrap(); // schemathesis writes .schemathesis/ here
    let cwd = scratch.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(st.join("bin/st"))
            .current_dir(cwd)
            .env("PYTHONPATH", &st)
            .args(["run", &spec, "--url", base.trim_end_matches('/')])
            .args(["-H", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
            .args(["--checks", "not_a_server_error,response_schema_conformance"])
            .args(["--max-examples", "10", "--no-color"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        gw.log()
    );
}
