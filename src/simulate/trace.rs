//! The trace: a CSV file with a header naming its columns, one request per row.
//!
//! Columns (any order, names case-insensitive): `time` (RFC 3339 or Unix milliseconds),
//! `ip`, `path` (required); `api_key` and/or `key_id`, `host`, `cost`, `method` (optional;
//! `GET` when absent: a route's `methods` may not take it), `query` (the query string
//! custom scopes' `query:` read; else the part of `path` after `?`) and any number of
//! `header:<Name>` columns (a request header, for custom scopes' `header:` and
//! `cookie:`); `status` (the upstream's answer, for `count_on`; 200 when absent) and
//! `bytes` (the body bytes moved, for a `cost_from` route). An
//! unknown or repeated column is an error at line 1, so a misspelt `apikey` cannot make
//! every row anonymous. Empty cells mean "absent" (no key, no host, the route's cost).
//! Every error names the line the row starts on (the header is line 1).

use std::io::Read;
use std::net::IpAddr;

use super::SimError;
use crate::config::rfc3339_ms;

/// Below this a `time` is taken for Unix seconds (before March 1973 in milliseconds).
const MIN_UNIX_MS: u64 = 100_000_000_000;

/// The last instant a trace may name: 9999-12-31T23:59:59.999Z. Window arithmetic on
/// later times (a window's end, a month's length) would leave `u64` milliseconds.
const MAX_UNIX_MS: u64 = 253_402_300_799_999;

/// One request of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Row {
    /// The line the row starts on.
    pub(super) line: u64,
    /// When the request arrives (Unix ms).
    pub(super) time_ms: u64,
    /// The client address.
    pub(super) ip: IpAddr,
    /// The key the request presents.
    pub(super) key: Key,
    /// The request path (query and fragment already cut off).
    pub(super) path: String,
    /// The `Host`, as sent (port and case are the router's business).
    pub(super) host: Option<String>,
    /// Units to spend instead of the route's `cost`.
    pub(super) cost: Option<u32>,
    /// The request method (`GET` when the trace has none).
    pub(super) method: http::Method,
    /// The query string, if any.
    pub(super) query: Option<String>,
    /// The `header:<Name>` cells that are not empty (None: no such column set).
    pub(super) headers: Option<http::HeaderMap>,
    /// The upstream's answer (`count_on` refunds the tables it leaves out; none: 200).
    pub(super) status: Option<u16>,
    /// The body bytes the request moved (a `cost_from` route settles to them).
    pub(super) bytes: Option<u64>,
}

/// The key of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Key {
    /// No key.
    None,
    /// A raw API key, as a client would send it.
    Api(String),
    /// The id of one of the config's `[[keys]]`.
    Id(String),
}

/// Where each column is in a record.
#[derive(Debug, Default)]
struct Columns {
    time: Option<usize>,
    ip: Option<usize>,
    path: Option<usize>,
    api_key: Option<usize>,
    key_id: Option<usize>,
    host: Option<usize>,
    cost: Option<usize>,
    method: Option<usize>,
    query: Option<usize>,
    status: Option<usize>,
    bytes: Option<usize>,
    headers: Vec<(usize, http::HeaderName)>,
}

/// Reads every row of `trace`, in file order (tests; the replay streams with `Rows`).
///
/// # Errors
/// `SimError::Line` for the first line that cannot be read.
#[cfg(test)]
pub(super) fn read(trace: impl Read) -> Result<Vec<Row>, SimError> {
    Rows::new(trace)?.collect()
}

/// The rows of a trace, read one at a time: memory holds one record and the reader's
/// buffer, however long the trace.
pub(super) struct Rows<R: Read> {
    csv: csv::Reader<Counted<R>>,
    columns: Columns,
    record: csv::StringRecord,
    failed: bool,
}

impl<R: Read> Rows<R> {
    /// Reads the header.
    ///
    /// # Errors
    /// `SimError::Line` (line 1) for a missing or bad header.
    pub(super) fn new(trace: R) -> Result<Self, SimError> {
        let mut csv = csv::ReaderBuilder::new()
            .has_headers(true)
            .trim(csv::Trim::All)
            .from_reader(Counted::new(trace));
        let header = match csv.headers() {
            Ok(h) => h.clone(),
            Err(e) => return Err(csv_error(&e, csv.get_mut())),
        };
        let columns = Columns::from_header(&header)?;
        Ok(Self {
            csv,
            columns,
            record: csv::StringRecord::new(),
            failed: false,
        })
    }
}

