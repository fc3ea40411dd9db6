//! `count_on`: the upstream outcomes a scope table counts. A request is admitted against
//! the table as usual; at the answer, a status outside the set refunds that table's
//! reserve (`Admission::settle_outcome`).

/// A set of HTTP statuses (100 to 599): codes, or whole classes (`"4xx"`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusSet([u64; 10]);

impl StatusSet {
    /// The set of `items`: each a status code from 100 to 599 (`"401"`) or a class from
    /// `"1xx"` to `"5xx"`. At least one item, none repeated (a code inside a listed class
    /// is a repeat too).
    ///
    /// # Errors
    /// Why the list is not a set of statuses.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self, String> {
        if items.is_empty() {
            return Err("count_on must list at least one status or class".into());
        }
        let mut set = StatusSet([0; 10]);
        for item in items {
            let item = item.as_ref();
            let codes = codes(item).ok_or_else(|| {
                format!("count_on: {item:?} is not a status (100 to 599) or a class (\"1xx\" to \"5xx\")")
            })?;
            for code in codes {
                if set.contains(code) {
                    return Err(format!("count_on: {item:?} is listed twice"));
                }
                set.insert(code);
            }
        }
        Ok(set)
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        let (w, b) = (usize::from(status / 64), status % 64);
        self.0.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    fn insert(&mut self, status: u16) {
        let (w, b) = (usize::from(status / 64), status % 64);
        if let Some(word) = self.0.get_mut(w) {
            *word |= 1 << b;
        }
    }
}

impl std::fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries((100..600).filter(|s| self.contains(*s)))
            .finish()
    }
}

/// The codes `item` names: one code, or the hundred of a class.
fn codes(item: &str) -> Option<std::ops::Range<u16>> {
    let b = item.as_bytes();
    if b.len() != 3 || !(b'1'..=b'5').contains(&b[0]) {
        return None;
    }
    let class = u16::from(b[0] - b'0') * 100;
    if b[1..].eq_ignore_ascii_case(b"xx") {
        return Some(class..class + 100);
    }
    if !b[1..].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let code = class + u16::from(b[1] - b'0') * 10 + u16::from(b[2] - b'0');
    Some(code..code + 1)
}

#[cfg(test)]
mod tests {
    use super::StatusSet;

    #[test]
    fn codes_and_classes_match() {
        let s = StatusSet::parse(&["401", "403", "5xx"]).unwrap();
        for yes in [401, 403, 500, 503, 599] {
            assert!(s.contains(yes), "{yes}");
        }
        for no in [100, 200, 400, 402, 404, 499, 600, 0, 1000, u16::MAX] {
            assert!(!s.contains(no), "{no}");
        }
        let all = StatusSet::parse(&["1xx", "2XX", "3xx", "4xx", "5xx"]).unwrap();
        assert!((100..600).all(|c| all.contains(c)));
        assert!(!all.contains(99) && !all.contains(600));
    }

    #[test]
    fn bad_lists_say_why() {
        let empty: [&str; 0] = [];
        assert!(StatusSet::parse(&empty)
            .unwrap_err()
            .contains("at least one"));
        for bad in [
            "99", "600", "099", "6xx", "0xx", "4x", "4xxx", "abc", "", " 401", "40x", "+40",
        ] {
            let e = StatusSet::parse(&[bad]).unwrap_err();
            assert!(e.contains("is not a status"), "{bad}: {e}");
        }
        for dup in [
            &["401", "401"][..],
            &["4xx", "401"],
            &["401", "4xx"],
            &["5xx", "5XX"],
        ] {
            let e = StatusSet::parse(dup).unwrap_err();
            assert!(e.contains("listed twice"), "{dup:?}: {e}");
        }
        assert!(StatusSet::parse(&["100", "599"]).is_ok());
    }
}
