//! The wire format of the sync loop's script (`lua/regions.lua`, which states the same
//! layout; a test below checks it): the commands that read a region's windows, grant
//! from them and merge a peer's writes, and their replies. Pure: no connection here.

use super::{LiveWindow, Stored, StoredRegion, SyncWrite};

/// ARGV values before the windows: now (or ''), op, R, this region's index, the writer's.
pub const HEADER_ARGS: usize = 5;
/// 'read': values per window (start, prev_start).
pub const READ_ARGS: usize = 2;
/// 'grant': values per window (start, end, allot, peer, amount, keep).
pub const GRANT_ARGS: usize = 6;
/// 'merge': values per window (start, end, limit, count, demand, want, granted, heard).
pub const MERGE_ARGS: usize = 8;
/// 'read' reply: values per window before the regions (own, cap, demand, prior).
pub const READ_HEAD: usize = 4;
/// 'read' reply: values per region (given, heard, count, demand, want, heard_of_mine,
/// prior).
pub const READ_PER_REGION: usize = 7;

/// The sorted set in a region's store of the windows its peers wrote (the merge script
/// adds them): how a region learns of a key only its peers saw.
pub fn index_key(prefix: &str) -> String {
    format!("{prefix}:{{regions}}:live")
}

/// A member of the index: `key|start|end|limit` (the key may hold `|`: read from the
/// right).
pub fn parse_index_member(m: &str) -> Option<LiveWindow> {
    let mut parts = m.rsplitn(4, '|');
    let limit = parts.next()?.parse().ok()?;
    let end = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    let key = parts.next()?.to_string();
    Some(LiveWindow {
        key,
        start,
        end,
        limit,
    })
}

fn header(sha: &str, keys: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(keys);
    cmd
}

fn header_args(cmd: &mut redis::Cmd, now: &str, op: &str, r: usize, me: usize, from: usize) {
    cmd.arg(now).arg(op).arg(r).arg(me).arg(from);
}

/// 'read' of `windows` in region `me` of `r`; `prev` gives each window's previous start
/// (0: none known).
pub fn read_cmd(
    sha: &str,
    now: &str,
    (r, me): (usize, usize),
    windows: &[LiveWindow],
    prev: impl Fn(&LiveWindow) -> u64,
) -> redis::Cmd {
    let mut cmd = header(sha, windows.len());
    for w in windows {
        cmd.arg(&w.key);
    }
    header_args(&mut cmd, now, "read", r, me, 0);
    for w in windows {
        cmd.arg(w.start).arg(prev(w));
    }
    cmd
}

/// One grant: `amount` of `window` to region `peer`, if the region keeps at least `keep`
/// of its cap (and, as the rule wants, only from `cap - own`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantArgs<'a> {
    /// The window.
    pub window: &'a LiveWindow,
    /// This region's allotment of the window's limit (creates the cap when absent).
    pub allot: u64,
    /// The receiving region.
    pub peer: usize,
    /// Tokens.
    pub amount: u64,
    /// What the granting region keeps for itself at least (its forecast need).
    pub keep: u64,
}

