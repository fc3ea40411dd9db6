//! The validated description of a limit: scopes, windows, algorithms.
//!
//! Built once from `gateway.toml` (see `config`), shared read-only by every request.

use std::fmt;

use super::algorithm::Calendar;

pub use super::named::{Base, Named, NamedInfo, MAX_DOMAINS, MAX_NAMED};

/// Who a limit counts: the client IP, the API key, the key's tenant, or the whole fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Keyed by the resolved client IP.
    Ip,
    /// Keyed by the API key id.
    Key,
    /// Keyed by the tenant id.
    Tenant,
    /// One counter for all traffic.
    Global,
    /// Failed API key lookups, keyed by client IP (brute-force protection).
    Auth,
    /// A scope the config names: a route's table (`login.ip`), a custom scope on a
    /// request attribute or a rate-limit service domain (`rls:<domain>`; see
    /// `limiter::named`).
    Named(Named),
}

/// The length of a limit's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Window {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// The calendar month in UTC for window-aligned algorithms; 30 days for the rate-based ones.
    Month,
    /// 604 800 s: envoyproxy/ratelimit's `week` (the rate-limit service only).
    Week,
    /// 30 days aligned to the Unix epoch: envoyproxy/ratelimit's `month` (the rate-limit
    /// service only; `Month` is the calendar month).
    Days30,
    /// 365 days aligned to the Unix epoch: envoyproxy/ratelimit's `year` (the rate-limit
    /// service only).
    Year,
}

/// How a window counts. Defaults per window: token bucket for second and minute,
/// sliding-window counter for hour and day, fixed window for month.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Continuous refill at `limit / window`, capacity `limit x burst_multiplier`.
    TokenBucket,
    /// Two epoch-aligned fixed windows, the previous one weighted by its overlap.
    SlidingWindow,
    /// Epoch-aligned counter (calendar month for `1mo`).
    FixedWindow,
    /// Exact log of admitted requests over the trailing window.
    SlidingLog,
    /// A meter draining at `limit / window`; rejects when full.
    LeakyBucket,
}

/// How a window is decided on Redis (the memory store decides every request itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Admission {
    /// Leases and the over-limit cache: most requests are decided by the gateway on
    /// tokens leased from Redis, never over the limit.
    #[default]
    Auto,
    /// Every request is decided in Redis (the over-limit cache still repeats rejections).
    Exact,
}

/// `fleet`: which gateways share a window's limit (issue 37, `[regions]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Fleet {
    /// Every gateway on this region's store: the limit is this store's (the default).
    #[default]
    Local,
    /// `fleet = "regions"`: one limit across every region of `[regions]`, each region
    /// admitting within its allotment and the grants its peers sent it (`src/regions`).
    /// Fixed windows only (`throttle check` refuses the rest).
    Regions,
    /// `fleet = "home"`: every request is decided in the Redis of the identity's home
    /// region (one cross-region round trip, exact).
    Home,
}

/// What a scope does when its store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Allow the request.
    Open,
    /// Reject with 503.
    Closed,
    /// Decide locally with each limit divided by the instance count.
    #[default]
    Local,
}

/// One window of one scope: `limit` requests per `window`, counted by `algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimit {
    /// The window.
    pub window: Window,
    /// Requests (cost units) per window; at least 1.
    pub limit: u32,
    /// The counting algorithm.
    pub algorithm: Algorithm,
    /// Token-bucket capacity (`limit x burst_multiplier`, rounded down, at least `limit`);
    /// equal to `limit` for every other algorithm.
    pub capacity: u32,
    /// Upper bound (exclusive) of the per-key reset offset for day, week and month
    /// windows, in ms.
    pub jitter_ms: u64,
    /// How the window is decided on Redis (`admission`).
    pub admission: Admission,
    /// `calendar_tz` / `billing_anchor_day`: day, week and month windows of the
    /// window-aligned algorithms start at local midnight there (None: UTC, the 1st, and
    /// epoch-aligned weeks).
    pub calendar: Option<&'static Calendar>,
    /// `fleet`: who shares the limit (default: this region's store alone).
    pub fleet: Fleet,
}

