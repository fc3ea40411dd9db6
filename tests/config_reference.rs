//! The book's configuration reference (`docs/src/reference/config.md`) against the config
//! model, so neither can drift from the other.
//!
//! The keys of `gateway.toml` are derived from its serde mirror, `src/config/file.rs`: the
//! structs are read from the source (fields, `#[serde(rename = ...)]`, `transparent`), and
//! walked from `File`, the document's root. Each key is a dotted path
//! (`server.listen`, `store.sentinel.urls`); a table keyed by names the user chooses
//! (`[tiers.<name>]`, `[limits.<scope>]`) is spelled `<name>`, and an array of tables
//! (`[[routes]]`) by its key alone (`routes.path_prefix`). A struct used in several places
//! (the scope table of `[limits.<name>]`, a tier's `key` and `tenant` and a route's
//! `limits`) is spelled out at its first place in the walk; its other places are keys of
//! their own, whose row points at the first.
//!
//! The reference holds one table row per key, its first cell the key in backticks:
//! `` | `server.listen` | ... | ``. A serde attribute the reader does not understand
//! (`flatten`, `alias`, `rename_all` on a struct, ...) fails the test rather than being
//! skipped, so a change to the model's shape cannot make keys silently disappear.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const MODEL: &str = "src/config/file.rs";
const REFERENCE: &str = "docs/src/reference/config.md";
/// The struct `gateway.toml` deserializes into.
const ROOT: &str = "File";

/// A parsed generic type: `Option<Spanned<String>>` is `Option` with one argument.
#[derive(Debug, Clone, PartialEq)]
struct Ty {
    name: String,
    args: Vec<Ty>,
}

fn parse_ty(s: &str) -> Ty {
    let (ty, rest) = parse_ty_prefix(s.trim());
    assert!(
        rest.trim().is_empty(),
        "unparsed type text {rest:?} in {s:?}"
    );
    ty
}

fn parse_ty_prefix(s: &str) -> (Ty, &str) {
    let s = s.trim_start();
    let end = s.find(['<', '>', ',']).unwrap_or(s.len());
    let name = s[..end].trim().to_string();
    assert!(!name.is_empty(), "empty type name in {s:?}");
    let mut rest = &s[end..];
    let mut args = Vec::new();
    if let Some(after) = rest.strip_prefix('<') {
        rest = after;
        loop {
            let (arg, after) = parse_ty_prefix(rest);
            args.push(arg);
            let after = after.trim_start();
            if let Some(after) = after.strip_prefix(',') {
                rest = after;
            } else if let Some(after) = after.strip_prefix('>') {
                rest = after;
                break;
            } else {
                panic!("bad generic arguments in {s:?}");
            }
        }
    }
    (Ty { name, args }, rest)
}

#[derive(Debug)]
enum Item {
    /// Fields in declaration order: (TOML key, type).
    Struct(Vec<(String, Ty)>),
    /// `#[serde(transparent)]` struct or a tuple struct: deserialized as its one field.
    Transparent(Ty),
    Enum,
}

/// The `#[serde(...)]` arguments of one attribute line, split at top-level commas.
fn serde_args(attr: &str) -> Vec<String> {
    let Some(inner) = attr
        .trim()
        .strip_prefix("#[serde(")
        .and_then(|a| a.strip_suffix(")]"))
    else {
        return Vec::new();
    };
    inner.split(',').map(|a| a.trim().to_string()).collect()
}

