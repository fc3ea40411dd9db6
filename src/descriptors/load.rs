//! Reading the files into an [`RlsConfig`]: each file's positioned YAML tree (`yaml`) is
//! checked field by field into descriptor levels. The descriptors are bounded by
//! [`MAX_DEPTH`] and, as aliases can repeat a subtree, by a budget of loaded items.
//!
//! Scalars are read as envoyproxy's yaml.v2 reads them into its string, bool and integer
//! fields: a string field takes any scalar's text (`value: 123` is `"123"`), a boolean takes
//! YAML 1.1's `true`/`yes`/`on` and their opposites, a null (`~`, `null`, nothing) is the
//! field left out.

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;

use super::yaml::{as_bool, is_number, kind, read_tree, Pos, YNode, YValue};
use super::{
    Domain, Level, Limit, Node, Pattern, RlsConfig, RlsConfigError, Unit, MAX_DEPTH, MAX_FILE_BYTES,
};

/// Most descriptors and `replaces` items loaded from one file (aliases count every time
/// they are used).
const MAX_ITEMS: usize = 1 << 18;

const ROOT_FIELDS: [&str; 2] = ["domain", "descriptors"];
const DESCRIPTOR_FIELDS: [&str; 10] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "share_threshold",
    "value_to_metric",
    "metadata",
];
const LIMIT_FIELDS: [&str; 5] = ["unit", "requests_per_unit", "unlimited", "name", "replaces"];
const REPLACES_FIELDS: [&str; 1] = ["name"];

/// A field found in a map: where its name is, and its value.
#[derive(Clone, Copy)]
struct Field<'n> {
    at: Pos,
    value: &'n YNode,
}

/// The checks of one file.
struct Loader<'f> {
    file: &'f str,
    items: usize,
}

/// Loads a file or a directory (see [`RlsConfig::load`]).
pub(super) fn load(path: &Path) -> Result<RlsConfig, RlsConfigError> {
    let name = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| whole(&name, format!("cannot read: {e}")))?;
    if !meta.is_dir() {
        return parse(&name, &read(path, &name)?);
    }
    let listing = std::fs::read_dir(path).map_err(|e| whole(&name, format!("cannot list: {e}")))?;
    let mut files = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|e| whole(&name, format!("cannot list: {e}")))?;
        let file_name = entry.file_name();
        let Some(s) = file_name.to_str() else {
            continue;
        };
        let yaml = s.ends_with(".yaml") || s.ends_with(".yml");
        if yaml && !s.starts_with('.') && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    let mut config = RlsConfig::default();
    for file in files {
        let name = file.display().to_string();
        config.absorb(parse(&name, &read(&file, &name)?)?)?;
    }
    Ok(config)
}

/// Parses one file's text (see [`RlsConfig::parse`]).
pub(super) fn parse(name: &str, text: &str) -> Result<RlsConfig, RlsConfigError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(too_large(name));
    }
    let mut loader = Loader {
        file: name,
        items: 0,
    };
    let root = read_tree(name, text)?;
    let Some(root) = root.filter(|r| !matches!(*r.value, YValue::Null)) else {
        return Err(whole(
            name,
            "empty file: `domain` and `descriptors` expected",
        ));
    };
    let YValue::Map(entries) = &*root.value else {
        return Err(loader.err(root.at, "a file is a map of `domain` and `descriptors`"));
    };
    let [domain, descriptors] = loader.fields(entries, ROOT_FIELDS, "the file")?;
    let Some(domain) = domain else {
        return Err(loader.err(root.at, "config file has no `domain`"));
    };
    let at = value_at(domain);
    let domain_name = match loader.string(domain)? {
        Some(d) if !d.is_empty() => d.to_string(),
        _ => return Err(loader.err(at, "config file cannot have empty domain")),
    };
    let root_level = loader.level(loader.list(descriptors)?, "", 1)?;
    let mut config = RlsConfig::default();
    config.domains.insert(
        domain_name,
        Domain {
            file: name.to_string(),
            line: at.line,
            col: at.col,
            root: root_level,
        },
    );
    Ok(config)
}

