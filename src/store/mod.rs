//! Where limiter state lives.
//!
//! One trait, `LimitStore`: the embedded `MemoryStore`, `RedisStore`, and `TieredStore`
//! (Redis with its failure policy); and `BanStore`, what sharing automatic bans across a
//! fleet takes (`RedisStore`). A store owns atomicity: the layered check of one request is
//! all-or-nothing even when many threads (or gateways) check the same identities at once.
//! "Over limit" is a `Verdict`, never an error: `StoreError` means the store failed.

pub mod bans;
pub mod breaker;
pub mod home;
pub mod memory;
pub mod redis;
pub mod slots;
pub mod tiered;

use async_trait::async_trait;

use self::slots::{Acquired, SlotLease, SlotRequest};
use crate::limiter::{Check, DecidedAt, Verdict};

pub use self::bans::BanStore;
pub use self::redis::RedisStore;
pub use memory::MemoryStore;
pub use tiered::TieredStore;

/// The store could not decide.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The call missed its deadline.
    #[error("store call timed out after {0} ms")]
    Timeout(u64),
    /// The store is unreachable or answered with an error.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The circuit breaker is open: the store was not called.
    #[error("store circuit open")]
    CircuitOpen,
}

/// What an admitted request holds in the store until it ends: the cost it reserved and
/// its concurrency slots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Units the request spent in every window it was charged.
    pub cost: u32,
    /// Its concurrency slots (empty: none), given back by `finish`.
    pub slots: SlotLease,
}

/// How an admitted request ended (see `admission::Admission::finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A response was sent to the client (the upstream's, or an answer of the gateway).
    Completed {
        /// The status sent.
        status: u16,
    },
    /// The upstream failed (connect, timeout, broken response); the gateway answered 5xx.
    UpstreamFailed,
    /// The client went away before the response was complete.
    ClientGone,
    /// The request state was dropped without an ending (a bug, or a task cancelled);
    /// what it held is given back all the same.
    Dropped,
}

/// A shared home for limiter state.
#[async_trait]
pub trait LimitStore: Send + Sync + 'static {
    /// Applies `check` to every window of every scope, all-or-nothing: charges every
    /// window when all allow, none otherwise.
    ///
    /// # Errors
    /// `StoreError` when the store cannot decide (never for "over limit").
    async fn check(&self, check: &Check<'_>) -> Result<Verdict, StoreError>;

    /// A stable label for metrics and logs ("memory", "redis").
    fn name(&self) -> &'static str;

    /// Whether the store answered its last call. Default: always healthy.
    fn healthy(&self) -> bool {
        true
    }

    /// The fleet size the local fallback divides limits by. Default: none (no fallback).
    fn instances(&self) -> Option<u32> {
        None
    }

    /// Decides `check` at once, without a round trip, when the store can (memory: always;
    /// Redis: leases in hand, the over-limit cache); None: ask `check`. Callers ask this
    /// first (`admission` does): it is synchronous and allocates nothing, and on Redis it
    /// serves before any circuit breaker, so a lease keeps serving while the store is
    /// away. `check` itself does not repeat it. Default: never.
    fn decide_locally(&self, check: &Check<'_>) -> Option<Verdict> {
        let _ = check;
        None
    }

    /// Takes one concurrency slot for each of `slots` (`concurrent = N`), all-or-nothing:
    /// `Ok(Err(full))` names a scope with all N taken, and then nothing is held. Default:
    /// no concurrency limits (test stores).
    ///
    /// # Errors
    /// `StoreError` when the store cannot decide.
    async fn acquire(&self, slots: &[SlotRequest]) -> Result<Acquired, StoreError> {
        let _ = slots;
        Ok(Ok(SlotLease::default()))
    }

    /// Settles a request's cost once its true cost is known (a route's `cost_header`):
    /// `delta` = true cost - reserved cost, applied to every window of `check` (the checks
    /// the request was admitted on, with the reserved cost). `delta > 0` charges the extra
    /// even past the limit (a debt later requests wait out); `delta < 0` refunds, never
    /// leaving a state that admits more than an exact replay of the true costs would.
    /// `decided_at` is when the store decided each scope, on its own clock, as its
    /// `Verdict` reported it (Redis: the script's `now`; a lease's grant time for a
    /// window paid from a lease): refunds use it to find the window (fixed, sliding) or
    /// log entry the charge went to, and a bucket gives back less the longer ago it was
    /// (`limiter::algorithm::refund_units`). A
    /// refund never exceeds the reserved cost; a debt is charged at the settle's time,
    /// capped at `limiter::algorithm::max_debt`. Must not block: a round trip is
    /// spawned. Default: nothing (test stores).
    fn settle(&self, check: &Check<'_>, delta: i64, decided_at: DecidedAt) {
        let _ = (check, delta, decided_at);
    }

    /// Called exactly once for every admitted request when it ends, with what it holds
    /// (its slots go back here, and slots of a request another check refused).
    /// Must not block: work that needs a round trip is spawned. Default: nothing to do.
    fn finish(&self, held: Held, ending: Ending) {
        let _ = (held, ending);
    }
}