/// Reads every struct and enum of the model's source.
fn parse_model(src: &str) -> BTreeMap<String, Item> {
    let lines: Vec<&str> = src
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//"))
        .collect();
    let mut items = BTreeMap::new();
    let mut attrs: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if line.starts_with("#[") {
            assert!(line.ends_with(']'), "multi-line attribute: {line}");
            attrs.push(line);
            continue;
        }
        let decl = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        let container: Vec<String> = attrs.iter().flat_map(|a| serde_args(a)).collect();
        attrs.clear();
        if let Some(rest) = decl.strip_prefix("enum ") {
            let name = rest.trim_end_matches('{').trim().to_string();
            items.insert(name, Item::Enum);
            while i < lines.len() && lines[i] != "}" {
                i += 1;
            }
            continue;
        }
        let Some(rest) = decl.strip_prefix("struct ") else {
            continue;
        };
        let transparent = container.iter().any(|a| a == "transparent");
        for arg in &container {
            assert!(
                arg == "transparent" || arg == "deny_unknown_fields",
                "{MODEL}: serde container attribute `{arg}` on `{rest}` is not understood \
                 by this test; teach it (tests/config_reference.rs)"
            );
        }
        if let Some((name, tuple)) = rest.split_once('(') {
            let inner = tuple.trim_end_matches(';').trim_end_matches(')');
            let inner = inner.trim().trim_start_matches("pub(crate) ");
            items.insert(name.trim().to_string(), Item::Transparent(parse_ty(inner)));
            continue;
        }
        let name = rest.trim_end_matches('{').trim().to_string();
        let mut fields = Vec::new();
        while i < lines.len() && lines[i] != "}" {
            let line = lines[i];
            i += 1;
            if line.starts_with("#[") {
                assert!(line.ends_with(']'), "multi-line attribute: {line}");
                attrs.push(line);
                continue;
            }
            let decl = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            let (field, ty) = decl
                .split_once(':')
                .unwrap_or_else(|| panic!("{MODEL}: cannot read field line {line:?} of {name}"));
            let ty = ty
                .trim()
                .strip_suffix(',')
                .unwrap_or_else(|| panic!("{MODEL}: field {field} of {name} spans lines"));
            let mut key = field.trim().to_string();
            let mut skip = false;
            for arg in attrs.drain(..).flat_map(serde_args) {
                if let Some(renamed) = arg.strip_prefix("rename = ") {
                    key = renamed.trim_matches('"').to_string();
                } else if arg == "skip" || arg == "skip_deserializing" {
                    skip = true;
                } else if arg != "default" && !arg.starts_with("default = ") {
                    panic!(
                        "{MODEL}: serde field attribute `{arg}` on {name}.{field} is not \
                         understood by this test; teach it (tests/config_reference.rs)"
                    );
                }
            }
            if !skip {
                fields.push((key, parse_ty(ty)));
            }
        }
        i += 1;
        if transparent {
            assert_eq!(
                fields.len(),
                1,
                "transparent struct {name} with several fields"
            );
            items.insert(name, Item::Transparent(fields.remove(0).1));
        } else {
            items.insert(name, Item::Struct(fields));
        }
    }
    items
}

/// The model's items, borrowed apart from the walk's own state.
fn items_of<'a>(walk: &Walk<'a>) -> &'a BTreeMap<String, Item> {
    walk.items
}

/// Walks the model from `ROOT`, collecting every key path.
struct Walk<'a> {
    items: &'a BTreeMap<String, Item>,
    expanded: BTreeSet<String>,
    keys: Vec<String>,
}

impl Walk<'_> {
    /// The keys below `path`, whose value has type `ty`.
    fn value(&mut self, path: &str, ty: &Ty) {
        match ty.name.as_str() {
            "Option" | "Spanned" | "Box" => self.value(path, &ty.args[0]),
            "BTreeMap" | "HashMap" => {
                assert_eq!(ty.args[0].name, "String", "map keyed by {:?}", ty.args[0]);
                let path = format!("{path}.<name>");
                self.keys.push(path.clone());
                self.value(&path, &ty.args[1]);
            }
            // An array of tables (`[[routes]]`) has its element's keys; an array of
            // values is a value.
            "Vec" => self.value(path, &ty.args[0]),
            name => match items_of(self).get(name) {
                Some(Item::Transparent(inner)) => {
                    if self.expanded.insert(name.to_string()) {
                        self.value(path, &inner.clone());
                    }
                }
                Some(Item::Struct(fields)) => {
                    if self.expanded.insert(name.to_string()) {
                        for (key, ty) in fields {
                            let path = if path.is_empty() {
                                key.clone()
                            } else {
                                format!("{path}.{key}")
                            };
                            self.keys.push(path.clone());
                            self.value(&path, ty);
                        }
                    }
                }
                Some(Item::Enum) | None => {}
            },
        }
    }
}