/// The windows of one scope table, with its failure policy and 429 message.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeLimits {
    /// At most one limit per `Window`, ordered from shortest to longest.
    pub windows: Vec<WindowLimit>,
    /// Failure policy of the scope.
    pub on_failure: OnFailure,
    /// 429 message template (`{limit}`, `{window}`, `{retry_after}`, `{scope}`).
    pub message: Option<String>,
    /// `concurrent = N`: at most N requests of one identity in flight at once.
    pub concurrent: Option<u32>,
    /// `ban = {...}`: repeated rejections by this scope become a temporary block.
    pub ban: Option<BanRule>,
    /// `count_on = [...]`: the upstream statuses the table counts; any other outcome
    /// refunds its reserve at the answer (None: every admitted request counts).
    pub count_on: Option<super::StatusSet>,
}

/// `ban = { after, within_secs, for_secs }`: an identity rejected `after` times within
/// `within_ms` by the scope is blocked for `for_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BanRule {
    /// Rejections that trigger the ban.
    pub after: u32,
    /// The span they must fall in (ms).
    pub within_ms: u64,
    /// How long the ban lasts (ms).
    pub for_ms: u64,
    /// `from_check = true`: rejections answered by the decision APIs (`POST /v1/check`,
    /// the RLS) count too; by default only proxied requests strike.
    pub from_check: bool,
}

// === impl Scope ===

impl Scope {
    /// How many built-in scopes there are (metrics keep one series of each).
    pub const COUNT: usize = Scope::ALL.len();

    /// Every built-in scope: the four request scopes in evaluation order, then `Auth`.
    pub const ALL: [Scope; 5] = [
        Scope::Ip,
        Scope::Key,
        Scope::Tenant,
        Scope::Global,
        Scope::Auth,
    ];

