//! What `throttle check` (and the start) warns about without failing, besides the
//! decision APIs' `check_token` (`Config::warnings`). Warnings about a value found while
//! validating (`[regions]`, `fleet`) are placed at its `file:line:col` there and kept in
//! `Config::file_warnings`; their texts are here.

use super::{Config, Counts};

/// `[regions] unsynced`: the first contract's budget, accepted so its configs still load.
pub(super) const UNSYNCED_UNUSED: &str = "[regions] unsynced is not used: the allotments + grants rule keeps admitted <= L in every window with no budget of unacknowledged admissions (docs/src/features/regions.md); remove it";

/// A `fleet = "regions"` window whose limit is below the number of regions.
pub(super) fn below_regions(field: &str, limit: u32, regions: usize) -> String {
    format!("{field} = {limit} with fleet = \"regions\" is below the {regions} regions: every window, some regions start with an allotment of 0 and serve only what their peers grant them (a grant takes up to sync_ms and a one-way delay); fleet = \"home\" suits small limits")
}

/// A route with `cost_header` and no `max_cost` that feeds a shared window (`[limits.global]`,
/// or its own `global` table): one upstream response reporting a huge usage settles it
/// whole, and that window refuses everyone until it rolls over.
pub(super) fn unbounded_cost(config: &Config) -> Vec<String> {
    config
        .routes
        .iter()
        .filter(|r| r.cost_header.is_some() && r.max_cost.is_none())
        .flat_map(|r| {
            let global = config.global_limits.as_ref().map(|_| "[limits.global]".to_string());
            let own = r
                .limits
                .iter()
                .filter(|t| t.counts == Counts::Global)
                .map(|t| format!("its table {}", t.scope.as_str()));
            global.into_iter().chain(own).map(move |what| {
                format!(
                    "{}: warning: route \"{}\" has cost_header without max_cost and feeds the shared window of {what}: one response reporting a huge usage fills it for every caller until it rolls over; set max_cost",
                    config.source, r.name
                )
            })
        })
        .collect()
}

// === impl Config ===

impl Config {
    /// What `throttle check` (and the start) warns about without failing: a decision API
    /// (the admin listener's `POST /v1/check`, the RLS) listening beyond loopback without
    /// `check_token`, where anyone who reaches it can spend other clients' limits; a
    /// `cost_header` route without `max_cost` feeding a shared window; the warnings placed
    /// at a value (`file_warnings`: `[regions] unsynced`, a `fleet = "regions"` limit below
    /// the number of regions).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.file_warnings.clone();
        out.extend(unbounded_cost(self));
        if self.server.check_token.is_some() {
            return out;
        }
        let s = &self.server;
        let listeners = [
            ("admin_listen", Some(s.admin_listen), "POST /v1/check"),
            ("rls_listen", s.rls_listen, "the rate-limit service"),
        ];
        out.extend(listeners.into_iter().filter_map(|(key, addr, what)| {
                let addr = addr.filter(|a| !a.ip().to_canonical().is_loopback())?;
                Some(format!(
                    "{}: warning: {key} {addr} listens beyond loopback and [server] check_token is not set: anyone who reaches it can spend any client's limits through {what}",
                    self.source
                ))
            }));
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    fn warnings(global: &str, route: &str) -> Vec<String> {
        let text = format!(
            "{global}\n[[routes]]\nname = \"llm\"\npath_prefix = \"/\"\nupstreams = [\"127.0.0.1:1\"]\nauth = \"none\"\n{route}\n"
        );
        parse("f.toml", &text).unwrap().warnings()
    }

    /// A `cost_header` route without `max_cost` feeding `[limits.global]` or its own
    /// `global` table is warned about (once per shared window); with `max_cost`, without
    /// `cost_header`, or feeding only per-caller tables, not.
    #[test]
    fn cost_header_without_max_cost_on_a_shared_window_warns() {
        let global = "[limits.global]\nper_minute = 1000";
        let header = "cost_header = \"x-cost\"";
        let w = warnings(global, header);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("f.toml: warning: route \"llm\" has cost_header without max_cost")
                && w[0].contains("[limits.global]")
                && w[0].contains("set max_cost"),
            "{w:?}"
        );
        let own = format!("{header}\nlimits = {{ global = {{ per_minute = 100 }} }}");
        let w = warnings("", &own);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("its table llm.global"), "{w:?}");
        assert_eq!(warnings(global, &own).len(), 2);
        assert!(warnings(global, &format!("{header}\nmax_cost = 50")).is_empty());
        assert!(warnings(global, "").is_empty());
        let per_ip = format!("{header}\nlimits = {{ ip = {{ per_minute = 100 }} }}");
        assert!(warnings("", &per_ip).is_empty());
    }
}
