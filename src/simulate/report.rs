//! What a replay found: per scope, per tenant, and the requests refused before any limit
//! could reject them. Printed as a table, or as one JSON object (`--json`).

use std::collections::BTreeMap;
use std::fmt;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::config::format_rfc3339;
use crate::limiter::Scope;

/// The outcome of a replay.
///
/// Scopes count as `throttle_decisions_total` does on a gateway: a request that passes
/// the limits counts `allowed` for every scope it was checked against (also when it is
/// then answered 404 `no_route`, since it spent the ip and global budgets); a 429 counts
/// `rejected` for the rejecting scope alone; a shadow-mode would-be rejection counts
/// `shadow_rejected` for that scope alone. Tenants count the requests that carried one
/// of their keys: `allowed` when admitted, `rejected` on a 429.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Per scope, in pipeline order (ip, key, tenant, global, auth).
    pub scopes: ScopeCounts,
    /// Per tenant id.
    pub tenants: BTreeMap<String, Counts>,
    /// Rows replayed.
    pub requests: u64,
    /// Requests admitted (shadow-mode would-be rejections included).
    pub allowed: u64,
    /// Requests answered 429.
    pub rejected: u64,
    /// Admitted requests a shadow-mode route would have rejected.
    #[serde(skip_serializing_if = "is_zero")]
    pub shadow_rejected: u64,
    /// Requests refused without a 429, by the `error` the gateway would answer:
    /// `missing_api_key`, `invalid_api_key`, `blocked_ip`, `blocked_key`,
    /// `blocked_tenant`, `no_route`, `invalid_path`, `invalid_host`.
    pub refused: BTreeMap<&'static str, u64>,
    /// The first and the last time of the trace (Unix ms).
    #[serde(skip)]
    pub span_ms: Option<(u64, u64)>,
}

/// Allowed and rejected requests of one scope or tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Requests admitted.
    pub allowed: u64,
    /// Requests answered 429.
    pub rejected: u64,
    /// Would-be rejections on shadow-mode routes (the request was admitted).
    #[serde(skip_serializing_if = "is_zero")]
    pub shadow_rejected: u64,
}

/// `Counts` per scope, serialized in pipeline order (the built-in scopes, then named ones
/// as first met), scopes that decided nothing left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeCounts([Counts; Scope::COUNT], Vec<(Scope, Counts)>);

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// === impl Report ===

impl Report {
    /// Counts an admitted request checked against `scopes`; `shadow` is the scope a
    /// shadow-mode route would have been rejected by.
    pub(super) fn admitted(
        &mut self,
        scopes: impl Iterator<Item = Scope>,
        tenant: Option<&str>,
        shadow: Option<Scope>,
    ) {
        self.allowed += 1;
        match shadow {
            Some(s) => {
                self.shadow_rejected += 1;
                self.scopes.get_mut(s).shadow_rejected += 1;
            }
            None => scopes.for_each(|s| self.scopes.get_mut(s).allowed += 1),
        }
        if let Some(t) = tenant {
            let c = self.tenant(t);
            c.allowed += 1;
            c.shadow_rejected += u64::from(shadow.is_some());
        }
    }

    /// Counts a 429 by `scope`.
    pub(super) fn rejected(&mut self, scope: Scope, tenant: Option<&str>) {
        self.rejected += 1;
        self.scopes.get_mut(scope).rejected += 1;
        if let Some(t) = tenant {
            self.tenant(t).rejected += 1;
        }
    }

    /// Counts a refusal; `passed` are the scopes the request passed before it (a 404
    /// passes the ip and global limits first).
    pub(super) fn refused(&mut self, reason: &'static str, passed: impl Iterator<Item = Scope>) {
        *self.refused.entry(reason).or_default() += 1;
        passed.for_each(|s| self.scopes.get_mut(s).allowed += 1);
    }

    /// Notes a row's time (rows come in time order).
    pub(super) fn seen(&mut self, time_ms: u64) {
        self.requests += 1;
        let first = self.span_ms.map_or(time_ms, |(f, _)| f);
        self.span_ms = Some((first, time_ms));
    }

    /// Requests refused without a 429.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    fn tenant(&mut self, t: &str) -> &mut Counts {
        self.tenants.entry(t.to_string()).or_default()
    }
}

impl fmt::Display for Report {
    /// A table for people: totals, then scopes, tenants and refusals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} requests", self.requests)?;
        if let Some((first, last)) = self.span_ms {
            write!(f, ", {} to {}", format_rfc3339(first), format_rfc3339(last))?;
        }
        writeln!(
            f,
            ": {} allowed, {} rejected (429), {} refused",
            self.allowed,
            self.rejected,
            self.refused_total()
        )?;
        let shadow = self.shadow_rejected > 0;
        let scopes: Vec<(&str, Counts)> = self.scopes.iter().collect();
        table(f, "scope", &scopes, shadow)?;
        let tenants: Vec<(&str, Counts)> =
            self.tenants.iter().map(|(t, c)| (t.as_str(), *c)).collect();
        table(f, "tenant", &tenants, shadow)?;
        if !self.refused.is_empty() {
            let width = self.refused.keys().map(|k| k.len()).max().unwrap_or(0);
            writeln!(f, "\nrefused")?;
            for (reason, n) in &self.refused {
                writeln!(f, "{reason:<width$}  {n:>8}")?;
            }
        }
        Ok(())
    }
}

/// One table of counts under a `title` column.
fn table(
    f: &mut fmt::Formatter<'_>,
    title: &str,
    rows: &[(&str, Counts)],
    shadow: bool,
) -> fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let width = rows
        .iter()
        .map(|(n, _)| n.len())
        .chain([title.len()])
        .max()
        .unwrap_or(0);
    write!(f, "\n{title:<width$}  {:>8}  {:>8}", "allowed", "rejected")?;
    writeln!(f, "{}", if shadow { "  shadow_rejected" } else { "" })?;
    for (name, c) in rows {
        write!(f, "{name:<width$}  {:>8}  {:>8}", c.allowed, c.rejected)?;
        if shadow {
            write!(f, "  {:>15}", c.shadow_rejected)?;
        }
        writeln!(f)?;
    }
    Ok(())
}

// === impl ScopeCounts ===

impl ScopeCounts {
    /// The counts of `scope`.
    pub fn get(&self, scope: Scope) -> Counts {
        match scope.builtin_index() {
            Some(i) => self.0[i],
            None => self
                .1
                .iter()
                .find(|(s, _)| *s == scope)
                .map_or_else(Counts::default, |(_, c)| *c),
        }
    }

    fn get_mut(&mut self, scope: Scope) -> &mut Counts {
        if let Some(i) = scope.builtin_index() {
            return &mut self.0[i];
        }
        let i = match self.1.iter().position(|(s, _)| *s == scope) {
            Some(i) => i,
            None => {
                self.1.push((scope, Counts::default()));
                self.1.len() - 1
            }
        };
        &mut self.1[i].1
    }

    /// Scopes that decided at least one request, in pipeline order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, Counts)> + '_ {
        let named = self.1.iter().map(|(s, c)| (*s, *c));
        Scope::ALL
            .into_iter()
            .map(|s| (s, self.get(s)))
            .chain(named)
            .map(|(s, c)| (s.as_str(), c))
            .filter(|(_, c)| *c != Counts::default())
    }
}

impl Serialize for ScopeCounts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (name, counts) in self.iter() {
            map.serialize_entry(name, &counts)?;
        }
        map.end()
    }
}
