//! Matching a request descriptor against the loaded tree, and the counter identity.
//!
//! On the request path: nothing here allocates but the returned counter. Each level is
//! probed with the entry's borrowed key and value (two maps: key, then value), the
//! wildcard patterns were split at load time and are matched against `key_value` without
//! building it, and the counter's length is known before it is written (a long one is
//! hashed as it is encoded, never built).

use sha2::{Digest, Sha256};

use super::{Level, Matched, Node, Pattern, RlsConfig, MAX_COUNTER_LEN, MAX_DEPTH};

const HEX: &[u8; 16] = b"0123456789abcdef";
const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// The counter identity of plain entries (no config match needed; used for a descriptor's
/// limit override): `key=value` joined by `&`, percent-encoded, hashed when long (see
/// [`Matched::counter`]).
pub fn plain_counter(entries: &[(&str, &str)]) -> String {
    encode(entries.iter().copied())
}

// === impl RlsConfig ===

impl RlsConfig {
    /// The limit for one descriptor's entries (key, value) in `domain`; None: no limit (an
    /// unknown domain, no entries, no match, or a matched node without `rate_limit`).
    ///
    /// Per level: the exact key and value, else the first wildcard entry of the level (in
    /// file order) whose pattern matches `key_value`, else the bare key. The limit is the
    /// one of the node matched for the last entry; walking stops (no limit) where nothing
    /// matches or the matched node has no children while entries remain. An entry matched
    /// through a wildcard with `share_threshold` counts under the pattern, not its value.
    pub fn lookup(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched<'_>> {
        let last = entries.len().checked_sub(1)?;
        if entries.len() > MAX_DEPTH {
            // Deeper than any configured path: the depth rule gives no limit.
            return None;
        }
        let mut level = &self.domains.get(domain)?.root;
        let mut shared: [Option<&Node>; MAX_DEPTH] = [None; MAX_DEPTH];
        for (i, &(key, value)) in entries.iter().enumerate() {
            let (node, by_wildcard) = level.find(key, value)?;
            if by_wildcard && node.share_threshold {
                if let Some(slot) = shared.get_mut(i) {
                    *slot = Some(node);
                }
            }
            if i == last {
                let limit = node.limit.as_ref()?;
                let counter = encode(entries.iter().zip(shared).map(|(&(k, v), s)| match s {
                    Some(n) => (n.key.as_str(), n.value.as_deref().unwrap_or("")),
                    None => (k, v),
                }));
                return Some(Matched {
                    limit,
                    counter,
                    path: &node.path,
                });
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

// === impl Level ===

impl Level {
    /// The node for one entry, and whether a wildcard matched it.
    fn find(&self, key: &str, value: &str) -> Option<(&Node, bool)> {
        let slots = self.by_key.get(key);
        if let Some(&i) = slots.and_then(|s| s.values.get(value)) {
            return self.nodes.get(i).map(|n| (n, false));
        }
        for &i in &self.wildcards {
            let Some(node) = self.nodes.get(i) else {
                continue;
            };
            if node.pattern.as_ref().is_some_and(|p| p.matches(key, value)) {
                return Some((node, true));
            }
        }
        let i = slots?.bare?;
        self.nodes.get(i).map(|n| (n, false))
    }
}

// === impl Pattern ===

impl Pattern {
    /// Whether `key_value` matches: each `*` stands for any run of bytes (none included).
    /// The first and last parts anchor the ends; the middle ones are found leftmost, in
    /// order, between them (leftmost is never worse for a later part).
    pub(super) fn matches(&self, key: &str, value: &str) -> bool {
        let s = Joined {
            key: key.as_bytes(),
            value: value.as_bytes(),
        };
        let n = s.len();
        let (Some((first, rest)), true) = (self.parts.split_first(), n >= self.fixed) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return s.eq_at(0, first.as_bytes()) && n == first.len();
        };
        let end = n - last.len();
        if !s.eq_at(0, first.as_bytes()) || !s.eq_at(end, last.as_bytes()) {
            return false;
        }
        let mut from = first.len();
        for part in middle {
            match s.find(part.as_bytes(), from, end) {
                Some(at) => from = at + part.len(),
                None => return false,
            }
        }
        true
    }
}

/// `key` + `_` + `value`, read without being built.
struct Joined<'a> {
    key: &'a [u8],
    value: &'a [u8],
}

impl Joined<'_> {
    fn len(&self) -> usize {
        self.key.len() + 1 + self.value.len()
    }

    fn at(&self, i: usize) -> Option<u8> {
        match i.checked_sub(self.key.len()) {
            None => self.key.get(i).copied(),
            Some(0) => Some(b'_'),
            Some(j) => self.value.get(j - 1).copied(),
        }
    }

    /// Whether `lit` is at `pos`.
    fn eq_at(&self, pos: usize, lit: &[u8]) -> bool {
        let k = self.key.len();
        if pos > k {
            // Wholly in the value: one slice comparison.
            let from = pos - k - 1;
            return self.value.get(from..from + lit.len()) == Some(lit);
        }
        lit.iter()
            .enumerate()
            .all(|(j, &c)| self.at(pos + j) == Some(c))
    }

    /// The first position `p` in `from..` with `lit` at `p` and ending by `end`.
    fn find(&self, lit: &[u8], from: usize, end: usize) -> Option<usize> {
        let last_start = end.checked_sub(lit.len())?;
        if from > last_start {
            return None;
        }
        let k = self.key.len();
        // Starts in the key or on the `_`: few, checked one by one.
        for p in from..=last_start.min(k) {
            if self.eq_at(p, lit) {
                return Some(p);
            }
        }
        // Starts in the value: a substring search there.
        let lo = from.max(k + 1) - k - 1;
        let hi = end.checked_sub(k + 1)?;
        let window = self.value.get(lo..hi)?;
        memchr::memmem::find(window, lit).map(|p| p + lo + k + 1)
    }
}

// === counter identity ===

/// Bytes kept as they are in a counter; every other byte is `%XX`.
fn keep(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'*' | b'/' | b':')
}

