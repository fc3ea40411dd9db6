//! The Redis wire format of Throttle's one script, in one place: key names, the ARGV
//! layout, the algorithm and window codes, and the reply. `lua/check.lua` mirrors it
//! (its header comment states the same layout; a test below checks the numbers).

use redis::ScriptInvocation;

use crate::limiter::algorithm::edges;
use crate::limiter::{
    Algorithm, DecidedAt, Decision, Ident, Scope, ScopeCheck, Window, WindowDecision, WindowLimit,
};
use crate::store::StoreError;

/// ARGV values before the windows: now (or ''), cost, mode, lease_ms (settle: delta).
pub const HEADER_ARGS: usize = 4;
/// ARGV values per window: algorithm, window, limit, capacity, period_ms, offset_ms,
/// current (refunds; settles: the admission time), want, then the lease to give back:
/// ret, tag1, tag2, size, and a calendar window's edges around the gateway's now:
/// prev_start, start, end, next_end (all 0: no calendar; see `algorithm::edges`), then a
/// `fleet = "regions"` window's regions and allot (see [`RegionArgs`]; 0 0: not one),
/// then a settle carried by the call: its reserved cost, delta and charge time (see
/// [`Carried`]; 0 0 0: none).
pub const ARGS_PER_WINDOW: usize = 21;
/// The values of [`ARGS_PER_WINDOW`] before the carried settle's.
const WINDOW_ARGS: usize = ARGS_PER_WINDOW - 3;
/// Reply values before the windows: now, all_allowed.
pub const REPLY_HEADER: usize = 2;
/// Reply values per window: allowed, remaining, current, reset_after_ms, retry_after_ms,
/// then the lease taken: granted, lease_until, tag1, tag2.
pub const REPLY_PER_WINDOW: usize = 9;

/// `ARGV[3]`: what the script does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Decide every window; charge all of them only if all allow.
    Check,
    /// Decide every window, charge nothing.
    Peek,
    /// Give back a charge (Cluster: another scope rejected the request).
    Refund,
    /// Only give back unused leased tokens.
    Return,
    /// Settle a request's cost: `ARGV[4]` is `delta` (true - reserved cost, signed) and
    /// each window's `current` the admission time.
    Settle,
}

/// A lease of one window, as the script took it: `granted` tokens charged at once,
/// usable until `until` (Redis clock), identified by its tags for giving back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grant {
    /// Tokens leased (0: none).
    pub granted: u64,
    /// When the lease ends (Unix ms, the script's clock).
    pub until: u64,
    /// Algorithm-specific identity of the lease (window start; log entry time).
    pub tag1: u64,
    /// Algorithm-specific identity of the lease (log entry total).
    pub tag2: u64,
}

/// Lease arguments of one window: tokens wanted, a lease to give back, and a settle
/// the call carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseArgs {
    /// Tokens to lease after an admitted check (0: none).
    pub want: u64,
    /// Unused tokens to give back.
    pub ret: u64,
    /// The lease they come from (its grant) ...
    pub from: Grant,
    /// A request's settle of this window, held back to go with this call (delta 0:
    /// none); the script applies it after the give-back, before deciding.
    pub settle: Carried,
}

/// An earlier request's settle of one window, carried by a later call of the same
/// identity (a 'check', or a 'return' of the expiry pass: see `Local::carry`). The script
/// applies it as a 'settle' call of that request would: `delta` (true cost - reserved
/// `cost`) at the call's `now`, a refund of the charge made at `at`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    /// The request's reserved cost.
    pub cost: u32,
    /// True cost - reserved cost (0: nothing carried).
    pub delta: i64,
    /// When the window was charged (the script's clock).
    pub at: u64,
}

impl Carried {
    /// The values sent after the window's others.
    fn args(&self) -> [i64; 3] {
        let at = i64::try_from(self.at).unwrap_or(i64::MAX);
        match self.delta {
            0 => [0; 3],
            d => [i64::from(self.cost), d, at],
        }
    }
}

/// This gateway's place among `[regions]`, for the regions windows of a call: a
/// `fleet = "regions"` fixed window is sent with `count` (R) and this region's allotment
/// of its limit, and the script admits under the region's cap instead of the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionArgs {
    /// This region's index among the sorted region names.
    pub index: usize,
    /// How many regions share a limit.
    pub count: usize,
}