impl<R: Read> Iterator for Rows<R> {
    type Item = Result<Row, SimError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let result = match self.csv.read_record(&mut self.record) {
            Ok(false) => return None,
            Ok(true) => {
                let line = self
                    .record
                    .position()
                    .map_or(0, |p| self.csv.get_mut().line_at(p.byte()));
                self.columns
                    .row(&self.record, line)
                    .map_err(|reason| SimError::Line { line, reason })
            }
            Err(e) => Err(csv_error(&e, self.csv.get_mut())),
        };
        self.failed = result.is_err();
        Some(result)
    }
}

/// The trace as the CSV reader reads it, noting where each line break passes so that a
/// record's byte offset can be told as a line number (the csv crate does not count the
/// blank lines it skips). Only breaks the reader has not yet moved past are kept.
struct Counted<R> {
    inner: R,
    /// Bytes read so far.
    read: u64,
    /// Offsets of `\n` (true) and `\r` (false) bytes at or after the last offset asked.
    breaks: std::collections::VecDeque<(u64, bool)>,
    /// Line feeds before the front of `breaks`.
    line: u64,
}

impl<R> Counted<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            read: 0,
            breaks: std::collections::VecDeque::new(),
            line: 1,
        }
    }

    /// The 1-based line of the record starting at `offset` (not below the last offset
    /// asked): a record's position is where the reader stood, before the blank lines it
    /// skips, so those are stepped over first.
    fn line_at(&mut self, mut offset: u64) -> u64 {
        while let Some(&(at, lf)) = self.breaks.front() {
            if at > offset {
                break;
            }
            if at == offset {
                offset += 1; // a blank line the reader skips
            }
            self.line += u64::from(lf);
            self.breaks.pop_front();
        }
        self.line
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for (i, b) in buf.iter().take(n).enumerate() {
            if matches!(b, b'\n' | b'\r') {
                self.breaks.push_back((self.read + i as u64, *b == b'\n'));
            }
        }
        self.read += n as u64;
        Ok(n)
    }
}

/// A CSV error as the line it happened on.
fn csv_error<R>(e: &csv::Error, lines: &mut Counted<R>) -> SimError {
    let line = e.position().map_or(1, |p| lines.line_at(p.byte()));
    let reason = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("{len} fields, but the header has {expected_len}"),
        csv::ErrorKind::Utf8 { .. } => "not valid UTF-8".to_string(),
        _ => e.to_string(),
    };
    SimError::Line { line, reason }
}

// === impl Columns ===

impl Columns {
    /// The columns the header names.
    fn from_header(header: &csv::StringRecord) -> Result<Self, SimError> {
        let at_header = |reason: String| SimError::Line { line: 1, reason };
        let mut c = Columns::default();
        for (i, name) in header.iter().enumerate() {
            let slot = match name.to_ascii_lowercase().as_str() {
                "time" => &mut c.time,
                "ip" => &mut c.ip,
                "path" => &mut c.path,
                "api_key" => &mut c.api_key,
                "key_id" => &mut c.key_id,
                "host" => &mut c.host,
                "cost" => &mut c.cost,
                "method" => &mut c.method,
                "query" => &mut c.query,
                "status" => &mut c.status,
                "bytes" => &mut c.bytes,
                lower if lower.starts_with("header:") => {
                    let h = http::HeaderName::from_bytes(&lower.as_bytes()["header:".len()..])
                        .map_err(|_| at_header(format!("column {name:?}: not a header name")))?;
                    if c.headers.iter().any(|(_, n)| *n == h) {
                        return Err(at_header(format!("column {name:?} appears twice")));
                    }
                    c.headers.push((i, h));
                    continue;
                }
                _ => {
                    return Err(at_header(format!(
                        "unknown column {name:?} (columns: time, ip, path, api_key, key_id, host, cost, method, query, status, bytes, header:<Name>)"
                    )))
                }
            };
            if slot.replace(i).is_some() {
                return Err(at_header(format!("column {name:?} appears twice")));
            }
        }
        for (name, col) in [("time", c.time), ("ip", c.ip), ("path", c.path)] {
            if col.is_none() {
                return Err(at_header(format!("no {name:?} column in the header")));
            }
        }
        Ok(c)
    }