fn encoded_len(s: &str) -> usize {
    s.bytes().map(|b| if keep(b) { 1 } else { 3 }).sum()
}

/// Where an encoded counter goes: the string itself, or its hash.
trait Sink {
    fn text(&mut self, s: &str);
    fn escape(&mut self, b: u8);
}

impl Sink for String {
    fn text(&mut self, s: &str) {
        self.push_str(s);
    }

    fn escape(&mut self, b: u8) {
        self.push('%');
        self.push(char::from(HEX_UPPER[usize::from(b >> 4)]));
        self.push(char::from(HEX_UPPER[usize::from(b & 0xf)]));
    }
}

impl Sink for Sha256 {
    fn text(&mut self, s: &str) {
        self.update(s.as_bytes());
    }

    fn escape(&mut self, b: u8) {
        let hi = HEX_UPPER[usize::from(b >> 4)];
        let lo = HEX_UPPER[usize::from(b & 0xf)];
        self.update([b'%', hi, lo]);
    }
}

/// `s` percent-encoded into `sink`, the kept runs as they are.
fn escaped(sink: &mut impl Sink, s: &str) {
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        if !keep(b) {
            // Kept bytes are ASCII, so `run..i` lies on char boundaries.
            sink.text(s.get(run..i).unwrap_or_default());
            sink.escape(b);
            run = i + 1;
        }
    }
    sink.text(s.get(run..).unwrap_or_default());
}

fn write_all<'e>(sink: &mut impl Sink, entries: impl Iterator<Item = (&'e str, &'e str)>) {
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            sink.text("&");
        }
        escaped(sink, k);
        sink.text("=");
        escaped(sink, v);
    }
}

/// The counter identity of `entries` (see [`Matched::counter`]).
fn encode<'e, I>(entries: I) -> String
where
    I: Iterator<Item = (&'e str, &'e str)> + Clone,
{
    let len: usize = entries
        .clone()
        .enumerate()
        .map(|(i, (k, v))| usize::from(i > 0) + encoded_len(k) + 1 + encoded_len(v))
        .sum();
    if len <= MAX_COUNTER_LEN {
        let mut out = String::with_capacity(len);
        write_all(&mut out, entries);
        return out;
    }
    let mut hasher = Sha256::new();
    write_all(&mut hasher, entries);
    let digest = hasher.finalize();
    let mut out = String::with_capacity(1 + 2 * digest.len());
    out.push('#');
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}
