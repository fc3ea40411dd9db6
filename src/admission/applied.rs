//! The limits that apply to one caller, derived in one place: `Applied::of`.
//!
//! Every consumer reads the same list: the rate check (`Applied::check`), the concurrency
//! slots (`Applied::slots`), settle and refund (the `Admission` keeps its `Applied`, so a
//! settle charges exactly the windows the request was decided on), the failure plan
//! (`Applied::on_failure`, `Applied::closed`), `/v1/usage`, `throttle simulate`, `POST /v1/check` and the
//! Envoy rate-limit service. An entry is a table that applies (it has a rate window or
//! `concurrent`; `throttle check` refuses a table with neither), with the scope it counts
//! in, the identity it counts and where its limits live (`Table`); its position is its
//! place in the list, which is the order of the check: ip, key, tenant, global, custom
//! scopes' `[limits.<name>]`, then the route's own tables.
//!
//! Scaling happens here too, once: on an adaptive route every entry's limits are
//! multiplied by the route's factor when the list is made (`limiter::scale`), and every
//! consumer reads the scaled copy.

use std::net::IpAddr;

use arrayvec::ArrayVec;

use super::core::Runtime;
use super::limits::Who;
use crate::adaptive::Factor;
use crate::config::Route;
use crate::identity::KeyInfo;
use crate::limiter::{Check, Ident, OnFailure, Scope, ScopeLimits, MAX_SCOPES};
use crate::store::slots::{SlotRequest, SlotRequests};

/// Where an entry's limits live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `[limits.ip]`.
    Ip,
    /// The key's tier's `key` table.
    Key,
    /// The tenant's tier's `tenant` table.
    Tenant,
    /// `[limits.global]`.
    Global,
    /// `[limits.<name>]` of `Config::scopes[i]`.
    Custom(u8),
    /// The route's `limits[i]`.
    Route(u8),
}

/// One table that applies to the caller.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The scope it counts in.
    pub scope: Scope,
    /// Who it counts.
    pub ident: Ident,
    /// Where its limits live.
    pub table: Table,
}

/// Shared scopes a request does not spend because another part of the same call already
/// did (the Envoy rate-limit service: one call spends `global`, and `ip` for one
/// `remote_address`, at most once, whatever its number of descriptors).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skip {
    /// Leave `[limits.global]` out.
    pub global: bool,
    /// Leave `[limits.ip]` out.
    pub ip: bool,
}

/// A part of a request's limits, each decided by its own store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The rate windows (`Applied::check`).
    Rate,
    /// The concurrency slots (`Applied::slots`).
    Slots,
}

/// Where the tables of one request are read from: its runtime config, its caller and its
/// route.
#[derive(Clone, Copy)]
pub struct Tables<'a> {
    /// The config the request is decided on.
    pub rt: &'a Runtime,
    /// The identified caller.
    pub key: Option<&'a KeyInfo>,
    /// The route.
    pub route: Option<&'a Route>,
}

/// Every table that applies to one caller, in check order (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Applied {
    entries: ArrayVec<Entry, MAX_SCOPES>,
    /// The entries' limits multiplied by the route's adaptive factor, by position (empty
    /// when the factor is 1: the tables are read as configured). A `Vec`, not inline:
    /// an `Admission` is moved several times per request, and eight inline tables made
    /// it 2 KB of copying each time for a copy only adaptive routes use.
    scaled: Vec<ScopeLimits>,
    factor: Factor,
}

// === impl Tables ===

impl<'a> Tables<'a> {
    /// The limits of `table`, when the caller has it.
    pub fn get(&self, table: Table) -> Option<&'a ScopeLimits> {
        let config = &self.rt.config;
        match table {
            Table::Ip => config.ip_limits.as_deref(),
            Table::Global => config.global_limits.as_deref(),
            Table::Key => self.key.map(|k| &*k.tier.key),
            Table::Tenant => self.key.map(|k| &*k.tenant_tier.tenant),
            Table::Custom(i) => config
                .scopes
                .get(usize::from(i))
                .and_then(|c| c.limits.as_deref()),
            Table::Route(i) => self
                .route
                .and_then(|r| r.limits.get(usize::from(i)))
                .map(|t| &*t.limits),
        }
    }
}

// === impl Applied ===

impl Applied {
    /// The tables that apply to `who` (leaving out what `skip` names), each read from
    /// `rt`, the caller's tiers and the route, their limits multiplied by `factor`.
    pub fn of(rt: &Runtime, who: Who<'_>, skip: Skip, factor: Factor) -> Self {
        let tables = Tables {
            rt,
            key: who.key,
            route: who.route,
        };
        let mut list = List {
            tables,
            entries: ArrayVec::new(),
        };
        if let (Some(ip), false) = (who.client_ip, skip.ip) {
            list.add(Scope::Ip, || client(rt, ip), Table::Ip);
        }
        if let Some(k) = who.key {
            if let Some(ident) = &k.key_ident {
                list.add(Scope::Key, || ident.clone(), Table::Key);
            }
            if let Some(ident) = &k.tenant_ident {
                list.add(Scope::Tenant, || ident.clone(), Table::Tenant);
            }
        }
        if !skip.global {
            list.add(Scope::Global, || Ident::Global, Table::Global);
        }
        let customs = rt.config.scopes.iter().zip(who.customs);
        for (i, (c, ident)) in customs.enumerate() {
            if let Some(ident) = ident {
                list.add(c.scope, || ident.clone(), Table::Custom(index(i)));
            }
        }
        if let Some(route) = who.route {
            for (i, t) in route.limits.iter().enumerate() {
                if let Some(ident) = who.ident(rt, t.counts) {
                    list.add(t.scope, || ident, Table::Route(index(i)));
                }
            }
        }
        let mut applied = Applied {
            entries: list.entries,
            scaled: Vec::new(),
            factor,
        };
        applied.scale(tables);
        applied
    }

