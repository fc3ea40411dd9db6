//! What the pipeline needs of a store that shares automatic bans across a fleet
//! (`BanStore`), and the values it exchanges. The Redis store implements it
//! (`store::redis::bans`); without one, every gateway's own count decides and its bans
//! hold on it alone.

use async_trait::async_trait;

use super::StoreError;
use crate::bans::{Ban, BanSource};
use crate::limiter::{Ident, Scope};

/// How far a gateway's copy of the fleet's bans is: the log's epoch and the last change
/// applied. The default (never synced) reads the whole table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BanCursor {
    pub(super) epoch: String,
    pub(super) seq: i64,
}

/// What a ban sync read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BanRead {
    /// Every ban in force (first sync, the log made anew, or fallen behind it).
    Full(Vec<(Ident, Ban)>),
    /// What changed since the cursor: bans set (new or renewed) and identities lifted.
    Changes {
        /// Bans set.
        set: Vec<(Ident, Ban)>,
        /// Bans lifted.
        lifted: Vec<(Scope, Ident)>,
    },
}

/// What publishing a ban did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// It is the fleet's ban.
    Set,
    /// Refused: the fleet's table holds `bans::MAX_BANS` bans in force, none on this
    /// identity.
    Full,
    /// Refused: a decision API's ban, and the fleet's table holds `bans::MAX_CHECK_BANS`
    /// of theirs in force, none on this identity.
    ChecksFull,
    /// The identity is banned already (that ban is kept).
    InForce(Ban),
}

/// Automatic bans shared by a fleet: the rejection counts behind them, the table of bans
/// in force and its change log. Every call is a round trip under the store's deadline;
/// the request path only spawns them.
#[async_trait]
pub trait BanStore: Send + Sync + 'static {
    /// Adds `n` rejections of `ident` by `scope` to the fleet's count in the current span
    /// of `within_ms` (which starts with the first of them); the count after it. Far
    /// below zero while the identity is banned (see `quiet_strikes`).
    ///
    /// # Errors
    /// When the store fails or misses the deadline.
    async fn strike(
        &self,
        scope: Scope,
        ident: &Ident,
        n: u32,
        within_ms: u64,
    ) -> Result<i64, StoreError>;

    /// Keeps the strike count of `ident` in `scope` quiet until `until_ms` (its ban's
    /// end): rejections meanwhile count for nothing, and the first one after the ban
    /// starts a new span.
    ///
    /// # Errors
    /// When the store fails or misses the deadline.
    async fn quiet_strikes(
        &self,
        scope: Scope,
        ident: &Ident,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError>;

    /// Publishes `ban` (struck by `source`) to the fleet at `now_ms`, unless the identity
    /// is banned already or the fleet's table (or a decision API's half of it) is full.
    ///
    /// # Errors
    /// When the store fails or misses the deadline.
    async fn publish_ban(
        &self,
        ban: &Ban,
        now_ms: u64,
        source: BanSource,
    ) -> Result<Published, StoreError>;

    /// Lifts `ban` fleet-wide; the identity's rejections are then counted afresh.
    ///
    /// # Errors
    /// When the store fails or misses the deadline.
    async fn lift_ban(&self, ban: &Ban) -> Result<(), StoreError>;

    /// What changed in the fleet's bans since `cursor`, which then names this read (left
    /// as it was on an error).
    ///
    /// # Errors
    /// When the store fails or misses the deadline.
    async fn sync_bans(&self, cursor: &mut BanCursor, now_ms: u64) -> Result<BanRead, StoreError>;
}