/// The file's text: at most [`MAX_FILE_BYTES`], UTF-8.
fn read(path: &Path, name: &str) -> Result<String, RlsConfigError> {
    let file = std::fs::File::open(path).map_err(|e| whole(name, format!("cannot read: {e}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| whole(name, format!("cannot read: {e}")))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(too_large(name));
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let before = String::from_utf8_lossy(e.as_bytes().get(..valid).unwrap_or_default());
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        RlsConfigError {
            file: name.to_string(),
            line,
            col,
            message: "the file is not UTF-8".to_string(),
        }
    })
}

fn whole(file: &str, message: impl Into<String>) -> RlsConfigError {
    RlsConfigError {
        file: file.to_string(),
        line: 1,
        col: 1,
        message: message.into(),
    }
}

fn too_large(file: &str) -> RlsConfigError {
    whole(
        file,
        format!("the file is larger than {} MiB", MAX_FILE_BYTES >> 20),
    )
}

/// Whether a plain scalar is no string to YAML (a number or a boolean; a null is no
/// `Str` at all).
fn resolves(text: &str) -> bool {
    is_number(text) || as_bool(text).is_some()
}

/// Where a field's value is, or the field itself when it has none (a null is placed after
/// the `:`, which names nothing).
fn value_at(field: Field<'_>) -> Pos {
    match *field.value.value {
        YValue::Null => field.at,
        _ => field.value.at,
    }
}

// === impl Loader ===

impl Loader<'_> {
    fn err(&self, at: Pos, message: impl Into<String>) -> RlsConfigError {
        RlsConfigError {
            file: self.file.to_string(),
            line: at.line,
            col: at.col,
            message: message.into(),
        }
    }

    /// Counts one more loaded item against [`MAX_ITEMS`].
    fn count(&mut self, at: Pos) -> Result<(), RlsConfigError> {
        self.items += 1;
        if self.items > MAX_ITEMS {
            let m =
                format!("more than {MAX_ITEMS} descriptors and replaces (aliases count each use)");
            return Err(self.err(at, m));
        }
        Ok(())
    }

    /// The fields of a map, by the position of their name in `allowed`: a field not in
    /// `allowed`, a repeated one and a key that is no string are errors at the key.
    fn fields<'n, const N: usize>(
        &self,
        entries: &'n [(YNode, YNode)],
        allowed: [&str; N],
        what: &str,
    ) -> Result<[Option<Field<'n>>; N], RlsConfigError> {
        let mut found = [None; N];
        for (key, value) in entries {
            let name = match &*key.value {
                YValue::Str { text, plain } if !(*plain && resolves(text)) => text.as_str(),
                YValue::Str { text, .. } => {
                    let m = format!("config error, key is not of type string: {text}");
                    return Err(self.err(key.at, m));
                }
                _ => {
                    let m = format!("config error, key is not of type string: {}", kind(key));
                    return Err(self.err(key.at, m));
                }
            };
            let Some(i) = allowed.iter().position(|a| *a == name) else {
                let m = format!(
                    "config error, unknown key '{name}' in {what} (expected {})",
                    allowed.join(", ")
                );
                return Err(self.err(key.at, m));
            };
            let Some(slot) = found.get_mut(i) else {
                continue;
            };
            if slot.is_some() {
                return Err(self.err(key.at, format!("duplicate field '{name}' in {what}")));
            }
            *slot = Some(Field { at: key.at, value });
        }
        Ok(found)
    }

    /// A string field's text (None: absent or null).
    fn string<'n>(&self, field: Field<'n>) -> Result<Option<&'n str>, RlsConfigError> {
        match &*field.value.value {
            YValue::Null => Ok(None),
            YValue::Str { text, .. } => Ok(Some(text)),
            _ => Err(self.err(
                field.value.at,
                format!("expected a string, found {}", kind(field.value)),
            )),
        }
    }

    /// A string field's text, None also when empty.
    fn text<'n>(&self, field: Option<Field<'n>>) -> Result<Option<&'n str>, RlsConfigError> {
        match field {
            Some(f) => Ok(self.string(f)?.filter(|s| !s.is_empty())),
            None => Ok(None),
        }
    }

    fn boolean(&self, field: Option<Field<'_>>) -> Result<bool, RlsConfigError> {
        let Some(field) = field else {
            return Ok(false);
        };
        match &*field.value.value {
            YValue::Null => Ok(false),
            YValue::Str { text, plain: true } => as_bool(text).ok_or_else(|| {
                self.err(
                    field.value.at,
                    format!("expected true or false, found '{text}'"),
                )
            }),
            _ => Err(self.err(
                field.value.at,
                format!("expected true or false, found {}", kind(field.value)),
            )),
        }
    }

    fn count_field(&self, field: Option<Field<'_>>) -> Result<u32, RlsConfigError> {
        let Some(field) = field else {
            return Ok(0);
        };
        match &*field.value.value {
            YValue::Null => Ok(0),
            YValue::Str { text, plain: true } if text.bytes().all(|b| b.is_ascii_digit()) => text
                .parse()
                .map_err(|_| self.err(field.value.at, format!("'{text}' is over 4294967295"))),
            _ => Err(self.err(
                field.value.at,
                "requests_per_unit must be a whole number from 0 to 4294967295",
            )),
        }
    }

    /// A list field's items (none: absent or null).
    fn list<'n>(&self, field: Option<Field<'n>>) -> Result<&'n [YNode], RlsConfigError> {
        let Some(field) = field else {
            return Ok(&[]);
        };
        match &*field.value.value {
            YValue::Null => Ok(&[]),
            YValue::Seq(items) => Ok(items),
            _ => Err(self.err(
                field.value.at,
                format!("expected a list, found {}", kind(field.value)),
            )),
        }
    }

    /// A list item's fields; an item that is no map is an error at the item.
    fn item<'n, const N: usize>(
        &self,
        item: &'n YNode,
        allowed: [&str; N],
        what: &str,
    ) -> Result<[Option<Field<'n>>; N], RlsConfigError> {
        match &*item.value {
            YValue::Map(entries) => self.fields(entries, allowed, what),
            YValue::Str { text, .. } => Err(self.err(
                item.at,
                format!("config error, yaml file contains list of type other than map: {text}"),
            )),
            _ => Err(self.err(
                item.at,
                format!(
                    "config error, yaml file contains list of type other than map: {}",
                    kind(item)
                ),
            )),
        }
    }

    /// One level of descriptors under `parent` (its path, "" at the top), `depth` from 1.
    fn level(
        &mut self,
        items: &[YNode],
        parent: &str,
        depth: usize,
    ) -> Result<Level, RlsConfigError> {
        let mut level = Level::default();
        let mut seen = HashSet::new();
        for item in items {
            let node = self.descriptor(item, parent, depth, &mut seen)?;
            let index = level.nodes.len();
            let slots = level.by_key.entry_ref(node.key.as_str()).or_default();
            match &node.value {
                Some(v) => {
                    slots.values.insert(v.clone(), index);
                }
                None => slots.bare = Some(index),
            }
            if node.pattern.is_some() {
                level.wildcards.push(index);
            }
            level.nodes.push(node);
        }
        Ok(level)
    }

    /// One descriptor of a level (its children loaded), its composite key (`key_value`)
    /// not yet in `seen`.
    fn descriptor(
        &mut self,
        item: &YNode,
        parent: &str,
        depth: usize,
        seen: &mut HashSet<String>,
    ) -> Result<Node, RlsConfigError> {
        self.count(item.at)?;
        let [key, value, rate_limit, children, shadow, quota, detailed, share, metric, meta] =
            self.item(item, DESCRIPTOR_FIELDS, "a descriptor")?;
        if depth > MAX_DEPTH {
            let m = format!("descriptors nested deeper than {MAX_DEPTH} levels");
            return Err(self.err(item.at, m));
        }
        let Some(key) = self.text(key)? else {
            let at = key.map_or(item.at, value_at);
            return Err(self.err(at, "descriptor has empty key"));
        };
        let value = self.text(value)?;
        let composite = match value {
            Some(v) => format!("{key}_{v}"),
            None => key.to_string(),
        };
        let path = if parent.is_empty() {
            composite.clone()
        } else {
            format!("{parent}.{composite}")
        };
        if !seen.insert(composite.clone()) {
            let m = format!("duplicate descriptor composite key '{path}'");
            return Err(self.err(item.at, m));
        }
        let share_threshold = self.extras(&composite, share, metric, meta)?;
        let flags = Flags {
            shadow_mode: self.boolean(shadow)?,
            quota_mode: self.boolean(quota)?,
            detailed_metric: self.boolean(detailed)?,
        };
        let limit = match rate_limit {
            Some(f) if !matches!(*f.value.value, YValue::Null) => Some(self.limit(f, flags)?),
            _ => None,
        };
        let children = self.level(self.list(children)?, &path, depth + 1)?;
        let pattern = composite.contains('*').then(|| {
            let parts: Vec<String> = composite.split('*').map(str::to_string).collect();
            let fixed = parts.iter().map(String::len).sum();
            Pattern { parts, fixed }
        });
        Ok(Node {
            key: key.to_string(),
            value: value.map(str::to_string),
            path,
            limit,
            pattern,
            share_threshold,
            children,
        })
    }

    /// A descriptor's `share_threshold` (only on a wildcard `composite`), with its
    /// `value_to_metric` and `metadata` checked and dropped.
    fn extras(
        &self,
        composite: &str,
        share: Option<Field<'_>>,
        metric: Option<Field<'_>>,
        meta: Option<Field<'_>>,
    ) -> Result<bool, RlsConfigError> {
        let share_threshold = self.boolean(share)?;
        let wildcard = composite.contains('*');
        if let (true, false, Some(f)) = (share_threshold, wildcard, share) {
            let m = format!(
                "share_threshold can only be used with wildcard values (containing '*'), \
                 but found key '{composite}'"
            );
            return Err(self.err(f.at, m));
        }
        self.boolean(metric)?;
        if let Some(m) = meta {
            if !matches!(*m.value.value, YValue::Map(_) | YValue::Null) {
                let found = kind(m.value);
                return Err(self.err(m.value.at, format!("metadata must be a map, found {found}")));
            }
        }
        Ok(share_threshold)
    }

    /// A descriptor's `rate_limit` map.
    fn limit(&mut self, field: Field<'_>, flags: Flags) -> Result<Limit, RlsConfigError> {
        let node = field.value;
        let YValue::Map(entries) = &*node.value else {
            let m = format!("rate_limit must be a map, found {}", kind(node));
            return Err(self.err(node.at, m));
        };
        let [unit, requests, unlimited, name, replaces] =
            self.fields(entries, LIMIT_FIELDS, "a rate_limit")?;
        let unlimited = self.boolean(unlimited)?;
        let unit_text = self.text(unit)?;
        let unit = match (unlimited, unit_text, unit) {
            (true, Some(_), Some(f)) => {
                return Err(self.err(f.at, "should not specify rate limit unit when unlimited"));
            }
            (true, _, _) => Unit::Second,
            (false, Some(u), Some(f)) => Unit::parse(u).ok_or_else(|| {
                let m = format!(
                    "invalid rate limit unit '{u}' \
                     (expected second, minute, hour, day, week, month or year)"
                );
                self.err(f.value.at, m)
            })?,
            (false, _, _) => {
                return Err(self.err(node.at, "rate_limit needs a unit (or unlimited: true)"));
            }
        };
        let requests_per_unit = self.count_field(requests)?;
        let name = self.text(name)?;
        let mut replaced = Vec::new();
        for item in self.list(replaces)? {
            self.count(item.at)?;
            let [replaces_name] = self.item(item, REPLACES_FIELDS, "a replaces entry")?;
            let Some(r) = self.text(replaces_name)? else {
                let at = replaces_name.map_or(item.at, value_at);
                return Err(self.err(at, "should not have an empty replaces entry"));
            };
            if Some(r) == name {
                let at = replaces_name.map_or(item.at, value_at);
                return Err(self.err(at, "replaces should not contain name of same descriptor"));
            }
            replaced.push(r.to_string());
        }
        Ok(Limit {
            unit,
            requests_per_unit,
            unlimited,
            name: name.map(str::to_string),
            replaces: replaced,
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            detailed_metric: flags.detailed_metric,
        })
    }
}

/// A descriptor's flags, carried into its limit.
#[derive(Clone, Copy)]
struct Flags {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
}
