//! Request-path normalization: the one form of a path that is both routed and forwarded.
//!
//! Upstreams (nginx, servlet containers) decode paths before serving them, so a path
//! that is matched on its raw bytes can mean another resource upstream
//! (`/public/%2e%2e%2fv1/secret`, `/v1//search`, `/v1/%73earch`, `/v1/search;x`).
//! [`normalize`] rewrites a path into a canonical form in which no upstream decoding
//! can change its meaning, and refuses every path for which that is impossible
//! (dot segments, encoded separators, backslashes, control bytes, bad escapes).
//!
//! The pass is left to right, O(len), and allocates nothing when the path is already
//! canonical: the output borrows the input for as long as it is a prefix of it.

use std::borrow::Cow;

/// The longest normalized path accepted, in bytes.
pub const MAX_PATH: usize = 8192;

/// Why a path was refused (every case answers 400 `{"error":"invalid_path"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path does not start with `/` (this includes `*` and the empty path).
    #[error("path does not start with '/'")]
    NotOrigin,
    /// A `%` not followed by two hex digits.
    #[error("'%' not followed by two hex digits")]
    BadEscape,
    /// `%2F` or `%5C`, in any case.
    #[error("percent-encoded path separator")]
    EncodedSeparator,
    /// A raw `\`.
    #[error("backslash in path")]
    Backslash,
    /// A raw or percent-encoded byte below 0x20, or 0x7F.
    #[error("control character in path")]
    ControlChar,
    /// A `.` or `..` segment after decoding (the part before a segment's first `;`).
    #[error("dot segment in path")]
    DotSegment,
    /// A `;` while path parameters are not allowed.
    #[error("path parameter (';') not allowed")]
    PathParameter,
    /// The normalized path is longer than [`MAX_PATH`].
    #[error("path longer than {MAX_PATH} bytes")]
    TooLong,
}

/// A request path in the one form that is both routed and forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized<'a> {
    /// What is forwarded upstream (and, without `;` parameters, what is routed).
    pub forward: Cow<'a, str>,
    /// What routes are matched on: `forward` with each segment's `;params` removed when
    /// parameters are allowed; otherwise the same content as `forward`.
    pub route: Cow<'a, str>,
}

/// Normalizes the path component `raw` (no query) into the form that is routed and
/// forwarded. With `allow_params`, `;` starts a segment's path parameters (kept in
/// `forward`, dropped from `route`); without it a `;` is refused.
///
/// # Errors
/// The [`PathError`] of the first offending byte, left to right.
pub fn normalize(raw: &str, allow_params: bool) -> Result<Normalized<'_>, PathError> {
    if !raw.starts_with('/') {
        return Err(PathError::NotOrigin);
    }
    let mut pass = Pass::new(raw, allow_params);
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        i = pass.step(bytes, i)?;
    }
    pass.finish()
}

/// Output that borrows the input for as long as it is a prefix of it.
#[derive(Clone)]
struct Out<'a> {
    raw: &'a str,
    /// While `owned` is `None`, the output is `raw[..len]`.
    len: usize,
    owned: Option<String>,
}

/// The state of one left-to-right pass.
struct Pass<'a> {
    allow_params: bool,
    forward: Out<'a>,
    /// `None` until the first `;` (with parameters allowed): until then route == forward.
    route: Option<Out<'a>>,
    /// Where the current segment starts in `forward`.
    seg_start: usize,
    /// Past the current segment's first `;`.
    in_params: bool,
}

// === impl Out ===

impl<'a> Out<'a> {
    fn new(raw: &'a str) -> Self {
        Self {
            raw,
            len: 0,
            owned: None,
        }
    }

    /// Appends `s`, which stands for the raw input from byte `at` on. `raw` only ever
    /// borrows ASCII-ended prefixes, so every slice is on a char boundary.
    fn emit(&mut self, at: usize, s: &[u8]) {
        let same = self.raw.as_bytes().get(at..at + s.len()) == Some(s);
        if self.owned.is_none() && self.len == at && same {
            self.len += s.len();
            return;
        }
        let (raw, len) = (self.raw, self.len);
        let buf = self
            .owned
            .get_or_insert_with(|| with_room(&raw[..len], raw.len()));
        buf.extend(s.iter().map(|b| char::from(*b)));
    }

