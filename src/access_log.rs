//! The access log: one JSON object per line per request, written off the request path.
//!
//! A request builds its `Entry` (borrowed fields, no header value but the request id,
//! never a key: only its id), serializes it with `serde_json` (so client input such as the
//! path is escaped, U+2028 and U+2029 too) with every text field capped at `MAX_FIELD`
//! bytes, and hands the line to a bounded queue with `try_send`. A dedicated thread drains the queue into a `BufWriter`
//! and flushes whenever the queue is empty (and at least every `FLUSH_EVERY` lines under
//! sustained load), so a line waits for the disk only on that thread. A full queue drops
//! the line and counts `throttle_access_log_dropped_total`: a slow disk costs lines, never
//! requests. With the log off there is no `AccessLog` at all and nothing is built.

use std::io::Write;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};

use prometheus::IntCounter;
use serde::Serialize;

use crate::config::{cap, cap_in_place};

/// Lines the queue holds before new ones are dropped.
pub const CAPACITY: usize = 8192;
/// The longest field written (bytes; a longer one is cut at a character boundary).
pub const MAX_FIELD: usize = 2048;
/// Lines written between flushes while the queue never empties.
const FLUSH_EVERY: usize = 256;

/// The sending side of the access log (cheap to share: one per gateway).
pub struct AccessLog {
    tx: SyncSender<String>,
    dropped: IntCounter,
}

/// One request's line. Strings are borrowed from the request's state.
#[derive(Serialize)]
pub struct Entry<'a> {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// The request's `X-Request-Id`.
    pub request_id: &'a str,
    /// The resolved client address (None: the request was refused before it was known).
    pub client_ip: Option<String>,
    /// The request method.
    pub method: &'a str,
    /// The request path (every field is capped at `MAX_FIELD` by `line`).
    pub path: &'a str,
    /// The matched route's name.
    pub route: Option<&'a str>,
    /// The status written to the client (0: none).
    pub status: u16,
    /// The scope of the rejecting window, for a rate-limit rejection.
    pub scope: Option<&'a str>,
    /// The rejecting window.
    pub window: Option<&'a str>,
    /// The caller's key id (never the key).
    pub key_id: Option<&'a str>,
    /// The caller's tenant.
    pub tenant: Option<&'a str>,
    /// The upstream address, when one was chosen.
    pub upstream: Option<String>,
    /// From the request head to the end of the response.
    pub duration_ms: f64,
    /// From the upstream connect to the end of the response (None: not proxied).
    pub upstream_ms: Option<f64>,
    /// Request body bytes read from the client.
    pub bytes_in: usize,
    /// Response body bytes written to the client.
    pub bytes_out: usize,
}

// === impl AccessLog ===

impl AccessLog {
    /// Starts the writer thread over `sink` with a queue of `capacity` lines; lines the
    /// queue cannot take count on `dropped`.
    ///
    /// # Errors
    /// When the thread cannot be spawned.
    pub fn start(
        sink: Box<dyn Write + Send>,
        capacity: usize,
        dropped: IntCounter,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(capacity);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || drain(&rx, sink))?;
        Ok(Self { tx, dropped })
    }

    /// The log `target` names (None: off), its lines dropped on a full queue counting on
    /// `dropped`. A file is opened for appending, created if missing.
    ///
    /// # Errors
    /// When the file cannot be opened or the thread cannot be spawned.
    pub fn open(
        target: &crate::config::AccessLogTarget,
        dropped: IntCounter,
    ) -> std::io::Result<Option<Self>> {
        use crate::config::AccessLogTarget as T;
        let sink: Box<dyn Write + Send> = match target {
            T::Off => return Ok(None),
            T::Stdout => Box::new(std::io::stdout()),
            T::File(path) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        Self::start(sink, CAPACITY, dropped).map(Some)
    }

    /// Queues `entry`'s line without waiting: a full queue drops it (and counts).
    pub fn log(&self, entry: Entry<'_>) {
        if let Some(line) = line(entry) {
            self.send(line);
        }
    }

    /// Queues a ready line without waiting.
    fn send(&self, line: String) {
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.dropped.inc(),
        }
    }
}

/// `entry` as one JSON line (newline included), every text field capped at `MAX_FIELD`
/// bytes, U+2028 and U+2029 escaped.
pub fn line(mut entry: Entry<'_>) -> Option<String> {
    for field in [&mut entry.request_id, &mut entry.method, &mut entry.path] {
        *field = cap(field, MAX_FIELD);
    }
    for field in [
        &mut entry.route,
        &mut entry.scope,
        &mut entry.window,
        &mut entry.key_id,
        &mut entry.tenant,
    ] {
        *field = field.map(|f| cap(f, MAX_FIELD));
    }
    for field in [&mut entry.client_ip, &mut entry.upstream] {
        if let Some(f) = field.as_mut() {
            cap_in_place(f, MAX_FIELD);
        }
    }
    let out = serde_json::to_string(&entry).ok()?;
    let mut out = escape_separators(out);
    out.push('\n');
    Some(out)
}

/// `json` with U+2028 and U+2029 as `\u2028` and `\u2029`: valid JSON either way, but a
/// reader splitting on Unicode line terminators (JavaScript before ES2019, many log
/// viewers) would see one line as two. In serialized JSON they only occur inside strings,
/// where the escape means the same character.
fn escape_separators(json: String) -> String {
    if !json.contains(['\u{2028}', '\u{2029}']) {
        return json; // the common case: nothing copied
    }
    json.replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// The writer thread: lines from `rx` to `sink`, flushed when the queue runs dry.
fn drain(rx: &Receiver<String>, sink: Box<dyn Write + Send>) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, sink);
    let mut since_flush = 0usize;
    while let Ok(line) = rx.recv() {
        let mut next = Some(line);
        while let Some(l) = next.take() {
            if out.write_all(l.as_bytes()).is_err() {
                // A failing sink (disk full): the line is lost; keep draining.
                continue;
            }
            since_flush += 1;
            if since_flush >= FLUSH_EVERY {
                let _ = out.flush();
                since_flush = 0;
            }
            match rx.try_recv() {
                Ok(l) => next = Some(l),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
            }
        }
        let _ = out.flush();
        since_flush = 0;
    }
    let _ = out.flush();
}