/// Every key `gateway.toml` may hold, derived from the model.
fn model_keys() -> (Vec<String>, BTreeMap<String, Item>) {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL))
        .expect("read the config model");
    let items = parse_model(&src);
    assert!(
        matches!(items.get(ROOT), Some(Item::Struct(_))),
        "{MODEL} has no struct {ROOT}"
    );
    let mut walk = Walk {
        items: &items,
        expanded: BTreeSet::new(),
        keys: Vec::new(),
    };
    walk.value(
        "",
        &Ty {
            name: ROOT.to_string(),
            args: Vec::new(),
        },
    );
    // Every struct of the model is part of the document: one that is not reached was
    // missed by this reader (or is dead code).
    let unreached: Vec<&String> = items
        .iter()
        .filter(|(name, item)| !matches!(item, Item::Enum) && !walk.expanded.contains(*name))
        .map(|(name, _)| name)
        .collect();
    assert!(
        unreached.is_empty(),
        "structs of {MODEL} not reached from {ROOT}: {unreached:?}"
    );
    (walk.keys, items)
}

/// The keys the reference documents: the first backticked cell of each table row.
fn reference_keys(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .map(|rest| rest.split('`').next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn the_reference_documents_every_key_of_the_model_and_no_other() {
    let (model, _) = model_keys();
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE))
        .expect("read the configuration reference");
    let documented = reference_keys(&text);

    let mut seen = BTreeSet::new();
    let twice: Vec<&String> = documented.iter().filter(|k| !seen.insert(*k)).collect();
    let model_set: BTreeSet<&String> = model.iter().collect();
    let undocumented: Vec<&String> = model.iter().filter(|k| !seen.contains(k)).collect();
    let unknown: Vec<&String> = documented
        .iter()
        .filter(|k| !model_set.contains(k))
        .collect();
    assert!(
        twice.is_empty() && undocumented.is_empty() && unknown.is_empty(),
        "{REFERENCE} and {MODEL} disagree.\n\
         Keys of the model missing from the reference (add a row `| `KEY` | ... |`): \
         {undocumented:#?}\n\
         Keys of the reference the model does not have: {unknown:#?}\n\
         Keys documented twice: {twice:#?}"
    );
}

#[test]
fn the_model_reader_finds_known_keys() {
    // The reader itself: a few keys of each kind of path, so a reader that found nothing
    // (and a reference emptied to match) cannot pass.
    let (keys, items) = model_keys();
    for key in [
        "server.listen",
        "server.tls.cert",
        "store.sentinel.master",
        "limits.<name>.per_minute",
        "limits.<name>.ban.after",
        "tiers.<name>.key",
        "routes.limits",
        "routes.adaptive.min_factor",
        "auth.jwt.algorithms",
        "blocks.expires_at",
    ] {
        assert!(
            keys.iter().any(|k| k == key),
            "{key} not derived from {MODEL}"
        );
    }
    assert!(
        items.len() > 20,
        "only {} items read from {MODEL}",
        items.len()
    );
}

#[test]
fn renames_and_unknown_serde_attributes_are_read() {
    let src = "\
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    #[serde(rename = \"a-b\")]
    pub(crate) a_b: Option<Spanned<Inner>>,
    #[serde(default)]
    pub(crate) names: BTreeMap<String, Inner>,
}

/// Doc.
#[derive(Deserialize)]
pub(crate) struct Inner {
    pub(crate) x: u32,
}
";
    let items = parse_model(src);
    let Some(Item::Struct(fields)) = items.get("File") else {
        panic!("File not read: {items:?}");
    };
    assert_eq!(fields[0].0, "a-b");
    let flattened = src.replace("#[serde(default)]", "#[serde(flatten)]");
    let refused = std::panic::catch_unwind(|| parse_model(&flattened));
    assert!(
        refused.is_err(),
        "a flatten attribute must not be skipped silently"
    );
}