/// 'grant' of `grants` in region `me` of `r`.
pub fn grant_cmd(
    sha: &str,
    now: &str,
    (r, me): (usize, usize),
    grants: &[GrantArgs<'_>],
) -> redis::Cmd {
    let mut cmd = header(sha, grants.len());
    for g in grants {
        cmd.arg(&g.window.key);
    }
    header_args(&mut cmd, now, "grant", r, me, 0);
    for g in grants {
        cmd.arg(g.window.start)
            .arg(g.window.end)
            .arg(g.allot)
            .arg(g.peer)
            .arg(g.amount)
            .arg(g.keep);
    }
    cmd
}

/// 'merge' of `writes` (each with its window) from region `from` into the store of
/// region `to`, of `r` regions, whose index of live windows is `index`.
pub fn merge_cmd(
    sha: &str,
    now: &str,
    (r, to, from): (usize, usize, usize),
    index: &str,
    writes: &[(&LiveWindow, SyncWrite)],
) -> redis::Cmd {
    let mut cmd = header(sha, writes.len() + 1);
    cmd.arg(index);
    for (w, _) in writes {
        cmd.arg(&w.key);
    }
    header_args(&mut cmd, now, "merge", r, to, from);
    for (w, s) in writes {
        cmd.arg(w.start)
            .arg(w.end)
            .arg(w.limit)
            .arg(s.count)
            .arg(s.demand)
            .arg(s.want)
            .arg(s.granted)
            .arg(s.heard);
    }
    cmd
}

/// 'merge_keys': the same as `merge_cmd` without the index (on a Redis Cluster the
/// windows of one call share a hash tag; `index_cmd` writes the index).
pub fn merge_keys_cmd(
    sha: &str,
    now: &str,
    (r, to, from): (usize, usize, usize),
    writes: &[(&LiveWindow, SyncWrite)],
) -> redis::Cmd {
    let mut cmd = header(sha, writes.len());
    for (w, _) in writes {
        cmd.arg(&w.key);
    }
    header_args(&mut cmd, now, "merge_keys", r, to, from);
    for (w, s) in writes {
        cmd.arg(w.start)
            .arg(w.end)
            .arg(w.limit)
            .arg(s.count)
            .arg(s.demand)
            .arg(s.want)
            .arg(s.granted)
            .arg(s.heard);
    }
    cmd
}

/// The index update a 'merge' makes, apart (a Redis Cluster peer): drops the members
/// that ended by `now_ms` and adds `windows`, each scored by its end.
pub fn index_cmd(index: &str, now_ms: u64, windows: &[&LiveWindow]) -> redis::Pipeline {
    let mut p = redis::pipe();
    p.cmd("ZREMRANGEBYSCORE")
        .arg(index)
        .arg("-inf")
        .arg(now_ms)
        .ignore();
    if !windows.is_empty() {
        let add = p.cmd("ZADD").arg(index);
        for w in windows {
            add.arg(w.end)
                .arg(format!("{}|{}|{}|{}", w.key, w.start, w.end, w.limit));
        }
        add.ignore();
    }
    p
}

/// The hash tag of `key` as Redis Cluster reads it (the text between the first `{` and
/// the next `}` when not empty, else the whole key): keys with one tag share a slot.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The integers of a reply, separated by spaces (an empty reply: none; anything else
/// that is not an integer: None).
pub fn ints(raw: &[u8]) -> Option<Vec<i64>> {
    let text = std::str::from_utf8(raw).ok()?;
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(' ').map(|f| f.parse().ok()).collect()
}

fn known(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

/// A 'read' reply for `n` windows of `r` regions.
pub fn parse_read(raw: &[i64], r: usize, n: usize) -> Option<Vec<Stored>> {
    let per = READ_HEAD + READ_PER_REGION * r;
    if raw.len() != per * n {
        return None;
    }
    let out = raw
        .chunks_exact(per)
        .map(|c| Stored {
            own: known(c[0]).unwrap_or(0),
            demand: known(c[2]).unwrap_or(0),
            prior: known(c[3]),
            regions: c[READ_HEAD..]
                .chunks_exact(READ_PER_REGION)
                .map(|f| StoredRegion {
                    given: known(f[0]).unwrap_or(0),
                    heard: known(f[1]).unwrap_or(0),
                    count: known(f[2]).unwrap_or(0),
                    demand: known(f[3]).unwrap_or(0),
                    want: known(f[4]),
                    heard_from_me: known(f[5]).unwrap_or(0),
                    prior: known(f[6]),
                })
                .collect(),
        })
        .collect();
    Some(out)
}

/// The stored cap of each window of a 'read' reply (None: the hash has none yet).
pub fn caps(raw: &[i64], r: usize) -> Vec<Option<u64>> {
    let per = READ_HEAD + READ_PER_REGION * r;
    raw.chunks_exact(per).map(|c| known(c[1])).collect()
}

/// A 'grant' or 'merge' reply for `n` windows: which were done.
pub fn parse_flags(raw: &[i64], n: usize) -> Option<Vec<bool>> {
    (raw.len() == n).then(|| raw.iter().map(|&v| v == 1).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LUA: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/regions.lua"));

    /// regions.lua reads the layout this file writes.
    #[test]
    fn lua_mirrors_the_layout() {
        let first = HEADER_ARGS + 1;
        assert!(LUA.contains(&format!("local b = {first} + (i - 1) * {READ_ARGS}")));
        assert!(LUA.contains(&format!("local b = {first} + (i - 1) * {GRANT_ARGS}")));
        assert!(LUA.contains(&format!("local b = {first} + (i - first) * {MERGE_ARGS}")));
        for op in ["'read'", "'grant'", "'merge'", "'merge_keys'"] {
            assert!(LUA.contains(op), "{op}");
        }
        // The read reply: 4 values, then 6 fields and a prior per region.
        assert!(LUA.contains("'given:', 'heard:', 'c:', 'd:', 'w:', 'h:'"));
        assert_eq!(READ_PER_REGION, 6 + 1);
    }

    #[test]
    fn hash_tags_as_redis_cluster_reads_them() {
        for (key, tag) in [
            ("thr:{key:a}:1s", "key:a"),
            ("thr:{key:a}:1s:rg:1000", "key:a"),
            ("{a}{b}", "a"),
            ("a{}b{c}", "a{}b{c}"),
            ("a{b", "a{b"),
            ("a}b{c}", "c"),
            ("plain", "plain"),
        ] {
            assert_eq!(hash_tag(key), tag, "{key}");
        }
    }

    #[test]
    fn index_members_read_from_the_right() {
        let w = parse_index_member("thr:{w|x:a}:1s|1000|2000|30").unwrap();
        assert_eq!(w.key, "thr:{w|x:a}:1s");
        assert_eq!((w.start, w.end, w.limit), (1000, 2000, 30));
        for bad in ["", "a|1|2", "a|x|2|3", "a|1|2|-3"] {
            assert!(parse_index_member(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_read_reply_decodes_per_window_and_region() {
        // One window, two regions: own 3, cap 7, demand 9, no prior; region 0 (this
        // one) all absent, region 1 given 2, heard 1, count 4, demand 5, want 6,
        // heard_of_mine 2, prior 8.
        let raw = [3, 7, 9, -1, -1, -1, -1, -1, -1, -1, -1, 2, 1, 4, 5, 6, 2, 8];
        let s = parse_read(&raw, 2, 1).unwrap();
        assert_eq!(s[0].own, 3);
        assert_eq!(s[0].demand, 9);
        assert_eq!(s[0].prior, None);
        assert_eq!(s[0].regions[0], StoredRegion::default());
        assert_eq!(
            s[0].regions[1],
            StoredRegion {
                given: 2,
                heard: 1,
                count: 4,
                demand: 5,
                want: Some(6),
                heard_from_me: 2,
                prior: Some(8),
            }
        );
        assert_eq!(caps(&raw, 2), [Some(7)]);
        assert!(parse_read(&raw[1..], 2, 1).is_none());
        assert_eq!(parse_flags(&[1, 0], 2), Some(vec![true, false]));
        assert!(parse_flags(&[1], 2).is_none());
        assert_eq!(ints(b""), Some(vec![]));
        assert_eq!(ints(b"1 -1 0"), Some(vec![1, -1, 0]));
        assert!(ints(b"1  2").is_none() && ints(b"1 x").is_none());
    }
}