    fn as_bytes(&self) -> &[u8] {
        match &self.owned {
            Some(s) => s.as_bytes(),
            None => &self.raw.as_bytes()[..self.len],
        }
    }

    fn len(&self) -> usize {
        self.as_bytes().len()
    }

    fn ends_with_slash(&self) -> bool {
        self.as_bytes().last() == Some(&b'/')
    }

    fn finish(self) -> Cow<'a, str> {
        match self.owned {
            Some(s) => Cow::Owned(s),
            None => Cow::Borrowed(&self.raw[..self.len]),
        }
    }
}

fn with_room(prefix: &str, hint: usize) -> String {
    let mut s = String::with_capacity(hint + 16);
    s.push_str(prefix);
    s
}

// === impl Pass ===

impl<'a> Pass<'a> {
    fn new(raw: &'a str, allow_params: bool) -> Self {
        Self {
            allow_params,
            forward: Out::new(raw),
            route: None,
            seg_start: 0,
            in_params: false,
        }
    }

    /// Handles the input at `i`; returns where the next token starts.
    fn step(&mut self, b: &[u8], i: usize) -> Result<usize, PathError> {
        match b[i] {
            b'/' => self.slash(i)?,
            b'%' => return self.escape(b, i),
            b';' => self.semicolon(i)?,
            b'\\' => return Err(PathError::Backslash),
            c if is_control(c) => return Err(PathError::ControlChar),
            c if is_unreserved(c) || is_raw_ok(c) => self.emit(i, &[c]),
            c => self.emit(i, &encoded(c)),
        }
        Ok(i + 1)
    }

    /// Ends the current segment and starts the next, merging repeated slashes.
    fn slash(&mut self, i: usize) -> Result<(), PathError> {
        if self.forward.ends_with_slash() {
            return Ok(());
        }
        self.end_segment()?;
        self.forward.emit(i, b"/");
        if let Some(r) = &mut self.route {
            // A segment that was only `;params` leaves `//` in the route: merge it.
            if !r.ends_with_slash() {
                r.emit(i, b"/");
            }
        }
        self.seg_start = self.forward.len();
        self.in_params = false;
        Ok(())
    }

    /// `%XX`: unreserved bytes are decoded, separators and controls refused, the rest
    /// kept encoded with uppercase hex.
    fn escape(&mut self, b: &[u8], i: usize) -> Result<usize, PathError> {
        let (Some(hi), Some(lo)) = (
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(PathError::BadEscape);
        };
        match hi << 4 | lo {
            b'/' | b'\\' => return Err(PathError::EncodedSeparator),
            c if is_control(c) => return Err(PathError::ControlChar),
            c if is_unreserved(c) => self.emit(i, &[c]),
            c => self.emit(i, &encoded(c)),
        }
        Ok(i + 3)
    }

    /// A raw `;`: refused, or the start (or continuation) of path parameters.
    fn semicolon(&mut self, i: usize) -> Result<(), PathError> {
        if !self.in_params {
            self.check_segment()?;
        }
        if !self.allow_params {
            return Err(PathError::PathParameter);
        }
        if self.route.is_none() {
            self.route = Some(self.forward.clone());
        }
        self.in_params = true;
        self.forward.emit(i, b";");
        Ok(())
    }

    /// Appends `s` (standing for the input at `i`) to forward, and to route outside
    /// parameters.
    fn emit(&mut self, i: usize, s: &[u8]) {
        self.forward.emit(i, s);
        if let (Some(r), false) = (&mut self.route, self.in_params) {
            r.emit(i, s);
        }
    }

    fn end_segment(&mut self) -> Result<(), PathError> {
        if !self.in_params {
            self.check_segment()?;
        }
        if self.forward.len() > MAX_PATH {
            return Err(PathError::TooLong);
        }
        Ok(())
    }

