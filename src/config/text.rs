//! `cap`: the one way a text is cut to a byte budget (access-log fields, span
//! attributes).

/// `s` cut to at most `max` bytes at a character boundary (never inside a UTF-8
/// sequence, so the result is still text: a character that does not fit is left out
/// whole).
pub fn cap(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` cut in place to at most `max` bytes, as `cap`.
pub fn cap_in_place(s: &mut String, max: usize) {
    let keep = cap(s, max).len();
    s.truncate(keep);
}

#[cfg(test)]
mod tests {
    use super::{cap, cap_in_place};

    /// (text, budget, kept): short texts are whole, long ones end on the last whole
    /// character that fits.
    #[test]
    fn cap_cuts_at_a_character_boundary() {
        let cases: &[(&str, usize, &str)] = &[
            ("", 0, ""),
            ("", 4, ""),
            ("abc", 0, ""),
            ("abc", 2, "ab"),
            ("abc", 3, "abc"),
            ("abc", 10, "abc"),
            // `é` is two bytes, `€` three, `𝄞` four.
            ("aé", 1, "a"),
            ("aé", 2, "a"),
            ("aé", 3, "aé"),
            ("€€", 4, "€"),
            ("€€", 5, "€"),
            ("€€", 6, "€€"),
            ("𝄞", 3, ""),
            ("x𝄞y", 5, "x𝄞"),
        ];
        for &(s, max, want) in cases {
            assert_eq!(cap(s, max), want, "{s:?} to {max}");
            let mut owned = s.to_string();
            cap_in_place(&mut owned, max);
            assert_eq!(owned, want, "{s:?} to {max} in place");
        }
    }
}