    /// The row of `record`, or why it cannot be read.
    fn row(&self, record: &csv::StringRecord, line: u64) -> Result<Row, String> {
        let cell = |col: Option<usize>| col.and_then(|i| record.get(i)).unwrap_or("");
        let path = cell(self.path);
        if path.is_empty() {
            return Err("empty path".into());
        }
        // Routes match the path alone, as the proxy matches `uri.path()`.
        let (path, in_path) = match path.split('#').next().unwrap_or(path).split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path.split('#').next().unwrap_or(path), None),
        };
        let query = Some(cell(self.query))
            .filter(|q| !q.is_empty())
            .or(in_path)
            .map(str::to_string);
        let headers = if self.headers.is_empty() {
            None
        } else {
            let mut map = http::HeaderMap::new();
            for (i, name) in &self.headers {
                let v = cell(Some(*i));
                if v.is_empty() {
                    continue;
                }
                let v = http::HeaderValue::from_str(v)
                    .map_err(|_| format!("header {name} value {v:?} is not a header value"))?;
                map.append(name.clone(), v);
            }
            Some(map)
        };
        let key = match (cell(self.api_key), cell(self.key_id)) {
            ("", "") => Key::None,
            (k, "") => Key::Api(k.to_string()),
            ("", id) => Key::Id(id.to_string()),
            _ => return Err("both api_key and key_id are set: give one".into()),
        };
        let host = Some(cell(self.host)).filter(|h| !h.is_empty());
        Ok(Row {
            line,
            time_ms: time_ms(cell(self.time))?,
            ip: ip(cell(self.ip))?,
            key,
            path: path.to_string(),
            host: host.map(str::to_string),
            cost: cost(cell(self.cost))?,
            method: method(cell(self.method))?,
            query,
            headers,
            status: status(cell(self.status))?,
            bytes: number(cell(self.bytes), "bytes")?,
        })
    }
}

/// `time`: RFC 3339 (`2026-01-01T00:00:00.250Z`, any offset) or Unix milliseconds.
fn time_ms(s: &str) -> Result<u64, String> {
    let ms = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        match s.parse::<u64>() {
            Ok(ms) if ms >= MIN_UNIX_MS => ms,
            Ok(_) => {
                return Err(format!(
                    "time {s:?} looks like Unix seconds: give Unix milliseconds or RFC 3339"
                ))
            }
            Err(_) => return Err(format!("time {s:?} is out of range")),
        }
    } else {
        rfc3339_ms(s).ok_or_else(|| {
            format!(
                "invalid time {s:?}: expected RFC 3339 (2026-01-01T00:00:00Z) or Unix milliseconds"
            )
        })?
    };
    if ms > MAX_UNIX_MS {
        return Err(format!(
            "time {s:?} is out of range: the last is 9999-12-31T23:59:59.999Z"
        ));
    }
    Ok(ms)
}

/// `ip`: an IPv4 or IPv6 address.
fn ip(s: &str) -> Result<IpAddr, String> {
    s.parse()
        .map_err(|_| format!("invalid ip {s:?}: expected an IPv4 or IPv6 address"))
}

/// `method`: empty (`GET`) or an HTTP method token, as sent (methods are case-sensitive).
fn method(s: &str) -> Result<http::Method, String> {
    if s.is_empty() {
        return Ok(http::Method::GET);
    }
    http::Method::from_bytes(s.as_bytes()).map_err(|_| format!("invalid method {s:?}"))
}

/// `status`: empty (200) or an HTTP status, 100 to 599.
fn status(s: &str) -> Result<Option<u16>, String> {
    match number(s, "status")? {
        None => Ok(None),
        Some(n @ 100..=599) => Ok(u16::try_from(n).ok()),
        Some(_) => Err(format!("invalid status {s:?}: expected 100 to 599")),
    }
}

/// An optional non-negative integer cell of `column`.
fn number(s: &str, column: &str) -> Result<Option<u64>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<u64>()
        .map(Some)
        .map_err(|_| format!("invalid {column} {s:?}: expected a non-negative integer"))
}

/// `cost`: empty (the route's cost) or a positive integer.
fn cost(s: &str) -> Result<Option<u32>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    match s.parse::<u32>() {
        Ok(c) if c > 0 => Ok(Some(c)),
        _ => Err(format!("invalid cost {s:?}: expected a positive integer")),
    }
}
