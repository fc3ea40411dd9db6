//! `[regions]` (issue 37: one limit across regions) and the `fleet` key of scope tables
//! and tiers. What the store does with them is `src/regions` and the store's; here only
//! what a file may say.

use super::*;
use crate::limiter::Fleet;
use crate::regions::{DEFAULT_PARTITION_MS, DEFAULT_SYNC_MS};

/// `sync_ms` bounds: faster writes are load on every peer's Redis, slower ones leave
/// grants (and so a skewed demand) waiting longer than a 1 s window.
const SYNC_MS: RangeInclusive<u64> = 5..=10_000;
/// `partition_secs` bounds.
const PARTITION_SECS: RangeInclusive<u64> = 1..=3_600;

/// `[regions]`, validated: a name and at least one peer, each a Redis URL, on a Redis
/// store (each region keeps its own); None without the table.
pub(super) fn regions(
    cx: &Ctx<'_>,
    raw: Option<&Spanned<RegionsFile>>,
    store: &Store,
) -> Result<Option<Regions>, ConfigError> {
    let Some(table) = raw else { return Ok(None) };
    let r = table.get_ref();
    if store.backend != Backend::Redis {
        let msg = "[regions] needs [store] backend = \"redis\": each region keeps its counts and the grants it was sent in its own Redis, where its peers write them (the memory store is one process's alone)";
        return Err(cx.err(table.span(), msg));
    }
    let name = r.name.get_ref();
    region_name(name).map_err(|why| cx.err(r.name.span(), format!("[regions] name: {why}")))?;
    if r.peers.get_ref().is_empty() {
        let msg = "[regions] peers: at least one peer (region name = its Redis URL); a region alone needs no [regions]";
        return Err(cx.err(r.peers.span(), msg));
    }
    let mut peers = Vec::with_capacity(r.peers.get_ref().len());
    // A BTreeMap: the peers come sorted by name, as `Regions::index` needs.
    // (A peer's errors are placed at its URL: the map's keys carry no position.)
    for (p, url) in r.peers.get_ref() {
        region_name(p).map_err(|why| cx.err(url.span(), format!("[regions] peers: {why}")))?;
        if p == name {
            let msg = format!("[regions] peers: {p:?} is this region's own name: a region does not sync with itself");
            return Err(cx.err(url.span(), msg));
        }
        let value = env_value(cx, &format!("[regions] peers.{p}"), url)?;
        if value.is_empty() {
            let msg = format!("[regions] peers.{p} is empty: the peer's Redis URL");
            return Err(cx.err(url.span(), msg));
        }
        peers.push(Peer {
            name: p.clone(),
            url: value,
        });
    }
    let sync_ms = bounded(cx, "sync_ms", r.sync_ms.as_ref(), SYNC_MS)?.unwrap_or(DEFAULT_SYNC_MS);
    let partition_secs = bounded(
        cx,
        "partition_secs",
        r.partition_secs.as_ref(),
        PARTITION_SECS,
    )?
    .unwrap_or(DEFAULT_PARTITION_MS / 1_000);
    if partition_secs * 1_000 < 2 * sync_ms {
        let at = r.sync_ms.as_ref().or(r.partition_secs.as_ref());
        let msg = format!("[regions] partition_secs = {partition_secs} is less than two sync_ms = {sync_ms}: a live peer written to that seldom would be taken as cut off between two writes");
        return Err(cx.err(at.map_or(table.span(), Spanned::span), msg));
    }
    if let Some(u) = &r.unsynced {
        let v = *u.get_ref();
        if !(v > 0.0 && v <= 1.0) {
            let msg = format!("[regions] unsynced must be above 0 and at most 1, got {v}");
            return Err(cx.err(u.span(), msg));
        }
        cx.warn(u.span(), crate::config::warnings::UNSYNCED_UNUSED);
    }
    Ok(Some(Regions {
        name: name.clone(),
        peers,
        sync: Duration::from_millis(sync_ms),
        partition: Duration::from_secs(partition_secs),
    }))
}