impl RegionArgs {
    /// The `regions` and `allot` values of `w`: (R, this region's allotment) for a
    /// regions fixed window, else (0, 0).
    pub fn of(region: Option<Self>, w: &WindowLimit) -> [u64; 2] {
        match region {
            Some(r)
                if w.fleet == crate::limiter::Fleet::Regions
                    && w.algorithm == Algorithm::FixedWindow
                    && r.count > 0 =>
            {
                let limit = u64::from(w.limit);
                [
                    r.count as u64,
                    crate::regions::allotment(limit, r.count, r.index),
                ]
            }
            _ => [0, 0],
        }
    }
}

/// A decoded script reply.
#[derive(Debug)]
pub struct Reply {
    /// The script's clock reading (Unix ms).
    pub now: u64,
    /// Whether every window allowed (and so, in `Check` mode, was charged).
    pub all_allowed: bool,
    /// One decision per window, in the order the windows were sent.
    pub decisions: Vec<WindowDecision>,
    /// One lease per window (granted 0: none), in the same order.
    pub grants: Vec<Grant>,
}

// === impl Mode ===

impl Mode {
    /// The `ARGV[3]` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Check => "check",
            Mode::Peek => "peek",
            Mode::Refund => "refund",
            Mode::Return => "return",
            Mode::Settle => "settle",
        }
    }
}

/// The Redis key of one window of one identity: `<prefix>:{<scope>:<id>}:<window>`. The
/// hash tag holds the scope and identity, so one scope's windows share a Cluster slot.
pub fn key(prefix: &str, scope: Scope, ident: &Ident, window: Window) -> String {
    identity_key(prefix, scope, ident, window.label())
}

/// A key of one identity, `<prefix>:{<scope>:<id>}:<suffix>`: the identity is the hash
/// tag, so every key of an identity lives in one Cluster slot.
pub fn identity_key(prefix: &str, scope: Scope, ident: &Ident, suffix: &str) -> String {
    match ident {
        // `{global}` for `[limits.global]`; a route's table `{<route>.global}`.
        Ident::Global => format!("{prefix}:{{{}}}:{suffix}", scope.as_str()),
        Ident::Ip(ip) => format!("{prefix}:{{{}:{ip}}}:{suffix}", scope.as_str()),
        Ident::Net(n) => format!("{prefix}:{{{}:{n}}}:{suffix}", scope.as_str()),
        Ident::Name(n) => format!("{prefix}:{{{}:{n}}}:{suffix}", scope.as_str()),
    }
}

/// The header values: now ('' for the server clock), cost, mode, lease_ms (0: none).
pub fn push_header(
    inv: &mut ScriptInvocation<'_>,
    now: &str,
    cost: u32,
    mode: Mode,
    lease_ms: u64,
) {
    inv.arg(now).arg(cost).arg(mode.as_str()).arg(lease_ms);
}

/// One window's values, in ARGV order; `at` is the gateway's now, for a calendar
/// window's edges (the script cannot know the zone: the gateway computes them); `region`
/// this gateway's place among `[regions]` (None: every window is this region's alone).
pub fn window_args(
    w: &WindowLimit,
    ident: &Ident,
    current: u64,
    lease: &LeaseArgs,
    at: u64,
    region: Option<RegionArgs>,
) -> [u64; WINDOW_ARGS] {
    let offset = ident.offset_ms(w);
    let [prev_start, start, end, next_end] = match w.calendar {
        Some(cal) => edges(w.window, at, offset, Some(cal)),
        None => [0; 4],
    };
    let [regions, allot] = RegionArgs::of(region, w);
    [
        u64::from(algorithm_code(w.algorithm)),
        u64::from(window_code(w.window)),
        u64::from(w.limit),
        u64::from(w.capacity),
        w.window.period_ms(),
        offset,
        current,
        lease.want,
        lease.ret,
        lease.from.tag1,
        lease.from.tag2,
        lease.from.granted,
        prev_start,
        start,
        end,
        next_end,
        regions,
        allot,
    ]
}

/// Adds `s`'s windows (a key and `ARGS_PER_WINDOW` values each) to `inv`; `currents`
/// are the charges to give back (refunds), `leases` the lease arguments (else none),
/// `now` the time calendar edges are computed at (the call's `now`).
pub fn push_scope(
    inv: &mut ScriptInvocation<'_>,
    prefix: &str,
    s: &ScopeCheck<'_>,
    currents: Option<&[u64]>,
    leases: Option<&[LeaseArgs]>,
    now: u64,
) {
    for (i, w) in s.limits.windows.iter().enumerate() {
        inv.key(key(prefix, s.scope, &s.ident, w.window));
        let current = currents.and_then(|c| c.get(i)).copied().unwrap_or(0);
        let lease = leases.and_then(|l| l.get(i)).copied().unwrap_or_default();
        for v in window_args(w, &s.ident, current, &lease, now, None) {
            inv.arg(v);
        }
        for v in lease.settle.args() {
            inv.arg(v);
        }
    }
}

