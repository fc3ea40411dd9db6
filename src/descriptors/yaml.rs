//! The YAML of a configuration file as a small tree whose every node keeps its position
//! (1-based line and column), read from saphyr-parser's events.
//!
//! The event loop keeps its own stack, so deep input costs no recursion, and refuses
//! nesting deeper than [`MAX_YAML_DEPTH`] (the tree is dropped recursively, so it stays
//! shallow). An alias shares the anchored node (an `Rc`), so the tree is never larger than
//! the text; what repeating it may cost is bounded by the loader.
//!
//! Scalars keep their text and whether they were plain (unquoted, untagged): a plain
//! scalar may resolve to null, a boolean or a number ([`is_null`], [`as_bool`],
//! [`is_number`]), as envoyproxy's yaml.v2 resolves them (YAML 1.1 booleans included).

use std::collections::HashMap;
use std::rc::Rc;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use super::RlsConfigError;

/// Deepest YAML nesting accepted (maps and lists, metadata included): the deepest
/// descriptor needs about `2 * MAX_DEPTH + 4`.
pub(super) const MAX_YAML_DEPTH: usize = 96;

/// A 1-based position.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pos {
    pub(super) line: usize,
    pub(super) col: usize,
}

/// A parsed YAML node and where it starts.
#[derive(Debug, Clone)]
pub(super) struct YNode {
    pub(super) at: Pos,
    pub(super) value: Rc<YValue>,
}

#[derive(Debug)]
pub(super) enum YValue {
    Null,
    /// `plain`: unquoted and not tagged `!!str`, so it may resolve to a number or a boolean.
    Str {
        text: String,
        plain: bool,
    },
    Seq(Vec<YNode>),
    Map(Vec<(YNode, YNode)>),
}

/// A collection being read.
struct Frame {
    at: Pos,
    anchor: usize,
    items: Vec<YNode>,
    /// A map: `items` alternate key, value.
    map: bool,
}

fn pos(span: &Span) -> Pos {
    Pos {
        line: span.start.line(),
        col: span.start.col() + 1,
    }
}

/// The document of `text` as a tree (None: no document at all).
pub(super) fn read_tree(file: &str, text: &str) -> Result<Option<YNode>, RlsConfigError> {
    let err = |at: Pos, message: String| RlsConfigError {
        file: file.to_string(),
        line: at.line,
        col: at.col,
        message,
    };
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, YNode> = HashMap::new();
    let mut root: Option<YNode> = None;
    let mut documents = 0;
    while let Some(event) = parser.next_event() {
        let (event, span) = event.map_err(|e| {
            let m = e.marker();
            let at = Pos {
                line: m.line(),
                col: m.col() + 1,
            };
            err(at, format!("invalid YAML: {}", e.info()))
        })?;
        let at = pos(&span);
        let (node, anchor) = match event {
            Event::StreamEnd => break,
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(err(at, "a file holds one YAML document".to_string()));
                }
                continue;
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if stack.len() >= MAX_YAML_DEPTH {
                    let m = format!("YAML nested deeper than {MAX_YAML_DEPTH} levels");
                    return Err(err(at, m));
                }
                let map = matches!(event, Event::MappingStart(..));
                let items = Vec::new();
                stack.push(Frame {
                    at,
                    anchor,
                    items,
                    map,
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = stack.pop() else {
                    return Err(err(at, "invalid YAML: unbalanced collection".to_string()));
                };
                let anchor = frame.anchor;
                (frame.close(), anchor)
            }
            Event::Scalar(text, style, anchor, tag) => {
                let tagged = tag.as_ref().map(|t| t.suffix.as_str());
                (scalar(at, text.into_owned(), style, tagged), anchor)
            }
            Event::Alias(id) => {
                let Some(target) = anchors.get(&id) else {
                    return Err(err(at, "invalid YAML: unknown alias".to_string()));
                };
                let value = target.value.clone();
                (YNode { at, value }, 0)
            }
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => continue,
        };
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            Some(frame) => frame.items.push(node),
            None => root = Some(node),
        }
    }
    Ok(root)
}

impl Frame {
    /// The collection read, as a node.
    fn close(self) -> YNode {
        let value = if self.map {
            let mut pairs = Vec::with_capacity(self.items.len() / 2);
            let mut items = self.items.into_iter();
            while let (Some(k), Some(v)) = (items.next(), items.next()) {
                pairs.push((k, v));
            }
            YValue::Map(pairs)
        } else {
            YValue::Seq(self.items)
        };
        YNode {
            at: self.at,
            value: Rc::new(value),
        }
    }
}

/// A scalar's node: null when tagged `!!null` or a plain null, else its text.
fn scalar(at: Pos, text: String, style: ScalarStyle, tagged: Option<&str>) -> YNode {
    let plain = style == ScalarStyle::Plain && tagged != Some("str");
    let value = if tagged == Some("null") || (plain && is_null(&text)) {
        YValue::Null
    } else {
        YValue::Str { text, plain }
    };
    YNode {
        at,
        value: Rc::new(value),
    }
}

/// YAML's null as a plain scalar.
pub(super) fn is_null(s: &str) -> bool {
    matches!(s, "" | "~" | "null" | "Null" | "NULL")
}

/// A plain scalar YAML resolves to a boolean (1.1, as yaml.v2 does).
pub(super) fn as_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "y" | "Y" => {
            Some(true)
        }
        "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "n" | "N" => {
            Some(false)
        }
        _ => None,
    }
}

/// Whether a plain scalar resolves to a number (an integer or a float, in any of YAML's
/// spellings), which makes it no string as a map key.
pub(super) fn is_number(s: &str) -> bool {
    let t = s.strip_prefix(['-', '+']).unwrap_or(s);
    let lower = t.to_ascii_lowercase();
    if matches!(lower.as_str(), ".inf" | ".nan") {
        return true;
    }
    for radix in ["0x", "0o", "0b"] {
        if let Some(digits) = lower.strip_prefix(radix) {
            return !digits.is_empty() && digits.chars().all(|c| c.is_ascii_hexdigit() || c == '_');
        }
    }
    let (mantissa, exponent) = match lower.split_once('e') {
        Some((m, e)) => (m, Some(e.strip_prefix(['-', '+']).unwrap_or(e))),
        None => (lower.as_str(), None),
    };
    let digits = mantissa.chars().filter(char::is_ascii_digit).count();
    let shape = mantissa
        .chars()
        .all(|c| c.is_ascii_digit() || c == '_' || c == '.')
        && mantissa.matches('.').count() <= 1;
    let exponent_ok =
        exponent.is_none_or(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_digit()));
    digits > 0 && shape && exponent_ok
}

/// What a node is, for messages.
pub(super) fn kind(node: &YNode) -> &'static str {
    match &*node.value {
        YValue::Null => "nothing",
        YValue::Str { .. } => "a scalar",
        YValue::Seq(_) => "a list",
        YValue::Map(_) => "a map",
    }
}