    /// The name used on the wire, in metrics and in Redis keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ip => "ip",
            Scope::Key => "key",
            Scope::Tenant => "tenant",
            Scope::Global => "global",
            Scope::Auth => "auth",
            Scope::Named(n) => n.info().name,
        }
    }

    /// The scope `as_str` names (as Redis keys, ban records and query strings spell it);
    /// a named scope only once a config interned it (in this process, whether or not the
    /// running config still has it).
    pub fn parse(name: &str) -> Option<Scope> {
        Scope::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .or_else(|| Named::lookup(name).map(Scope::Named))
    }

    /// The index of a built-in scope in `Scope::ALL`; `None` for a named one.
    pub fn builtin_index(self) -> Option<usize> {
        match self {
            Scope::Ip => Some(0),
            Scope::Key => Some(1),
            Scope::Tenant => Some(2),
            Scope::Global => Some(3),
            Scope::Auth => Some(4),
            Scope::Named(_) => None,
        }
    }

    /// The route whose requests alone this scope counts (a route's scope table).
    pub fn route(self) -> Option<&'static str> {
        match self {
            Scope::Named(n) => n.info().route,
            _ => None,
        }
    }

    /// The scope a ban struck by this one is recorded under: a route's `login.ip` bans
    /// the address (`ip`), a custom scope (on a route or not) bans the attribute's value
    /// in that custom scope (a domain's scope bans in itself).
    pub fn ban_scope(self) -> Scope {
        let Scope::Named(n) = self else { return self };
        match n.info().base {
            Base::Ip => Scope::Ip,
            Base::Key => Scope::Key,
            Base::Tenant => Scope::Tenant,
            Base::Global => Scope::Global,
            Base::Custom(_) | Base::Domain(_) => n.info().unrouted.map_or(self, Scope::Named),
        }
    }

    /// The name a 429 body gives the scope: `ip` for a route's `login.ip` (the body names
    /// the route beside it), the custom scope's name for `login.user`, `rls:<domain>` for
    /// a domain.
    pub fn short_name(self) -> &'static str {
        match self {
            Scope::Named(n) => match n.info().base {
                Base::Ip => "ip",
                Base::Key => "key",
                Base::Tenant => "tenant",
                Base::Global => "global",
                Base::Custom(name) => name,
                Base::Domain(_) => n.info().unrouted.map_or(n.info().name, |u| u.info().name),
            },
            s => s.as_str(),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Window ===

impl Window {
    /// How many windows a scope table of `gateway.toml` has at most: one of each of
    /// [`Window::TABLE`].
    pub const COUNT: usize = Window::TABLE.len();

    /// Every window of a `gateway.toml` scope table, shortest first: [`Window::ALL`] and
    /// `per_week`.
    pub const TABLE: [Window; 6] = [
        Window::Second,
        Window::Minute,
        Window::Hour,
        Window::Day,
        Window::Week,
        Window::Month,
    ];

    /// The windows of a database policy row and a key's `custom_override`, shortest first
    /// (`Days30` and `Year` are the rate-limit service's, one per descriptor; `Week` is
    /// `per_week` of `gateway.toml` and the service's `week`).
    pub const ALL: [Window; 5] = [
        Window::Second,
        Window::Minute,
        Window::Hour,
        Window::Day,
        Window::Month,
    ];

    /// Nominal length in ms (30 days for `Month`).
    pub const fn period_ms(self) -> u64 {
        match self {
            Window::Second => 1_000,
            Window::Minute => 60_000,
            Window::Hour => 3_600_000,
            Window::Day => 86_400_000,
            Window::Month | Window::Days30 => 30 * 86_400_000,
            Window::Week => 7 * 86_400_000,
            Window::Year => 365 * 86_400_000,
        }
    }

    /// The wire label: `1s`, `1m`, `1h`, `1d`, `1mo` (and the service's `1w`, `30d`, `1y`).
    pub fn label(self) -> &'static str {
        match self {
            Window::Second => "1s",
            Window::Minute => "1m",
            Window::Hour => "1h",
            Window::Day => "1d",
            Window::Month => "1mo",
            Window::Week => "1w",
            Window::Days30 => "30d",
            Window::Year => "1y",
        }
    }

    /// The English noun, for messages: "second", "minute", ...
    pub fn noun(self) -> &'static str {
        match self {
            Window::Second => "second",
            Window::Minute => "minute",
            Window::Hour => "hour",
            Window::Day => "day",
            Window::Month | Window::Days30 => "month",
            Window::Week => "week",
            Window::Year => "year",
        }
    }

    /// The `gateway.toml` key: `per_second`, ...
    pub fn config_key(self) -> &'static str {
        match self {
            Window::Second => "per_second",
            Window::Minute => "per_minute",
            Window::Hour => "per_hour",
            Window::Day => "per_day",
            Window::Month => "per_month",
            Window::Week => "per_week",
            // Not in gateway.toml: the rate-limit service's YAML names these units.
            Window::Days30 => "month",
            Window::Year => "year",
        }
    }

    /// The algorithm used when the scope table names none.
    pub fn default_algorithm(self) -> Algorithm {
        match self {
            Window::Second | Window::Minute => Algorithm::TokenBucket,
            Window::Hour | Window::Day => Algorithm::SlidingWindow,
            Window::Month | Window::Week | Window::Days30 | Window::Year => Algorithm::FixedWindow,
        }
    }
}

// === impl Algorithm ===

impl Algorithm {
    /// The `gateway.toml` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }

    /// Parses the `gateway.toml` spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "token_bucket" => Algorithm::TokenBucket,
            "sliding_window" => Algorithm::SlidingWindow,
            "fixed_window" => Algorithm::FixedWindow,
            "sliding_log" => Algorithm::SlidingLog,
            "leaky_bucket" => Algorithm::LeakyBucket,
            _ => return None,
        })
    }
}