/// The integers of a reply (one string of integers separated by spaces).
///
/// # Errors
/// `StoreError::Unavailable` for anything else.
pub fn ints(reply: &[u8]) -> Result<Vec<i64>, StoreError> {
    let bad = || StoreError::Unavailable("unexpected script reply".into());
    let mut out = Vec::with_capacity(2 + REPLY_PER_WINDOW * 8);
    for field in reply.split(|b| *b == b' ') {
        let (neg, digits) = match field.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, field),
        };
        if digits.is_empty() || digits.len() > 18 {
            return Err(bad());
        }
        let mut n: i64 = 0;
        for d in digits {
            if !d.is_ascii_digit() {
                return Err(bad());
            }
            n = n * 10 + i64::from(d - b'0');
        }
        out.push(if neg { -n } else { n });
    }
    Ok(out)
}

/// One window of a script call: whose key, its limit, and its `current` and lease values.
#[derive(Clone, Copy)]
pub struct Win<'a> {
    /// The scope of the window's identity.
    pub scope: Scope,
    /// The identity.
    pub ident: &'a Ident,
    /// The window's limit.
    pub limit: &'a WindowLimit,
    /// `current` (refunds: the charge to give back; settles: the admission time).
    pub current: u64,
    /// The lease arguments.
    pub lease: LeaseArgs,
}

/// The time a call's calendar edges are computed at: the call's `now` when it sends one,
/// else the gateway's clock (Redis `TIME` is within a clock skew of it: the edges cover
/// the windows on both sides of `now`, see `bounds` in lua/prelude.lua).
fn gateway_now(now: &str) -> u64 {
    use crate::clock::Clock;
    now.parse()
        .unwrap_or_else(|_| crate::clock::SystemClock.now_ms())
}

/// The one encoder of the script's calls: an `EVALSHA` with every key and value in one
/// command buffer (a `ScriptInvocation` allocates per value). `sha` is the script's
/// hash, `fourth` is `ARGV[4]` (lease_ms; settle: delta), `windows` the windows in order.
pub fn evalsha<'a>(
    sha: &str,
    prefix: &str,
    header: (&str, u32, Mode),
    fourth: i64,
    windows: impl Iterator<Item = Win<'a>> + Clone,
) -> redis::Cmd {
    evalsha_in(sha, prefix, header, fourth, windows, None)
}

/// As [`evalsha`], with this gateway's place among `[regions]` for regions windows: a
/// decision admits under the region's cap and counts demand; gives back, refunds and
/// settles act on the region's own count and keep the window's hash true to it (its
/// `own`, and its demand less leased tokens given back unused).
pub fn evalsha_in<'a>(
    sha: &str,
    prefix: &str,
    (now, cost, mode): (&str, u32, Mode),
    fourth: i64,
    windows: impl Iterator<Item = Win<'a>> + Clone,
    region: Option<RegionArgs>,
) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(windows.clone().count());
    for w in windows.clone() {
        cmd.arg(key(prefix, w.scope, w.ident, w.limit.window));
    }
    cmd.arg(now).arg(cost).arg(mode.as_str()).arg(fourth);
    let at = match windows.clone().any(|w| w.limit.calendar.is_some()) {
        true => gateway_now(now),
        false => 0,
    };
    for w in windows {
        for v in window_args(w.limit, w.ident, w.current, &w.lease, at, region) {
            cmd.arg(v);
        }
        for v in w.lease.settle.args() {
            cmd.arg(v);
        }
    }
    cmd
}

/// The windows of `scopes` in order, each with `current` and lease values from `values`
/// (given the scope's index and the window's index in it).
fn scope_windows<'a, F>(
    scopes: &'a [ScopeCheck<'_>],
    values: F,
) -> impl Iterator<Item = Win<'a>> + Clone
where
    F: Fn(usize, usize) -> (u64, LeaseArgs) + Clone + 'a,
{
    scopes.iter().enumerate().flat_map(move |(i, s)| {
        let values = values.clone();
        s.limits.windows.iter().enumerate().map(move |(j, w)| {
            let (current, lease) = values(i, j);
            Win {
                scope: s.scope,
                ident: &s.ident,
                limit: w,
                current,
                lease,
            }
        })
    })
}

