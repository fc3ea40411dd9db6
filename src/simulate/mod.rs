//! The policy simulator (`throttle simulate`): replays a trace of requests through a
//! candidate config on simulated time and counts what would have been allowed and
//! rejected, per scope and per tenant.
//!
//! It runs the gateway's own code, not a model of it: every row goes through
//! `admission::admit` over a `MemoryStore` on a `ManualClock` set to the row's time, so the
//! algorithms, the layering (ip -> key -> tenant -> global, all-or-nothing), auth, blocks,
//! shadow mode and `[limits.auth]` are those of a gateway. Like the proxy, a row is routed
//! by its host (`target::parse_authority`) and its path normalized by `path::normalize`
//! (`[server] path_parameters` applies). No network, Redis or database is touched: a config
//! naming them is simulated on the same limits, exact, never divided by instances (the
//! local fallback) and without leases (which never admit more than the limit anyway).
//!
//! Rows are replayed in time order: a stable sort, so rows of one millisecond keep their
//! file order and a trace merged from several gateways' logs needs no preparation. A
//! `key_id` row presents the key of that id (a stand-in secret mapped to the same
//! `KeyInfo`, which no client could send); an unknown id is refused `invalid_api_key`,
//! like an unknown key. A `cost` cell overrides the route's cost. Requests end at once:
//! nothing is held between rows.

mod report;
mod trace;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Read;
use std::sync::Arc;

use futures_util::FutureExt;
use sha2::{Digest, Sha256};

pub use self::report::{Counts, Report, ScopeCounts};
use self::trace::{Key, Row};
use crate::adaptive::Factor;
use crate::admission::{self, Core, Dynamic, Rejection, Runtime};
use crate::clock::ManualClock;
use crate::config::{Auth, Config, PathParameters};
use crate::edge::{self, target};
use crate::identity::{validate_key, KeyInfo, KeyTable, Presented};
use crate::limiter::Scope;
use crate::metrics::Metrics;
use crate::store::{Ending, MemoryStore};

/// Rows between two sweeps of expired limiter state (bounds memory on long traces;
/// a sweep drops only state that is back to its initial value, so decisions are equal).
const SWEEP_EVERY: usize = 65_536;

/// Why a trace could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A line of the trace cannot be read (the header is line 1).
    #[error("line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The replay could not be set up (or the pipeline waited, which a memory store
    /// never makes it do).
    #[error("{0}")]
    Setup(String),
}

/// Replays `trace` (CSV, see the module docs) through `config`'s limits.
///
/// # Errors
/// `SimError::Line` naming the first unreadable line; `SimError::Setup` when the config's
/// runtime cannot be built.
pub fn simulate(config: &Config, trace: impl Read) -> Result<Report, SimError> {
    run(config, trace).map(|(report, _)| report)
}

/// `simulate`, also answering the pipeline it ran (its metrics, for tests).
///
/// Rows are replayed in time order through a window of `REORDER` rows: a trace merged
/// from several gateways' logs may be slightly out of order, but memory stays bounded
/// however long the trace; a row earlier than one already replayed is an error naming it.
fn run(config: &Config, trace: impl Read) -> Result<(Report, Replay), SimError> {
    let replay = Replay::new(config)?;
    let mut report = Report::default();
    let mut pending = BinaryHeap::new();
    let mut replayed = 0usize;
    let mut last_ms = 0u64;
    let mut play = |row: Row, report: &mut Report| -> Result<(), SimError> {
        if replayed % SWEEP_EVERY == SWEEP_EVERY - 1 {
            replay.store.sweep_at(row.time_ms);
        }
        replayed += 1;
        replay.row(&row, report)
    };
    for (seq, row) in trace::Rows::new(trace)?.enumerate() {
        let row = row?;
        if row.time_ms < last_ms {
            return Err(SimError::Line {
                line: row.line,
                reason: format!(
                    "time is earlier than a row more than {REORDER} rows before it: sort the trace by time"
                ),
            });
        }
        pending.push(Reverse(Pending(row.time_ms, seq, row)));
        if pending.len() > REORDER {
            if let Some(Reverse(Pending(t, _, row))) = pending.pop() {
                last_ms = t;
                play(row, &mut report)?;
            }
        }
    }
    while let Some(Reverse(Pending(_, _, row))) = pending.pop() {
        play(row, &mut report)?;
    }
    Ok((report, replay))
}

/// Rows held back to be replayed in time order, at most this many.
const REORDER: usize = 65_536;

/// A row waiting in the reorder window, ordered by (time, position in the file).
struct Pending(u64, usize, Row);

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.0, self.1) == (other.0, other.1)
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(other.0, other.1))
    }
}

/// A gateway's pipeline on simulated time.
struct Replay {
    core: Core,
    clock: ManualClock,
    store: Arc<MemoryStore<ManualClock>>,
}

// === impl Replay ===

impl Replay {
    fn new(config: &Config) -> Result<Self, SimError> {
        let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
        let runtime = Runtime::from_config(config.clone()).map_err(|e| setup(&e))?;
        // `key_id` rows present a stand-in secret per config key, held where database keys
        // live (the pipeline looks there first); the NUL makes it one no client can send.
        let mut by_id = KeyTable::default();
        for (_, info) in runtime.keys.iter() {
            by_id.insert(Sha256::digest(stand_in(&info.key_id)).into(), info.clone());
        }
        let clock = ManualClock::at(0);
        // The gateway's bound on states, so a trace of more identities evicts as it would.
        let store = Arc::new(
            MemoryStore::with_clock(clock.clone()).with_max_states(config.store.max_states),
        );
        let metrics = Arc::new(Metrics::new().map_err(|e| setup(&e))?);
        let core = Core::with_clock(runtime, store.clone(), metrics, Arc::new(clock.clone()))
            .map_err(|e| setup(&e))?;
        core.swap_dynamic(Dynamic {
            keys: by_id,
            ..Dynamic::default()
        });
        Ok(Self { core, clock, store })
    }