    /// The factor the limits were multiplied by.
    pub fn factor(&self) -> Factor {
        self.factor
    }

    /// The entries, in check order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The scopes of the entries, in check order.
    pub fn scopes(&self) -> impl Iterator<Item = Scope> + '_ {
        self.entries.iter().map(|e| e.scope)
    }

    /// Whether no table applies.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The limits of entry `i` (scaled when the route adapts).
    pub fn limits<'s>(&'s self, tables: Tables<'s>, i: usize) -> Option<&'s ScopeLimits> {
        match self.scaled.get(i) {
            Some(l) => Some(l),
            None => tables.get(self.entries.get(i)?.table),
        }
    }

    /// The rate check of the entries with windows, each spending `cost`.
    pub fn check<'s>(&'s self, tables: Tables<'s>, cost: u32) -> Check<'s> {
        let mut check = Check::new(cost);
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(l) = self.limits(tables, i) {
                // `Check::push` leaves out a table without windows (concurrent only).
                check.push(e.scope, e.ident.clone(), l);
            }
        }
        check
    }

    /// The concurrency slots of the entries with `concurrent`, in check order.
    pub fn slots(&self, tables: Tables<'_>) -> SlotRequests {
        let mut out = SlotRequests::new();
        for (i, e) in self.entries.iter().enumerate() {
            let Some(l) = self.limits(tables, i) else {
                continue;
            };
            if let Some(limit) = l.concurrent {
                // Never full: `throttle check` bounds the `concurrent` tables of a request.
                let _ = out.try_push(SlotRequest {
                    scope: e.scope,
                    ident: e.ident.clone(),
                    limit,
                    on_failure: l.on_failure,
                });
            }
        }
        out
    }

    /// The 429 message template of the entry counting in `scope`.
    pub fn message(&self, tables: Tables<'_>, scope: Scope) -> Option<String> {
        let i = self.entries.iter().position(|e| e.scope == scope)?;
        self.limits(tables, i)?.message.clone()
    }

    /// The failure plan of one part of the request (its rate windows, or its concurrency
    /// slots): each entry of that part with its scope and what it does when its store
    /// cannot be reached (`closed` refuses the request with 503, `open` skips the scope,
    /// `local` decides it in this process). The stores apply it (`TieredStore`); the
    /// pipeline counts it.
    pub fn on_failure<'s>(
        &'s self,
        tables: Tables<'s>,
        part: Part,
    ) -> impl Iterator<Item = (Scope, OnFailure)> + 's {
        (0..self.entries.len()).filter_map(move |i| {
            let l = self.limits(tables, i)?;
            let in_part = match part {
                Part::Rate => !l.windows.is_empty(),
                Part::Slots => l.concurrent.is_some(),
            };
            in_part.then_some((self.entries[i].scope, l.on_failure))
        })
    }

    /// The scopes of `part` that fail closed.
    pub fn closed<'s>(
        &'s self,
        tables: Tables<'s>,
        part: Part,
    ) -> impl Iterator<Item = Scope> + 's {
        self.on_failure(tables, part)
            .filter(|(_, f)| *f == OnFailure::Closed)
            .map(|(s, _)| s)
    }

    /// The scaled copies, when the factor is not 1.
    fn scale(&mut self, tables: Tables<'_>) {
        if self.factor.is_one() {
            return;
        }
        let factor = self.factor;
        self.scaled.reserve_exact(self.entries.len());
        for e in &self.entries {
            let Some(l) = tables.get(e.table) else {
                return; // unreachable: every entry was added with its table
            };
            self.scaled
                .push(crate::limiter::scale::scaled(l, |n| factor.apply(n)));
        }
    }
}

/// The entries being collected, with where their tables are read from.
struct List<'a> {
    tables: Tables<'a>,
    entries: ArrayVec<Entry, MAX_SCOPES>,
}

impl List<'_> {
    /// Adds `table` as `scope` counting `ident()`, when the caller has the table, it
    /// applies (a window or `concurrent`), the scope is not listed yet and there is room.
    fn add(&mut self, scope: Scope, ident: impl FnOnce() -> Ident, table: Table) {
        let Some(l) = self.tables.get(table) else {
            return;
        };
        let applies = !l.windows.is_empty() || l.concurrent.is_some();
        if !applies || self.entries.is_full() || self.entries.iter().any(|e| e.scope == scope) {
            return;
        }
        self.entries.push(Entry {
            scope,
            ident: ident(),
            table,
        });
    }
}

/// The identity the ip scope counts for `ip`: the address, or an IPv6 client's network.
fn client(rt: &Runtime, ip: IpAddr) -> Ident {
    Ident::client(ip, rt.config.ipv6_prefix)
}

/// A table index as stored in a `Table` (a config holds far fewer than 256 of each:
/// custom scopes and a route's tables are bounded by `throttle check`).
fn index(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(u8::MAX)
}