    /// Refuses a current segment (so far) of `.` or `..`.
    fn check_segment(&self) -> Result<(), PathError> {
        match self.forward.as_bytes().get(self.seg_start..) {
            Some(b"." | b"..") => Err(PathError::DotSegment),
            _ => Ok(()),
        }
    }

    fn finish(mut self) -> Result<Normalized<'a>, PathError> {
        self.end_segment()?;
        let forward = self.forward.finish();
        let route = match self.route {
            Some(r) => r.finish(),
            None => forward.clone(),
        };
        Ok(Normalized { forward, route })
    }
}

/// RFC 3986 unreserved: ALPHA / DIGIT / `-` `.` `_` `~`.
fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

/// Raw bytes kept as they are besides unreserved ones: sub-delims, `:` and `@`
/// (`/`, `;` and `%` have their own rules).
fn is_raw_ok(c: u8) -> bool {
    matches!(
        c,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b'=' | b':' | b'@'
    )
}

fn is_control(c: u8) -> bool {
    c < 0x20 || c == 0x7F
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// `%XX` with uppercase hex.
fn encoded(c: u8) -> [u8; 3] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    [b'%', HEX[usize::from(c >> 4)], HEX[usize::from(c & 0xF)]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::prefix_matches;
    use proptest::prelude::*;

    type Want = Result<(&'static str, &'static str), PathError>;

    const ROUTES: [&str; 4] = ["/", "/public", "/v1", "/v1/search"];

    fn same(p: &'static str) -> Want {
        Ok((p, p))
    }

    fn run(raw: &str, allow_params: bool) -> Result<(String, String), PathError> {
        normalize(raw, allow_params).map(|n| (n.forward.into_owned(), n.route.into_owned()))
    }

    /// Every row: input, outcome without parameters, outcome with parameters.
    #[test]
    fn normalize_table() {
        use PathError::*;
        let cases: [(&str, Want, Want); 36] = [
            (
                "/public/%2e%2e%2fv1/secret",
                Err(EncodedSeparator),
                Err(EncodedSeparator),
            ),
            (
                "/public/..%2fv1",
                Err(EncodedSeparator),
                Err(EncodedSeparator),
            ),
            (
                "/public/%2E%2E%2Fv1",
                Err(EncodedSeparator),
                Err(EncodedSeparator),
            ),
            ("/public/..;/v1/x", Err(DotSegment), Err(DotSegment)),
            ("/public/.;/v1", Err(DotSegment), Err(DotSegment)),
            ("/public/%2e%2e;x/v1", Err(DotSegment), Err(DotSegment)),
            ("/v1//search", same("/v1/search"), same("/v1/search")),
            ("/v1/%73earch", same("/v1/search"), same("/v1/search")),
            (
                "/v1/search;x",
                Err(PathParameter),
                Ok(("/v1/search;x", "/v1/search")),
            ),
            (
                "/v1;a=1/search;b",
                Err(PathParameter),
                Ok(("/v1;a=1/search;b", "/v1/search")),
            ),
            (
                "/v1/;x/search",
                Err(PathParameter),
                Ok(("/v1/;x/search", "/v1/search")),
            ),
            (
                "/v1/search%3Bx",
                same("/v1/search%3Bx"),
                same("/v1/search%3Bx"),
            ),
            ("/a/%5Cb", Err(EncodedSeparator), Err(EncodedSeparator)),
            ("/a\\b", Err(Backslash), Err(Backslash)),
            ("/a/%00b", Err(ControlChar), Err(ControlChar)),
            ("/a/\tb", Err(ControlChar), Err(ControlChar)),
            ("/a/%7F", Err(ControlChar), Err(ControlChar)),
            ("/a/%zz", Err(BadEscape), Err(BadEscape)),
            ("/a/%4", Err(BadEscape), Err(BadEscape)),
            ("/%7e/x", same("/~/x"), same("/~/x")),
            ("/caf%c3%a9", same("/caf%C3%A9"), same("/caf%C3%A9")),
            ("/café", same("/caf%C3%A9"), same("/caf%C3%A9")),
            ("/a b", same("/a%20b"), same("/a%20b")),
            ("/a?b#c", same("/a%3Fb%23c"), same("/a%3Fb%23c")),
            (
                "/a/%252e%252e/b",
                same("/a/%252e%252e/b"),
                same("/a/%252e%252e/b"),
            ),
            ("/v1/", same("/v1/"), same("/v1/")),
            ("/", same("/"), same("/")),
            ("//", same("/"), same("/")),
            ("*", Err(NotOrigin), Err(NotOrigin)),
            ("", Err(NotOrigin), Err(NotOrigin)),
            (
                "/v1/file.json",
                same("/v1/file.json"),
                same("/v1/file.json"),
            ),
            ("/v1/...x", same("/v1/...x"), same("/v1/...x")),
            ("/a/./b", Err(DotSegment), Err(DotSegment)),
            ("/a/../b", Err(DotSegment), Err(DotSegment)),
            ("/%2e", Err(DotSegment), Err(DotSegment)),
            ("/a/%2E/b", Err(DotSegment), Err(DotSegment)),
        ];
        for (raw, strict, params) in cases {
            let own = |w: Want| w.map(|(f, r)| (f.to_owned(), r.to_owned()));
            assert_eq!(run(raw, false), own(strict), "{raw:?} without params");
            assert_eq!(run(raw, true), own(params), "{raw:?} with params");
        }
    }

    /// The limit applies to the normalized length, not the raw one.
    #[test]
    fn too_long() {
        let at_limit = format!("/{}", "a".repeat(MAX_PATH - 1));
        assert!(normalize(&at_limit, false).is_ok());
        let over = format!("/{}", "a".repeat(MAX_PATH));
        assert_eq!(normalize(&over, false), Err(PathError::TooLong));
        let encoded_over = format!("/{}", " ".repeat(MAX_PATH / 3 + 1));
        assert_eq!(normalize(&encoded_over, false), Err(PathError::TooLong));
        let slashes = format!("/a{}", "/".repeat(MAX_PATH * 2));
        assert_eq!(run(&slashes, false), Ok(("/a/".into(), "/a/".into())));
    }

    /// A path that is already canonical is returned without allocating.
    #[test]
    fn normalized_input_is_borrowed() {
        let cases = [
            ("/v1/search", false),
            ("/v1/search/", true),
            ("/caf%C3%A9/%252e", false),
            ("/v1/search;jsessionid=1", true),
        ];
        for (raw, allow_params) in cases {
            let n = normalize(raw, allow_params).unwrap();
            assert!(matches!(n.forward, Cow::Borrowed(_)), "{raw} forward");
            assert!(matches!(n.route, Cow::Borrowed(_)), "{raw} route");
        }
    }

    /// Decodes every `%XX` once (lossy for non-UTF-8 results).
    fn decode_once(path: &str) -> String {
        let b = path.as_bytes();
        let (mut out, mut i) = (Vec::with_capacity(b.len()), 0);
        while i < b.len() {
            let pair = (b.get(i + 1).copied(), b.get(i + 2).copied());
            match (b[i], pair.0.and_then(hex), pair.1.and_then(hex)) {
                (b'%', Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 3;
                }
                (c, _, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Merges repeated slashes, then resolves `.` and `..` segments (RFC 3986 5.2.4).
    fn merge_and_resolve(path: &str) -> String {
        let mut out: Vec<&str> = Vec::new();
        let segs: Vec<&str> = path.split('/').skip(1).collect();
        let last = segs.len().saturating_sub(1);
        for (i, seg) in segs.iter().enumerate() {
            match *seg {
                "" if i < last => {}
                "." | ".." => {
                    if *seg == ".." {
                        out.pop();
                    }
                    if i == last {
                        out.push("");
                    }
                }
                s => out.push(s),
            }
        }
        format!("/{}", out.join("/"))
    }

    /// What nginx serves: decode once, merge slashes, resolve dot segments.
    fn nginx_decode(path: &str) -> String {
        merge_and_resolve(&decode_once(path))
    }

    /// What a servlet container serves: strip `;params`, then as nginx.
    fn servlet_decode(path: &str) -> String {
        let stripped: Vec<&str> = path
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or(""))
            .collect();
        nginx_decode(&stripped.join("/"))
    }

    /// The longest route prefix matching `path`.
    fn pick(path: &str) -> &'static str {
        ROUTES
            .iter()
            .copied()
            .filter(|p| prefix_matches(p, path))
            .max_by_key(|p| p.len())
            .unwrap_or("/")
    }

    #[test]
    fn upstream_models() {
        assert_eq!(nginx_decode("/public/%2e%2e%2fv1/secret"), "/v1/secret");
        assert_eq!(nginx_decode("/a//b/./c/../d/"), "/a/b/d/");
        assert_eq!(servlet_decode("/public/..;x/v1;y/search"), "/v1/search");
        assert_eq!(pick("/v1/searchx"), "/v1");
    }

    /// '/' + tokens of a hostile alphabet; the tokens that build routable, accepted
    /// paths are drawn more often, so that most cases reach the routing assertions.
    fn hostile_path() -> impl Strategy<Value = String> {
        const COMMON: &[&str] = &[
            "/", "//", ";", ";x", "a", "v1", "public", "search", "secret", "%73", "%76%31", "~",
            "%7e",
        ];
        const DOTS: &[&str] = &[".", "..", "%2e", "%2E"];
        const RARE: &[&str] = &[
            "%2f", "%2F", "%5c", "\\", "%3b", "%3B", "%25", "%252e", "%2", "%zz", "%00", " ", "é",
        ];
        let token = prop_oneof![
            4 => prop::sample::select(COMMON),
            1 => prop::sample::select(DOTS),
            1 => prop::sample::select(RARE),
        ];
        prop::collection::vec(token, 0..12).prop_map(|t| format!("/{}", t.concat()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Accepted paths are fixed points.
        #[test]
        fn idempotent(path in hostile_path(), allow_params in any::<bool>()) {
            if let Ok(n) = normalize(&path, allow_params) {
                let again = run(&n.forward, allow_params);
                prop_assert_eq!(again, Ok((n.forward.to_string(), n.route.to_string())));
            }
        }

        /// The route we pick is the route the upstream serves, with no escape from it.
        #[test]
        fn routes_like_upstream(path in hostile_path(), allow_params in any::<bool>()) {
            if let Ok(n) = normalize(&path, allow_params) {
                let served = if allow_params {
                    servlet_decode(&n.forward)
                } else {
                    prop_assert_eq!(&n.route, &n.forward);
                    nginx_decode(&n.forward)
                };
                let chosen = pick(&n.route);
                prop_assert_eq!(chosen, pick(&served), "{} served as {}", n.forward, served);
                prop_assert!(prefix_matches(chosen, &served), "{} escapes {}", served, chosen);
                // Stronger: the upstream's own merging and dot resolution find nothing to do.
                prop_assert_eq!(&served, &decode_once(&n.route), "{}", n.forward);
            }
        }
    }

    proptest! {
        /// Never panics; whatever is accepted is a fixed point.
        #[test]
        fn arbitrary_strings(s in any::<String>(), allow_params in any::<bool>()) {
            for p in [s.clone(), format!("/{s}")] {
                if let Ok(n) = normalize(&p, allow_params) {
                    let again = run(&n.forward, allow_params).map(|m| m.0);
                    prop_assert_eq!(again, Ok(n.forward.to_string()));
                }
            }
        }

        /// Never panics on arbitrary bytes (lossily decoded).
        #[test]
        fn arbitrary_bytes(b in prop::collection::vec(any::<u8>(), 0..64), p in any::<bool>()) {
            let s = String::from_utf8_lossy(&b);
            let _ = normalize(&s, p);
            let _ = normalize(&format!("/{s}"), p);
        }
    }
}