    /// Decides `row` as the proxy would and counts the outcome.
    fn row(&self, row: &Row, report: &mut Report) -> Result<(), SimError> {
        self.clock.set(row.time_ms);
        report.seen(row.time_ms);
        let rt = self.core.runtime();
        let allow_params = rt.config.server.path_parameters == PathParameters::Allow;
        let id_key;
        let key = match &row.key {
            Key::None => Presented::Missing,
            Key::Api(k) => validate_key(k.as_bytes()),
            Key::Id(id) => {
                id_key = stand_in(id);
                Presented::Key(&id_key)
            }
        };
        // The proxy's order: an IP block answers 403 before a malformed target's 400.
        let method_ok = crate::config::method_forwarded(&row.method);
        let target = match method_ok {
            true => target::normalized(&row.path, allow_params),
            false => Err(Rejection::MethodNotAllowed),
        };
        let target = target.and_then(|path| {
            let host = row.host.as_deref().map(|h| target::host(h.as_bytes()));
            Ok((host.transpose()?, path))
        });
        let ask = match &target {
            Ok((host, path)) => Ok(edge::Ask {
                host: host.as_deref(),
                path: &path.route,
                method: &row.method,
                key,
                cost: row.cost,
                attrs: admission::Attrs {
                    headers: row.headers.as_ref(),
                    query: row.query.as_deref(),
                },
            }),
            Err(rejection) => Err(rejection.clone()),
        };
        let at = (rt.clone(), self.core.clock.now_ms());
        let decided = edge::admit_asked(&self.core, at, row.ip, ask)
            .now_or_never()
            .ok_or_else(|| SimError::Setup("the admission pipeline waited on its store".into()))?;
        match decided {
            Ok(mut a) => {
                let status = row.status.unwrap_or(200);
                let metrics = &self.core.metrics;
                // The answer the trace recorded: `count_on` refunds, `cost_from` settles.
                a.settle_outcome(status, metrics);
                if let Some(bytes) = row.bytes {
                    a.settle_bytes(bytes, metrics);
                }
                let shadow = a.rate.filter(|_| a.shadow_rejected).map(|g| g.scope);
                let key = a.key.as_deref();
                let tables = admission::Tables {
                    rt: &rt,
                    key,
                    route: a.route.as_deref().map(|r| &r.route),
                };
                // The scopes whose windows the request was charged in, as decided.
                let checked = a.applied.check(tables, 1);
                let scopes = checked.scopes.iter().map(|s| s.scope);
                report.admitted(scopes, key.and_then(KeyInfo::tenant_id), shadow);
                drop(checked);
                a.finish(Ending::Completed { status });
            }
            Err(refusal) => {
                let auth = refusal.route.as_ref().map(|r| r.route.auth);
                self.refused(&rt, row, refusal.rejection, auth, key, report);
            }
        }
        Ok(())
    }

    /// Counts a refusal: a 429 for its scope (and the key's tenant), anything else by name.
    fn refused(
        &self,
        rt: &Runtime,
        row: &Row,
        rejection: Rejection,
        auth: Option<Auth>,
        key: Presented<'_>,
        report: &mut Report,
    ) {
        let reason = match rejection {
            Rejection::RateLimited { governing, .. } => {
                // The tenant of a valid key the route looked at (none for `auth = "none"`).
                let dynamic = self.core.dynamic();
                let info = auth
                    .filter(|a| *a != Auth::None)
                    .and_then(|a| admission::lookup_key(rt, &dynamic, key, a).ok().flatten());
                report.rejected(
                    governing.scope,
                    info.as_deref().and_then(KeyInfo::tenant_id),
                );
                return;
            }
            Rejection::NoRoute(_) => {
                // The ip and global limits passed (and were charged) before the 404.
                let who = admission::Who::of(row.ip, None);
                let applied = admission::Applied::of(rt, who, Default::default(), Factor::ONE);
                let tables = admission::Tables {
                    rt,
                    key: None,
                    route: None,
                };
                let passed = applied.check(tables, 1);
                report.refused("no_route", passed.scopes.iter().map(|s| s.scope));
                return;
            }
            // Rows end at once, so no slot is ever in use when the next row arrives.
            Rejection::Concurrent { .. } => "concurrent",
            Rejection::Blocked(scope) => blocked(scope),
            Rejection::Banned(ban) => blocked(ban.scope),
            other => other.code(),
        };
        report.refused(reason, std::iter::empty());
    }
}

/// The refusal name of a block of `scope`.
fn blocked(scope: Scope) -> &'static str {
    match scope {
        Scope::Key => "blocked_key",
        Scope::Tenant => "blocked_tenant",
        _ => "blocked_ip",
    }
}

/// The secret a `key_id` row presents for key `id`.
fn stand_in(id: &str) -> Vec<u8> {
    let mut k = b"\0key_id\0".to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

#[cfg(test)]
mod tests;
