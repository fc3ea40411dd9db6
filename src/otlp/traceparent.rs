//! W3C Trace Context `traceparent` (version `00`): parsed strictly, because it is client
//! input. `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lowercase, neither id
//! all zeros; version `ff` is invalid; a later version is read by its first four fields
//! when what follows them starts with `-` (the spec's forward compatibility). Anything
//! else is not a parent: the request starts a trace of its own.

/// A parent span, as a `traceparent` header names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The trace's id.
    pub trace_id: [u8; 16],
    /// The calling span's id.
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl Parent {
    /// Whether the caller recorded its span (the `sampled` flag).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// `value` as a parent (None: malformed, or an invalid id or version).
pub fn parse(value: &[u8]) -> Option<Parent> {
    if value.len() < 55 {
        return None;
    }
    let version = hex_byte(&value[0..2])?;
    let (fixed, rest) = value.split_at(55);
    // Version 00 is exactly 55 bytes; a later one may carry more after a `-`.
    match (version, rest.first()) {
        (0xff, _) | (0, Some(_)) => return None,
        (_, Some(b)) if *b != b'-' => return None,
        _ => {}
    }
    if fixed[2] != b'-' || fixed[35] != b'-' || fixed[52] != b'-' {
        return None;
    }
    let mut trace_id = [0u8; 16];
    hex_into(&fixed[3..35], &mut trace_id)?;
    let mut span_id = [0u8; 8];
    hex_into(&fixed[36..52], &mut span_id)?;
    let flags = hex_byte(&fixed[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        flags,
    })
}

/// The `traceparent` naming span `span_id` of trace `trace_id` (its 55 ASCII bytes,
/// written without a string in between: it goes on every traced request).
pub fn format(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> [u8; 55] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
    for (i, b) in trace_id.iter().chain(span_id).enumerate() {
        // The span id starts after the trace id's 32 digits and a `-`.
        let at = 3 + 2 * i + usize::from(i >= 16);
        out[at] = HEX[usize::from(b >> 4)];
        out[at + 1] = HEX[usize::from(b & 15)];
    }
    if sampled {
        out[54] = b'1';
    }
    out
}

/// Lowercase hex digits into `out` (exactly twice its length).
fn hex_into(digits: &[u8], out: &mut [u8]) -> Option<()> {
    for (pair, byte) in digits.chunks_exact(2).zip(out.iter_mut()) {
        *byte = hex_byte(pair)?;
    }
    Some(())
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(pair[0])? << 4 | digit(pair[1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// The spec's example parses, round-trips and is sampled.
    #[test]
    fn the_spec_example() {
        let p = parse(GOOD.as_bytes()).unwrap();
        assert!(p.sampled());
        assert_eq!(p.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert_eq!(&format(&p.trace_id, &p.span_id, true)[..], GOOD.as_bytes());
        assert_eq!(
            &format(&p.trace_id, &p.span_id, false)[..],
            GOOD.replace("-01", "-00").as_bytes()
        );
    }

    /// What is not a parent, and what a later version may add.
    #[test]
    fn table() {
        let cases: &[(&str, bool)] = &[
            (GOOD, true),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                true,
            ),
            // Uppercase hex, zero ids, version ff, bad separators, short, long v00.
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                false,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                false,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                false,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                false,
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                false,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                false,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                false,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                false,
            ),
            ("", false),
            ("zz", false),
            // A later version: its first four fields, then `-...`.
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what",
                true,
            ),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                true,
            ),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                false,
            ),
        ];
        for (v, ok) in cases {
            assert_eq!(parse(v.as_bytes()).is_some(), *ok, "{v}");
        }
    }

    /// No input panics (every byte at every position of a valid header).
    #[test]
    fn no_input_panics() {
        for at in 0..GOOD.len() {
            for b in [0u8, b'-', b'f', 0xff, b' '] {
                let mut v = GOOD.as_bytes().to_vec();
                v[at] = b;
                let _ = parse(&v);
                let _ = parse(&v[..at]);
            }
        }
    }
}