/// A 'check' or 'peek' call of `scopes` with `leases` (per scope, per window; else none),
/// `region` this gateway's place among `[regions]` (None: no regions windows).
#[allow(clippy::too_many_arguments)]
pub fn command(
    sha: &str,
    now: &str,
    cost: u32,
    mode: Mode,
    lease_ms: u64,
    prefix: &str,
    scopes: &[ScopeCheck<'_>],
    leases: Option<&[smallvec::SmallVec<[LeaseArgs; 2]>]>,
    region: Option<RegionArgs>,
) -> redis::Cmd {
    let lease = move |i: usize, j: usize| {
        let l = leases.and_then(|l| l.get(i)).and_then(|l| l.get(j));
        (0, l.copied().unwrap_or_default())
    };
    let fourth = i64::try_from(lease_ms).unwrap_or(i64::MAX);
    evalsha_in(
        sha,
        prefix,
        (now, cost, mode),
        fourth,
        scope_windows(scopes, lease),
        region,
    )
}

/// An `EVALSHA` settling a request whose scopes were decided at `decided_at` (the store
/// clock; each window's `current` is when that window was charged) with reserved `cost`
/// on every window of `scopes`: `delta` = true cost - `cost` (see `LimitStore::settle`).
/// `decided_at` is indexed like `scopes`.
/// The reply is "now 1".
#[allow(clippy::too_many_arguments)]
pub fn settle_command(
    sha: &str,
    now: &str,
    cost: u32,
    delta: i64,
    decided_at: DecidedAt,
    prefix: &str,
    scopes: &[ScopeCheck<'_>],
) -> redis::Cmd {
    settle_returning(
        sha,
        (now, cost, delta),
        decided_at,
        prefix,
        scopes,
        (None, None),
    )
}

/// The leases of one scope's windows, in window order.
pub type ScopeLeases = smallvec::SmallVec<[LeaseArgs; 2]>;

/// As [`settle_command`], ending leases in the same call: `leases` (per scope, per
/// window, like `scopes`) name the leftovers to give back before the settle (a debt
/// the leases in hand could not hold: see `Local::debit`); `region` this gateway's place
/// among `[regions]`.
pub fn settle_returning(
    sha: &str,
    (now, cost, delta): (&str, u32, i64),
    decided_at: DecidedAt,
    prefix: &str,
    scopes: &[ScopeCheck<'_>],
    (leases, region): (Option<&[ScopeLeases]>, Option<RegionArgs>),
) -> redis::Cmd {
    let at = move |i: usize, j: usize| {
        let l = leases.and_then(|l| l.get(i)).and_then(|l| l.get(j));
        let admitted = decided_at.of_window(scopes, i, j);
        (admitted, l.copied().unwrap_or_default())
    };
    let header = (now, cost, Mode::Settle);
    evalsha_in(
        sha,
        prefix,
        header,
        delta,
        scope_windows(scopes, at),
        region,
    )
}

/// A 'refund' call giving back `cost` on every window of `s`, charged by a call whose
/// script `now` was `now`, each window's `current` then in `currents`; `region` this
/// gateway's place among `[regions]`.
pub fn refund_command(
    (sha, prefix): (&str, &str),
    cost: u32,
    s: &ScopeCheck<'_>,
    (now, currents): (u64, &[u64]),
    region: Option<RegionArgs>,
) -> redis::Cmd {
    let current = move |_, j: usize| (currents.get(j).copied().unwrap_or(0), LeaseArgs::default());
    let now = now.to_string();
    let header = (now.as_str(), cost, Mode::Refund);
    evalsha_in(
        sha,
        prefix,
        header,
        0,
        scope_windows(std::slice::from_ref(s), current),
        region,
    )
}

/// Decodes a reply for `scopes`' windows.
///
/// # Errors
/// `StoreError::Unavailable` when the reply does not have the expected shape.
pub fn parse_reply(raw: &[i64], scopes: &[ScopeCheck<'_>]) -> Result<Reply, StoreError> {
    let windows: usize = scopes.iter().map(|s| s.limits.windows.len()).sum();
    if raw.len() != REPLY_HEADER + REPLY_PER_WINDOW * windows {
        return Err(StoreError::Unavailable(format!(
            "unexpected script reply of {} values for {windows} windows",
            raw.len()
        )));
    }
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    let mut decisions = Vec::with_capacity(windows);
    let mut grants = Vec::with_capacity(windows);
    let mut fields = raw[REPLY_HEADER..].chunks_exact(REPLY_PER_WINDOW);
    for s in scopes {
        for w in &s.limits.windows {
            let Some(f) = fields.next() else { break };
            decisions.push(WindowDecision {
                scope: s.scope,
                window: w.window,
                decision: Decision {
                    allowed: f[0] == 1,
                    limit: w.limit,
                    remaining: u32::try_from(f[1]).unwrap_or(0),
                    current: u(f[2]),
                    reset_after_ms: u(f[3]),
                    retry_after_ms: u(f[4]),
                },
            });
            grants.push(Grant {
                granted: u(f[5]),
                until: u(f[6]),
                tag1: u(f[7]),
                tag2: u(f[8]),
            });
        }
    }
    Ok(Reply {
        now: u(raw[0]),
        all_allowed: raw[1] == 1,
        decisions,
        grants,
    })
}

/// The script's algorithm codes.
pub fn algorithm_code(a: Algorithm) -> u8 {
    match a {
        Algorithm::TokenBucket => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::FixedWindow => 3,
        Algorithm::SlidingLog => 4,
        Algorithm::LeakyBucket => 5,
    }
}

/// The script's window codes.
pub fn window_code(w: Window) -> u8 {
    match w {
        Window::Second => 1,
        Window::Minute => 2,
        Window::Hour => 3,
        Window::Day => 4,
        Window::Month => 5,
        // Epoch-aligned like 1..=4 (check.lua treats every code but 5 so).
        Window::Week => 6,
        Window::Days30 => 7,
        Window::Year => 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// check.lua reads the layout this file writes, and documents the same codes.
    #[test]
    fn lua_mirrors_the_layout() {
        let lua = super::super::CHECK_LUA;
        let argv = format!(
            "local b = {} + (i - 1) * {}",
            HEADER_ARGS + 1,
            ARGS_PER_WINDOW
        );
        assert!(lua.contains(&argv), "check.lua does not read `{argv}`");
        // A regions window's R and allotment, then the carried settle (the last three).
        let regions = format!(
            "regions = tonumber(ARGV[b + {}]), allot = tonumber(ARGV[b + {}])",
            WINDOW_ARGS - 2,
            WINDOW_ARGS - 1
        );
        assert!(
            lua.contains(&regions),
            "check.lua does not read `{regions}`"
        );
        let carried = format!(
            "s_cost = tonumber(ARGV[b + {}]), s_delta = tonumber(ARGV[b + {}]),\n    s_at = tonumber(ARGV[b + {}])",
            ARGS_PER_WINDOW - 3,
            ARGS_PER_WINDOW - 2,
            ARGS_PER_WINDOW - 1
        );
        assert!(
            lua.contains(&carried),
            "check.lua does not read `{carried}`"
        );
        assert_eq!(Carried::default().args(), [0; 3], "none carried: zeros");
        let debt = Carried {
            cost: 2,
            delta: 5,
            at: 9,
        };
        assert_eq!(debt.args(), [2, 5, 9]);
        let refund = Carried {
            cost: 2,
            delta: -1,
            at: 9,
        };
        assert_eq!(refund.args(), [2, -1, 9], "signed");
        assert!(lua.contains(&format!("Then {ARGS_PER_WINDOW} values per window")));
        for m in [
            Mode::Check,
            Mode::Peek,
            Mode::Refund,
            Mode::Return,
            Mode::Settle,
        ] {
            assert!(lua.contains(&format!("'{}'", m.as_str())), "{m:?}");
        }
        for (a, name) in [
            (Algorithm::TokenBucket, "token_bucket"),
            (Algorithm::SlidingWindow, "sliding_window"),
            (Algorithm::FixedWindow, "fixed_window"),
            (Algorithm::SlidingLog, "sliding_log"),
            (Algorithm::LeakyBucket, "leaky_bucket"),
        ] {
            let doc = format!("{} {name}", algorithm_code(a));
            assert!(lua.contains(&doc), "check.lua lacks `{doc}`");
            assert!(
                lua.contains(&format!("ALG[{}] = {{", algorithm_code(a))),
                "no ALG[{}]",
                algorithm_code(a)
            );
        }
        // 'settle' reads delta from ARGV[4] and the admission time from `current`.
        assert!(lua.contains("local delta = tonumber(ARGV[4])"));
        assert!(lua.contains(".settle(KEYS[i], ws[i], now, cost, delta, ws[i].current)"));
        let reply = lua.matches("reply[#reply + 1] = fmt(d.").count()
            + lua.matches("reply[#reply + 1] = fmt(l[").count();
        assert_eq!(reply, REPLY_PER_WINDOW);
    }

    /// Only a `fleet = "regions"` fixed window, with a place among the regions, is sent
    /// as one: R and this region's allotment (they sum to the limit over the regions).
    #[test]
    fn regions_args() {
        use crate::limiter::Fleet;
        let mut w = WindowLimit {
            window: Window::Second,
            limit: 100,
            algorithm: Algorithm::FixedWindow,
            capacity: 100,
            jitter_ms: 0,
            admission: crate::limiter::Admission::Exact,
            calendar: None,
            fleet: Fleet::Regions,
        };
        let at = |index| Some(RegionArgs { index, count: 3 });
        let allots: Vec<[u64; 2]> = (0..3).map(|i| RegionArgs::of(at(i), &w)).collect();
        assert_eq!(allots, [[3, 34], [3, 33], [3, 33]]);
        assert_eq!(
            RegionArgs::of(None, &w),
            [0, 0],
            "no [regions]: a local window"
        );
        w.fleet = Fleet::Local;
        assert_eq!(RegionArgs::of(at(0), &w), [0, 0]);
        w.fleet = Fleet::Home;
        assert_eq!(RegionArgs::of(at(0), &w), [0, 0]);
        w.fleet = Fleet::Regions;
        w.algorithm = Algorithm::SlidingWindow;
        assert_eq!(RegionArgs::of(at(0), &w), [0, 0], "fixed windows only");
    }

    /// Replies are integers separated by spaces; anything else is an error.
    #[test]
    fn reply_integers() {
        assert_eq!(
            ints(b"1796070000000 1 -3 0").unwrap(),
            [1_796_070_000_000, 1, -3, 0]
        );
        for bad in [&b""[..], b"1  2", b"1 x", b"12345678901234567890", b"-"] {
            assert!(ints(bad).is_err(), "{bad:?}");
        }
    }

    /// Keys carry the scope and identity in clear, the hash tag around them.
    #[test]
    fn key_names() {
        let ip = Ident::Ip("203.0.113.7".parse().unwrap());
        assert_eq!(
            key("thr", Scope::Ip, &ip, Window::Minute),
            "thr:{ip:203.0.113.7}:1m"
        );
        let net = Ident::client("2001:db8:1:2:aaaa::7".parse().unwrap(), 64);
        assert_eq!(
            key("thr", Scope::Ip, &net, Window::Second),
            "thr:{ip:2001:db8:1:2::/64}:1s"
        );
        let k = Ident::Name("key_demo".into());
        assert_eq!(
            key("thr", Scope::Key, &k, Window::Hour),
            "thr:{key:key_demo}:1h"
        );
        assert_eq!(
            key("x", Scope::Global, &Ident::Global, Window::Second),
            "x:{global}:1s"
        );
        // A route's tables are counters of their own, `global` included.
        use crate::limiter::{Base, Named};
        let named = |base| Scope::Named(Named::intern(Some("w_login"), base));
        assert_eq!(
            key("x", named(Base::Global), &Ident::Global, Window::Second),
            "x:{w_login.global}:1s"
        );
        assert_eq!(
            key("thr", named(Base::Ip), &ip, Window::Minute),
            "thr:{w_login.ip:203.0.113.7}:1m"
        );
    }

    /// A rate-limit service domain's counters and a route `rls`'s custom table of the same
    /// name never share a Redis key.
    #[test]
    fn domain_keys_differ_from_route_tables() {
        use crate::limiter::{Base, Named};
        let counter = Ident::Name("user_alice".into());
        let domain = Scope::Named(Named::domain("w_domain"));
        let custom = Named::custom("w_domain");
        let table = Scope::Named(Named::intern(Some("rls"), Base::Custom(custom.info().name)));
        let by_domain = key("thr", domain, &counter, Window::Minute);
        assert_eq!(by_domain, "thr:{rls:w_domain:user_alice}:1m");
        let by_table = key("thr", table, &counter, Window::Minute);
        assert_eq!(by_table, "thr:{rls.w_domain:user_alice}:1m");
        let custom_key = key("thr", Scope::Named(custom), &counter, Window::Minute);
        assert_eq!(custom_key, "thr:{w_domain:user_alice}:1m");
    }
}
