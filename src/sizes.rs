//! The size bar: no production function over `MAX_FN_LINES` lines and no production file
//! over `MAX_FILE_LINES` production lines under `src/`. Production code is what
//! `layering::production_files` reads (test items, test files and comments aside); a
//! function counts from its `fn` line to its closing brace.

use crate::layering::{close_brace, production_files};

const MAX_FN_LINES: usize = 80;
const MAX_FILE_LINES: usize = 600;

/// (name, first line, lines) of every function with a body in `code`, nested ones too.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let c = code.as_bytes();
    let line_of = |at: usize| c[..at].iter().filter(|&&b| b == b'\n').count() + 1;
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    for (at, _) in code.match_indices("fn") {
        let before = at.checked_sub(1).map(|k| c[k]);
        if before.is_some_and(ident) || !c.get(at + 2).is_some_and(u8::is_ascii_whitespace) {
            continue;
        }
        let rest = &code[at + 2..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|&ch| ch.is_ascii_alphanumeric() || ch == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body's brace, unless a `;` (a declaration without one) comes first; `;`
        // inside `()` and `[]` (array types) does not end the signature.
        let mut depth = 0usize;
        for (k, &b) in c.iter().enumerate().skip(at) {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth = depth.saturating_sub(1),
                b';' if depth == 0 => break,
                b'{' if depth == 0 => {
                    let end = close_brace(c, k);
                    out.push((name, line_of(at), line_of(end - 1) - line_of(at) + 1));
                    break;
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn functions_and_files_stay_small() {
    let mut over = Vec::new();
    let files = production_files();
    assert!(files.len() > 50, "too few files found: {}", files.len());
    for file in &files {
        let path = format!("src/{}", file.rel.display());
        if file.code.production_lines > MAX_FILE_LINES {
            over.push(format!(
                "{path}: {} production lines",
                file.code.production_lines
            ));
        }
        for (name, line, lines) in functions(&file.code.text) {
            if lines > MAX_FN_LINES {
                over.push(format!("{path}:{line}: fn {name} {lines} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "over {MAX_FN_LINES} lines a function or {MAX_FILE_LINES} a file:\n{}",
        over.join("\n")
    );
}

#[test]
fn function_lengths_run_from_fn_to_closing_brace() {
    let code = crate::layering::code(concat!(
        "/// doc\n",
        "#[inline]\n",
        "pub(crate) async fn a<T: Fn() -> u8>(x: [u8; 2]) -> u8\n",
        "where\n",
        "    T: Copy,\n",
        "{\n",
        "    let s = \"{\";\n",
        "    fn inner() {}\n",
        "    x[0]\n",
        "}\n",
        "trait T { fn decl(&self); fn with_body(&self) { } }\n",
        "type F = fn(u8) -> u8;\n",
        "#[cfg(test)]\n",
        "mod tests {\n",
        "    fn hidden() {\n",
        "    }\n",
        "}\n",
    ));
    let got = functions(&code.text);
    let want = [("a", 3, 8), ("inner", 8, 1), ("with_body", 11, 1)];
    let want: Vec<_> = want
        .iter()
        .map(|&(n, l, c)| (n.to_string(), l, c))
        .collect();
    assert_eq!(got, want);
}