/// `ms` since the Unix epoch as RFC 3339 UTC with milliseconds
/// (`2026-12-02T15:04:05.123Z`).
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = crate::limiter::algorithm::civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A sink the test can read, that blocks writes while `gate` is held.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn entry<'a>(path: &'a str, request_id: &'a str) -> Entry<'a> {
        Entry {
            time: rfc3339_ms(1_764_688_445_123),
            request_id,
            client_ip: Some("127.0.0.1".into()),
            method: "GET",
            path,
            route: Some("api"),
            status: 200,
            scope: None,
            window: None,
            key_id: Some("k1"),
            tenant: Some("acme"),
            upstream: Some("127.0.0.1:8080".into()),
            duration_ms: 1.5,
            upstream_ms: Some(1.0),
            bytes_in: 0,
            bytes_out: 2,
        }
    }

    /// The time format: RFC 3339, UTC, milliseconds.
    #[test]
    fn formats_rfc3339_with_millis() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_764_688_445_123), "2025-12-02T15:14:05.123Z");
        assert_eq!(rfc3339_ms(951_782_400_007), "2000-02-29T00:00:00.007Z");
    }

    /// Quotes, control bytes, newlines and a huge multi-byte path stay one valid JSON
    /// object on one line, the path capped at `MAX_FIELD` bytes.
    #[test]
    fn hostile_input_stays_one_capped_json_line() {
        let huge = format!("/\"\n\r\t\u{1}\\{}", "é".repeat(5000));
        let l = line(entry(&huge, "id\"\n")).unwrap();
        assert!(l.ends_with('\n') && l.matches('\n').count() == 1, "{l}");
        let v: serde_json::Value = serde_json::from_str(l.trim_end()).unwrap();
        let path = v["path"].as_str().unwrap();
        assert!(
            path.len() <= MAX_FIELD && path.starts_with("/\"\n"),
            "{}",
            path.len()
        );
        assert_eq!(v["request_id"], "id\"\n");
        assert_eq!(v["status"], 200);
        assert_eq!(v["scope"], serde_json::Value::Null);
    }

    /// Every text field is cut at `MAX_FIELD` bytes (a megabyte method or JWT subject
    /// makes a line of a few kilobytes), and U+2028 / U+2029 are escaped, never raw.
    #[test]
    fn every_field_is_capped_and_separators_escaped() {
        let huge = "M".repeat(1 << 20);
        let sep = format!("a\u{2028}b\u{2029}c{}", "é".repeat(3000));
        let mut e = entry("/\u{2028}", &sep);
        e.method = &huge;
        e.key_id = Some(&huge);
        e.tenant = Some(&sep);
        e.route = Some(&huge);
        e.upstream = Some(huge.clone());
        let l = line(e).unwrap();
        assert!(l.len() < 8 * MAX_FIELD, "{} bytes", l.len());
        assert!(!l.contains(['\u{2028}', '\u{2029}']), "{l}");
        assert!(l.contains("\\u2028") && l.contains("\\u2029"));
        let v: serde_json::Value = serde_json::from_str(l.trim_end()).unwrap();
        for field in [
            "method",
            "key_id",
            "route",
            "upstream",
            "request_id",
            "tenant",
        ] {
            let f = v[field].as_str().unwrap();
            assert!(f.len() <= MAX_FIELD, "{field}: {}", f.len());
        }
        assert_eq!(v["path"], "/\u{2028}");
        assert!(v["tenant"]
            .as_str()
            .unwrap()
            .starts_with("a\u{2028}b\u{2029}c"));
    }

    /// A full queue drops the line and counts it, without blocking the sender.
    #[test]
    fn full_queue_drops_and_counts() {
        let dropped = IntCounter::new("d", "d").unwrap();
        // A queue no thread drains: the receiver is held here.
        let (tx, rx) = mpsc::sync_channel(2);
        let log = AccessLog {
            tx,
            dropped: dropped.clone(),
        };
        for _ in 0..5 {
            log.log(entry("/", "r"));
        }
        assert_eq!(dropped.get(), 3);
        assert_eq!(rx.try_iter().count(), 2);
    }

    /// The writer thread writes every queued line, one JSON object each.
    #[test]
    fn writer_writes_every_line() {
        let sink = Shared::default();
        let dropped = IntCounter::new("d", "d").unwrap();
        let log = AccessLog::start(Box::new(sink.clone()), CAPACITY, dropped.clone()).unwrap();
        for i in 0..100 {
            log.log(entry(&format!("/p{i}"), "r"));
        }
        drop(log); // the thread drains what is queued, flushes and ends
        let deadline = std::time::Duration::from_secs(5);
        let start = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap();
        loop {
            let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
            if text.lines().count() == 100 {
                for l in text.lines() {
                    serde_json::from_str::<serde_json::Value>(l).unwrap();
                }
                break;
            }
            let now = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap();
            assert!(
                now - start < deadline,
                "only {} lines",
                text.lines().count()
            );
            std::thread::yield_now();
        }
        assert_eq!(dropped.get(), 0);
    }
}
