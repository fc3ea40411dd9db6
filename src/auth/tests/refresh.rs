//! The `jwks_url` refresher: its schedule on paused time with a stand-in fetch, then real
//! fetches from a JWKS server on loopback (rotation, failures, merging, a new URL).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::Algorithm;
use serde_json::json;
use tokio::sync::oneshot;

use super::support::{claims, eventually, jwks, JwksFile, JwksServer, Serve, TestKey, NOW};
use crate::auth::verifier::Timing;
use crate::auth::{FetchError, InvalidToken, JwtSettings, JwtVerifier, MAX_JWKS_BYTES};

const PATIENCE: Duration = Duration::from_secs(5);

/// Whether an error is the expected kind.
type IsError = fn(&FetchError) -> bool;

fn url_settings(url: &str, refresh: Duration) -> JwtSettings {
    JwtSettings {
        algorithms: vec![Algorithm::EdDSA],
        jwks_url: Some(url.into()),
        jwks_refresh: refresh,
        ..JwtSettings::default()
    }
}

/// A shutdown signal for a refresher.
fn shutdown() -> (oneshot::Sender<()>, impl std::future::Future<Output = ()>) {
    let (tx, rx) = oneshot::channel();
    (tx, async move {
        let _ = rx.await;
    })
}

fn ok(v: &JwtVerifier, key: &TestKey) -> bool {
    v.verify(key.sign(&claims("u")).as_bytes(), NOW).is_ok()
}

/// Unknown kids bring one fetch forward to 10 s after the last one, however many
/// arrive; without misses the period rules.
#[tokio::test(start_paused = true)]
async fn an_unknown_kid_brings_at_most_one_refetch_per_10s() {
    const URL: &str = "http://keys.invalid/jwks.json";
    let (a, b, c) = (TestKey::ed("a"), TestKey::ed("b"), TestKey::ed("c"));
    let v = Arc::new(JwtVerifier::new(url_settings(URL, Duration::from_secs(300))).unwrap());
    let fetches = Arc::new(AtomicUsize::new(0));
    let bodies = Arc::new([jwks(&[&a]), jwks(&[&a, &b]), jwks(&[&a, &b, &c])]);
    let refresh = {
        let (v, fetches) = (v.clone(), fetches.clone());
        move || {
            let n = fetches.fetch_add(1, Ordering::SeqCst);
            let (v, bodies) = (v.clone(), bodies.clone());
            async move {
                v.install_url(URL, &bodies[n.min(2)]).unwrap();
            }
        }
    };
    let (_stop, stopped) = shutdown();
    let driver = v.clone();
    tokio::spawn(async move { driver.drive(refresh, stopped).await });
    let count = || fetches.load(Ordering::SeqCst);
    eventually("the first fetch", PATIENCE, || count() == 1).await;
    for _ in 0..100 {
        assert!(!ok(&v, &b), "b is not published yet");
    }
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(count(), 1, "no refetch within 10 s of the last fetch");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(count(), 2, "exactly one refetch for 100 misses");
    assert!(ok(&v, &b));
    // Another miss: again no earlier than 10 s after that fetch.
    assert!(!ok(&v, &c));
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(count(), 2);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(count(), 3);
    assert!(ok(&v, &c));
    assert_eq!(v.stats().kid_refetches, 2);
    // No misses: the next fetch is the periodic one, 300 s after the last.
    tokio::time::sleep(Duration::from_secs(280)).await;
    assert_eq!(count(), 3);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(count(), 4);
}

/// The refresher fetches at start and follows the served set: a key dropped from it stops
/// verifying (cached tokens too), a new one starts; shutdown ends the loop.
#[tokio::test]
async fn the_refresher_follows_rotation() {
    let (a, b) = (TestKey::ed("a"), TestKey::ed("b"));
    let server = JwksServer::start(Serve::Body(jwks(&[&a]))).await;
    let v =
        Arc::new(JwtVerifier::new(url_settings(&server.url, Duration::from_millis(100))).unwrap());
    let (stop, stopped) = shutdown();
    let task = tokio::spawn(v.clone().run_refresher(stopped));
    eventually("key a", PATIENCE, || ok(&v, &a)).await;
    let token_a = a.sign(&claims("u"));
    assert!(v.verify(token_a.as_bytes(), NOW).is_ok());
    server.set(Serve::Body(jwks(&[&b])));
    eventually("key b", PATIENCE, || ok(&v, &b)).await;
    assert_eq!(
        v.verify(token_a.as_bytes(), NOW),
        Err(InvalidToken::UnknownKid)
    );
    stop.send(()).unwrap();
    tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    assert!(v.stats().fetches >= 2);
}