/// A region's name: 1 to 32 of `a-z`, `0-9`, `_` and `-` (it names the region in metrics
/// and in the writes its peers receive).
fn region_name(name: &str) -> Result<(), String> {
    let ok = (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        return Ok(());
    }
    Err(format!(
        "{name:?} is not a region name (1 to 32 of a-z, 0-9, _ and -)"
    ))
}

/// The `fleet` of scope table `s`: its own, else its tier's (`inherited`), else local.
/// Refused at the key: a `fleet` without `[regions]`; at `algorithm`: a
/// `fleet = "regions"` table counted by another algorithm than `fixed_window` (the
/// default there).
pub(super) fn fleet(
    cx: &Ctx<'_>,
    s: &ScopeFile,
    inherited: Option<&Spanned<FleetFile>>,
) -> Result<Fleet, ConfigError> {
    let Some(f) = s.fleet.as_ref().or(inherited) else {
        return Ok(Fleet::Local);
    };
    let fleet = match f.get_ref() {
        FleetFile::Local => Fleet::Local,
        FleetFile::Regions => Fleet::Regions,
        FleetFile::Home => Fleet::Home,
    };
    if cx.regions.is_none() {
        let msg = format!("fleet = \"{}\" needs [regions] (this region's name and its peers' Redis); without it the store of this region is the whole fleet", fleet_name(fleet));
        return Err(cx.err(f.span(), msg));
    }
    match &s.algorithm {
        Some(a) if fleet == Fleet::Regions && *a.get_ref() != AlgorithmFile::FixedWindow => {
            let whose = if s.fleet.is_some() {
                ""
            } else {
                " (the tier's)"
            };
            let msg = format!("algorithm = \"{}\" with fleet = \"regions\"{whose}: one limit across regions counts fixed_window windows only (only a fixed window has a start every region agrees on, to carry allotments and grants across regions); drop algorithm (fixed_window is the default with fleet = \"regions\") or use fleet = \"home\"", algorithm(*a.get_ref()).as_str());
            Err(cx.err(a.span(), msg))
        }
        _ => Ok(fleet),
    }
}

/// Refuses `fleet` written on a table without windows (`concurrent` alone: slots are held
/// in this region's store, there is nothing to share).
pub(super) fn refuse_windowless(
    cx: &Ctx<'_>,
    f: Option<&Spanned<FleetFile>>,
    windows: &[WindowLimit],
    table: &str,
) -> Result<(), ConfigError> {
    match f {
        Some(f) if windows.is_empty() => {
            let msg = format!("fleet shares rate windows (per_second .. per_month) across regions; {table} has none (concurrent counts requests in flight in this region alone)");
            Err(cx.err(f.span(), msg))
        }
        _ => Ok(()),
    }
}

/// Warns, at each window's value, of `fleet = "regions"` windows below the number of
/// regions: some regions start every window at 0.
pub(super) fn warn_small(cx: &Ctx<'_>, s: &ScopeFile, windows: &[WindowLimit]) {
    let Some(regions) = cx.regions else { return };
    let fields = s.window_fields();
    for w in windows.iter().filter(|w| w.fleet == Fleet::Regions) {
        if u64::from(w.limit) >= regions as u64 {
            continue;
        }
        let at = Window::TABLE
            .iter()
            .zip(fields)
            .find(|(x, _)| **x == w.window)
            .and_then(|(_, v)| v.as_ref());
        if let Some(v) = at {
            let msg =
                crate::config::warnings::below_regions(w.window.config_key(), w.limit, regions);
            cx.warn(v.span(), &msg);
        }
    }
}

/// The `gateway.toml` spelling.
pub(super) fn fleet_name(f: Fleet) -> &'static str {
    match f {
        Fleet::Local => "local",
        Fleet::Regions => "regions",
        Fleet::Home => "home",
    }
}
