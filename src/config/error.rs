//! Config errors that name `file:line:col`.

use std::fmt;
use std::ops::Range;

/// A config error at a position in a file (or the whole file when unreadable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file as named by the user.
    pub file: String,
    /// 1-based line and column, when the error has a position.
    pub position: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

// === impl ConfigError ===

impl ConfigError {
    /// An error at byte span `span` of `source`.
    pub fn at(
        file: &str,
        source: &str,
        span: Option<Range<usize>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            file: file.to_string(),
            position: span.map(|s| line_col(source, s.start)),
            message: message.into(),
        }
    }

    /// An error about the file as a whole.
    pub fn file(file: &str, message: impl Into<String>) -> Self {
        Self {
            file: file.to_string(),
            position: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, col)) => write!(f, "{}:{}:{}: {}", self.file, line, col, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// 1-based (line, column in characters) of byte `offset` in `source`.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = source.get(..offset).unwrap_or(source);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines and columns are 1-based and count characters, not bytes.
    #[test]
    fn line_col_counts_from_one() {
        let s = "a = 1\nbé = 2\n";
        assert_eq!(line_col(s, 0), (1, 1));
        assert_eq!(line_col(s, 6), (2, 1));
        assert_eq!(line_col(s, 9), (2, 3));
        let e = ConfigError::at("gw.toml", s, Some(6..7), "bad");
        assert_eq!(e.to_string(), "gw.toml:2:1: bad");
    }
}
