//! Where limiter state lives.
//!
//! One trait, `LimitStore`, with the embedded `MemoryStore` today and Redis behind the
//! same interface later. A store owns atomicity: the layered check of one request is
//! all-or-nothing even when many threads (or gateways) check the same identities at once.
//! "Over limit" is a `Verdict`, never an error: `StoreError` means the store failed.

pub mod breaker;
pub mod memory;
pub mod redis;
pub mod tiered;

use async_trait::async_trait;

use crate::limiter::{Check, Verdict};

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
}