/// Every kind of failed fetch keeps the last good set and is counted.
#[tokio::test]
async fn a_failed_fetch_keeps_the_last_good_set() {
    let (a, b) = (TestKey::ed("a"), TestKey::ed("b"));
    let server = JwksServer::start(Serve::Body(jwks(&[&a]))).await;
    // Generous: only the hanging server should meet it, even on a loaded machine.
    let timing = Timing {
        fetch_deadline: Duration::from_millis(1500),
        kid_refetch: Duration::from_secs(10),
    };
    let s = url_settings(&server.url, Duration::from_secs(300));
    let v = JwtVerifier::with_timing(s, timing).unwrap();
    assert_eq!(v.refresh_once().await.unwrap(), 1);
    let oct = json!({ "keys": [{ "kty": "oct", "kid": "a", "k": "c2VjcmV0" }] });
    let huge = vec![b' '; MAX_JWKS_BYTES + 1];
    let failures: Vec<(Serve, IsError)> = vec![
        (Serve::Status(500), |e| matches!(e, FetchError::Status(500))),
        (Serve::Status(404), |e| matches!(e, FetchError::Status(404))),
        (Serve::Body(b"<html>oops".to_vec()), |e| {
            matches!(e, FetchError::Jwks(_))
        }),
        (Serve::Body(br#"{"keys": []}"#.to_vec()), |e| {
            matches!(e, FetchError::Jwks(_))
        }),
        (Serve::Body(serde_json::to_vec(&oct).unwrap()), |e| {
            matches!(e, FetchError::Jwks(_))
        }),
        (Serve::Body(huge), |e| matches!(e, FetchError::TooLarge(_))),
        (Serve::Hang, |e| matches!(e, FetchError::Timeout)),
    ];
    let n = failures.len() as u64;
    for (serve, expected) in failures {
        server.set(serve.clone());
        let err = v.refresh_once().await.unwrap_err();
        assert!(expected(&err), "{serve:?}: {err}");
        assert!(ok(&v, &a), "{serve:?} lost the last good set");
    }
    let stats = v.stats();
    assert_eq!((stats.fetches, stats.fetch_failures), (1, n));
    server.set(Serve::Body(jwks(&[&b])));
    assert_eq!(v.refresh_once().await.unwrap(), 1);
    assert!(ok(&v, &b) && !ok(&v, &a));
}

/// A server that is not there is a transport error, counted; nothing is installed.
#[tokio::test]
async fn an_unreachable_url_is_a_transport_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/jwks.json", closed.local_addr().unwrap());
    drop(closed);
    let v = JwtVerifier::new(url_settings(&url, Duration::from_secs(300))).unwrap();
    let err = v.refresh_once().await.unwrap_err();
    assert!(matches!(err, FetchError::Transport(_)), "{err}");
    assert_eq!(v.stats().fetch_failures, 1);
    assert_eq!(v.stats().keys, 0);
}

/// File and URL keys are merged by kid; on a kid in both, the file's key is used.
#[tokio::test]
async fn file_and_url_keys_merge_with_the_file_first() {
    let (file_only, url_only) = (TestKey::ed("f"), TestKey::ed("u"));
    let (file_shared, url_shared) = (TestKey::ed("shared"), TestKey::ed("shared"));
    let server = JwksServer::start(Serve::Body(jwks(&[&url_only, &url_shared]))).await;
    let file = JwksFile::new(&jwks(&[&file_only, &file_shared]));
    let s = JwtSettings {
        jwks_file: Some(file.path.clone()),
        ..url_settings(&server.url, Duration::from_secs(300))
    };
    let v = JwtVerifier::new(s).unwrap();
    assert!(ok(&v, &file_only) && !ok(&v, &url_only));
    assert_eq!(v.refresh_once().await.unwrap(), 2);
    assert_eq!(v.stats().keys, 3);
    assert!(ok(&v, &file_only) && ok(&v, &url_only) && ok(&v, &file_shared));
    let shadowed = url_shared.sign(&claims("u"));
    assert_eq!(
        v.verify(shadowed.as_bytes(), NOW),
        Err(InvalidToken::Signature)
    );
}

/// A reload naming another URL drops the old URL's keys and fetches the new one at once
/// (not at the next period, nor 10 s later).
#[tokio::test]
async fn a_new_url_is_fetched_at_once() {
    let (a, b) = (TestKey::ed("a"), TestKey::ed("b"));
    let first = JwksServer::start(Serve::Body(jwks(&[&a]))).await;
    let second = JwksServer::start(Serve::Body(jwks(&[&b]))).await;
    let v = Arc::new(JwtVerifier::new(url_settings(&first.url, Duration::from_secs(300))).unwrap());
    let (_stop, stopped) = shutdown();
    tokio::spawn(v.clone().run_refresher(stopped));
    eventually("key a", PATIENCE, || ok(&v, &a)).await;
    v.reload(url_settings(&second.url, Duration::from_secs(300)))
        .unwrap();
    assert!(!ok(&v, &a), "the old URL's keys are gone");
    eventually("key b", PATIENCE, || second.hits() == 1 && ok(&v, &b)).await;
    assert_eq!(first.hits(), 1);
}
