//! envoyproxy/ratelimit's YAML descriptor configuration (`[rls] config`): loading it, and
//! matching a request's descriptors against it. Pure: no I/O but [`RlsConfig::load`]'s
//! reading of the files, no store, no async; the service decides with what this returns.
//!
//! A file is one domain and its descriptor tree:
//! ```yaml
//! domain: mongo_cps
//! descriptors:
//!   - key: database
//!     value: users
//!     rate_limit: { unit: second, requests_per_unit: 500 }
//! ```
//! Loading (`load`) follows envoyproxy's `config_impl.go` and refuses what it refuses, but
//! stricter where it is silent: every field is checked where it stands (a `unit` inside a
//! descriptor is an unknown field), a second YAML document or a repeated field is an
//! error, and input is bounded ([`MAX_FILE_BYTES`], [`MAX_DEPTH`]). Every error names
//! `FILE:LINE:COL` of the offending field or descriptor.
//!
//! Matching (`matching`) walks the tree level by level: the exact key and value, else the
//! first wildcard entry of the level in file order, else the bare key. The limit is the one
//! of the node matched for the last entry (the depth rule). It allocates nothing but the
//! returned counter identity: maps are probed with borrowed `&str`s, wildcard patterns are
//! split at load time and matched against `key_value` without building that string.

mod load;
mod matching;
mod yaml;

use std::path::Path;

use hashbrown::HashMap;

pub use self::matching::plain_counter;

/// Largest configuration file accepted.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;

/// Deepest descriptor nesting accepted (levels of `descriptors`, the top one counting 1).
/// A request descriptor with more entries than this never matches a limit.
pub const MAX_DEPTH: usize = 32;

/// Longest counter identity kept as it is; a longer one is replaced by its SHA-256.
pub const MAX_COUNTER_LEN: usize = 200;

/// A loaded configuration: domains -> descriptor trees.
#[derive(Debug, Default)]
pub struct RlsConfig {
    domains: HashMap<String, Domain>,
}

/// What [`RlsConfig::lookup`] found for a descriptor.
#[derive(Debug, Clone)]
pub struct Matched<'a> {
    /// The configured limit.
    pub limit: &'a Limit,
    /// The counter identity: the entries as `key=value` joined by `&`, each key and value
    /// percent-encoded for every byte outside `[A-Za-z0-9-._~*/:]` (the runtime values, or a
    /// `share_threshold` wildcard's pattern as written); `#` and the lowercase hex SHA-256 of
    /// that string when it is longer than [`MAX_COUNTER_LEN`] bytes.
    pub counter: String,
    /// The matched node's path for metrics, static: `key1_value1.key2` (wildcard values as
    /// written, bare keys without value). Never a runtime value.
    pub path: &'a str,
}

/// A descriptor's `rate_limit`, with the descriptor's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// The window (`Unit::Second` when `unlimited`, where it means nothing).
    pub unit: Unit,
    /// Requests allowed per window.
    pub requests_per_unit: u32,
    /// `unlimited: true`: always allowed, nothing counted.
    pub unlimited: bool,
    /// `rate_limit.name`, when given and not empty.
    pub name: Option<String>,
    /// `rate_limit.replaces[].name`: the limits this one replaces when both match.
    pub replaces: Vec<String>,
    /// `shadow_mode`: over the limit still answers OK.
    pub shadow_mode: bool,
    /// `quota_mode`: over the limit is reported, but decides the overall code only as
    /// quota descriptors do.
    pub quota_mode: bool,
    /// `detailed_metric`: counted in the per-descriptor metric.
    pub detailed_metric: bool,
}

/// The window of a limit. Windows are fixed and aligned to the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

/// A load error at a position in a file (1-based line and column, in characters; `1:1`
/// for an error about the whole file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{col}: {message}")]
pub struct RlsConfigError {
    /// The file as named to [`RlsConfig::load`] or [`RlsConfig::parse`].
    pub file: String,
    pub line: usize,
    pub col: usize,
    /// What is wrong.
    pub message: String,
}

/// One domain: its tree, and where it was declared (for a duplicate across files).
#[derive(Debug)]
struct Domain {
    file: String,
    line: usize,
    col: usize,
    root: Level,
}

/// The descriptors of one level, in file order, with the indexes matching uses.
#[derive(Debug, Default)]
struct Level {
    nodes: Vec<Node>,
    /// key -> its bare node and its nodes by value.
    by_key: HashMap<String, Slots>,
    /// Indexes into `nodes` of the entries whose `key_value` holds a `*`, in file order.
    wildcards: Vec<usize>,
}

/// The nodes of one key at a level.
#[derive(Debug, Default)]
struct Slots {
    bare: Option<usize>,
    values: HashMap<String, usize>,
}

/// One configured descriptor.
#[derive(Debug)]
struct Node {
    key: String,
    /// None: a bare key (no value, or an empty one).
    value: Option<String>,
    /// `parent.key_value` from the top level, for metrics.
    path: String,
    limit: Option<Limit>,
    /// Some when `key_value` holds a `*`.
    pattern: Option<Pattern>,
    share_threshold: bool,
    children: Level,
}

/// A wildcard `key_value` split on `*` at load time.
#[derive(Debug)]
struct Pattern {
    /// At least two parts (there is at least one `*`); empty parts where `*`s are adjacent
    /// or at an end.
    parts: Vec<String>,
    /// The length of all parts together: a shorter `key_value` cannot match.
    fixed: usize,
}

// === impl RlsConfig ===

impl RlsConfig {
    /// Loads a file, or every `*.yaml`/`*.yml` file directly in a directory, in file-name
    /// order (names starting with `.` are skipped). A directory without one is an empty
    /// configuration.
    ///
    /// # Errors
    /// An unreadable or invalid file, or a domain declared in two files.
    pub fn load(path: &Path) -> Result<RlsConfig, RlsConfigError> {
        load::load(path)
    }

    /// Parses one file's text (`name` is what errors call the file).
    ///
    /// # Errors
    /// Invalid YAML, or a configuration envoyproxy/ratelimit refuses (see the module docs).
    pub fn parse(name: &str, text: &str) -> Result<RlsConfig, RlsConfigError> {
        load::parse(name, text)
    }

    /// Configured domains (any order).
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Adds the domains of `other` (a later file); a domain already here is an error at
    /// `other`'s declaration that names the first file.
    fn absorb(&mut self, other: RlsConfig) -> Result<(), RlsConfigError> {
        for (name, domain) in other.domains {
            if let Some(first) = self.domains.get(&name) {
                return Err(RlsConfigError {
                    message: format!("duplicate domain '{name}': already in {}", first.file),
                    file: domain.file,
                    line: domain.line,
                    col: domain.col,
                });
            }
            self.domains.insert(name, domain);
        }
        Ok(())
    }
}

// === impl Unit ===

impl Unit {
    const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The window's length: 1, 60, 3600, 86400, 604800, 2592000 (30 days), 31536000 (365
    /// days).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The unit named `s`, case-insensitively (`second`, `MINUTE`, ...).
    pub fn parse(s: &str) -> Option<Unit> {
        Self::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(s))
    }

    /// The lowercase name: `"second"`, `"minute"`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

// === impl Level ===

impl Level {
    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests;
