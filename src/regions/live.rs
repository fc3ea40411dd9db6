//! The live windows a gateway syncs: the regions windows it decided or leased on, the
//! ones its peers wrote into its region's store, and the next window of one that had
//! demand (so that grants planned from the previous window's demand go out at once).
//!
//! Several gateways of one region may each sync the same window: grants are atomic in
//! the store's script (each checked against the cap there) and merges are by max, so two
//! writers of one region send the same values twice, never capacity twice. That was
//! chosen over "one writer per region" (an election, and a gap when the writer dies).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// One window of one key, as the sync loop syncs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LiveWindow {
    /// The window's state key in Redis (the fixed window's count: this region's `own`).
    pub key: String,
    /// The window's start (Unix ms): its identity.
    pub start: u64,
    /// Its end (Unix ms, exclusive).
    pub end: u64,
    /// `L`: the limit the regions share.
    pub limit: u64,
}

impl LiveWindow {
    /// The window's length (ms).
    pub fn len_ms(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// The window after this one (same length: a calendar month's next is a few days
    /// off at its end, which only lets a late write merge into a window already over).
    pub fn next(&self) -> Self {
        Self {
            key: self.key.clone(),
            start: self.end,
            end: self.end.saturating_add(self.len_ms()),
            limit: self.limit,
        }
    }
}

/// A key's live windows: (start, end, limit) each.
type Windows = Vec<(u64, u64, u64)>;

/// The bounded set of live windows, by key, pruned as windows end.
#[derive(Debug)]
pub struct Live {
    keys: Mutex<HashMap<String, Windows>>,
    max: usize,
}

impl Live {
    /// A set of at most `max` keys: past it, new keys are not synced (they keep their
    /// allotment; the bound does not depend on the sync).
    pub fn new(max: usize) -> Self {
        Self {
            keys: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// Notes `key`'s window [start, end) of limit `limit`; whether it is in the set.
    pub fn note(&self, key: &str, start: u64, end: u64, limit: u64) -> bool {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ws) = keys.get_mut(key) {
            if !ws.iter().any(|w| w.0 == start) {
                ws.push((start, end, limit));
            }
            return true;
        }
        if keys.len() >= self.max {
            return false;
        }
        keys.insert(key.to_string(), vec![(start, end, limit)]);
        true
    }

    /// Notes `w`.
    pub fn add(&self, w: &LiveWindow) -> bool {
        self.note(&w.key, w.start, w.end, w.limit)
    }

    /// The windows not over at `now_ms`, in key and start order; the others are dropped.
    pub fn windows(&self, now_ms: u64) -> Vec<LiveWindow> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.retain(|_, ws| {
            ws.retain(|w| w.1 > now_ms);
            !ws.is_empty()
        });
        let mut out: Vec<LiveWindow> = keys
            .iter()
            .flat_map(|(k, ws)| {
                ws.iter().map(|&(start, end, limit)| LiveWindow {
                    key: k.clone(),
                    start,
                    end,
                    limit,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.key, a.start).cmp(&(&b.key, b.start)));
        out
    }

    /// How many keys are in the set.
    pub fn len(&self) -> usize {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_kept_until_they_end_and_the_set_is_bounded() {
        let live = Live::new(2);
        assert!(live.note("a", 1_000, 2_000, 10));
        assert!(
            live.note("a", 1_000, 2_000, 10),
            "a window noted twice is one"
        );
        assert!(live.note("a", 2_000, 3_000, 10));
        assert!(live.note("b", 1_000, 2_000, 10));
        assert!(!live.note("c", 1_000, 2_000, 10), "past the bound");
        assert_eq!(live.windows(1_500).len(), 3);
        // At 2,000 the first windows are over: "b" goes, "a" keeps its next window.
        let left = live.windows(2_000);
        assert_eq!(
            left,
            [LiveWindow {
                key: "a".into(),
                start: 2_000,
                end: 3_000,
                limit: 10
            }]
        );
        assert_eq!(live.len(), 1);
        assert!(live.note("c", 2_000, 3_000, 10), "room again once pruned");
        assert!(live.windows(3_000).is_empty());
        assert!(live.is_empty());
    }

    #[test]
    fn the_next_window_follows_with_the_same_length() {
        let w = LiveWindow {
            key: "k".into(),
            start: 60_000,
            end: 120_000,
            limit: 7,
        };
        let n = w.next();
        assert_eq!(
            (n.start, n.end, n.limit, n.len_ms()),
            (120_000, 180_000, 7, 60_000)
        );
    }
}