// === impl WindowLimit ===

impl WindowLimit {
    /// A limit with the window's default algorithm, no burst and no jitter.
    pub fn new(window: Window, limit: u32) -> Self {
        Self::with_algorithm(window, limit, window.default_algorithm())
    }

    /// A limit with an explicit algorithm, no burst and no jitter.
    pub fn with_algorithm(window: Window, limit: u32, algorithm: Algorithm) -> Self {
        Self {
            window,
            limit: limit.max(1),
            algorithm,
            capacity: limit.max(1),
            jitter_ms: 0,
            admission: Admission::Auto,
            calendar: None,
            fleet: Fleet::Local,
        }
    }

    /// Sets the token-bucket capacity to `limit x multiplier` (rounded down, never below the limit).
    pub fn with_burst(mut self, multiplier: f64) -> Self {
        if self.algorithm == Algorithm::TokenBucket {
            let cap = (f64::from(self.limit) * multiplier).floor();
            self.capacity = if cap.is_finite() && cap >= f64::from(self.limit) {
                cap.min(f64::from(u32::MAX)) as u32
            } else {
                self.limit
            };
        }
        self
    }

    /// Sets how the window is decided on Redis.
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Aligns the window to `calendar` (day, week and month windows of `fixed_window` and
    /// `sliding_window`; the others keep their epoch alignment, so it is not kept).
    pub fn with_calendar(mut self, calendar: Option<&'static Calendar>) -> Self {
        self.calendar = calendar.filter(|_| self.follows_calendar());
        self
    }

    /// Whether a calendar moves this window's edges: a day, week or month counted by a
    /// window-aligned algorithm.
    pub fn follows_calendar(&self) -> bool {
        matches!(self.window, Window::Day | Window::Week | Window::Month)
            && matches!(
                self.algorithm,
                Algorithm::FixedWindow | Algorithm::SlidingWindow
            )
    }

    /// `[start, end)` of this window at `now_ms` shifted by `offset_ms`, in its calendar.
    pub fn bounds(&self, now_ms: u64, offset_ms: u64) -> (u64, u64) {
        super::algorithm::bounds_in(self.window, now_ms, offset_ms, self.calendar)
    }

    /// Sets the reset jitter bound (applies to day, week and month windows only).
    pub fn with_jitter_ms(mut self, jitter_ms: u64) -> Self {
        if matches!(self.window, Window::Day | Window::Week | Window::Month) {
            self.jitter_ms = jitter_ms;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::{Base, Named, Scope};

    #[test]
    fn scope_names_round_trip() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
        }
        for bad in ["", "IP", "ip ", "concurrent", "route"] {
            assert_eq!(Scope::parse(bad), None, "{bad:?}");
        }
    }

    /// Interned named scopes of every kind parse back from their names (Redis ban
    /// records, `/v1/top?scope=`), and name their ban scope and 429 scope.
    #[test]
    fn named_scopes_parse_and_name_their_bans() {
        let custom = Scope::Named(Named::custom("p_user"));
        let table = Scope::Named(Named::intern(Some("p_login"), Base::Custom("p_user")));
        let ip = Scope::Named(Named::intern(Some("p_login"), Base::Ip));
        let domain = Scope::Named(Named::domain("p_edge"));
        for s in [custom, table, ip, domain] {
            assert_eq!(Scope::parse(s.as_str()), Some(s), "{s}");
        }
        assert_eq!(
            [table.ban_scope(), ip.ban_scope(), domain.ban_scope()],
            [custom, Scope::Ip, domain]
        );
        assert_eq!(
            [table.short_name(), ip.short_name(), domain.short_name()],
            ["p_user", "ip", "rls:p_edge"]
        );
        assert_eq!((table.route(), domain.route()), (Some("p_login"), None));
        assert_eq!(Scope::parse("p_login.p_never"), None);
    }
}
