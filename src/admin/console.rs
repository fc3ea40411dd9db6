//! The operator's console: one page at `/` (also `/index.html`) with its script
//! (`/console.js`) and styles (`/console.css`), all compiled into the binary.
//!
//! The three files hold no data and are served without the admin token; the page asks
//! for the token and sends it as `Authorization: Bearer` on every data request it makes
//! (`/metrics`, `/readyz`, `/v1/top`, `/v1/blocks`, `/v1/usage`, `/v1/routes`), keeping
//! it in a script variable only. Every answer here carries a strict
//! `Content-Security-Policy` (no inline script or style, no other origin), so the page
//! cannot be framed or made to load anything but these files and the admin API. Its
//! URLs are relative, so it works behind a path prefix.

use http::{Method, Response, StatusCode};

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// The policy of every console answer.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// The console's answer to `method path`; None when `path` is not one of its files.
pub(super) fn serve(method: &Method, path: &str) -> Option<Response<Vec<u8>>> {
    let (body, content_type) = match path {
        "/" | "/index.html" => (INDEX, "text/html; charset=utf-8"),
        "/console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "/console.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return None,
    };
    let (status, content_type, body) = match *method {
        Method::GET => (StatusCode::OK, content_type, body.as_bytes()),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "application/json",
            &br#"{"error":"method_not_allowed"}"#[..],
        ),
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .header("content-security-policy", CSP)
        .header("x-frame-options", "DENY")
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
        .header("cache-control", "no-store")
        .body(body.to_vec())
        .ok()
}
