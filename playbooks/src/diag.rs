//! Diagnostics: a message at `file:line:column` with an optional hint.

use std::fmt;
use std::ops::Range;

/// One problem found in a playbook file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    pub message: String,
    pub hint: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )?;
        if let Some(h) = &self.hint {
            write!(f, " (hint: {h})")?;
        }
        Ok(())
    }
}

/// A rejected playbook (or set): every diagnostic found, earliest first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render(.0))]
pub struct PlaybookError(pub Vec<Diagnostic>);

impl PlaybookError {
    pub fn diagnostics(&self) -> &[Diagnostic] {
        &self.0
    }
}

fn render(d: &[Diagnostic]) -> String {
    let mut out = String::new();
    for (i, d) in d.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&d.to_string());
    }
    out
}

/// Maps byte offsets of one text to line:column.
#[derive(Clone, Debug)]
pub(crate) struct Source<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl Source<'_> {
    /// 1-based line and character column of a byte offset (clamped).
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }

    pub fn diag(
        &self,
        span: Option<Range<usize>>,
        message: String,
        hint: Option<String>,
    ) -> Diagnostic {
        let (line, column) = span.map_or((1, 1), |s| self.line_col(s.start));
        Diagnostic {
            file: self.file.to_string(),
            line,
            column,
            message,
            hint,
        }
    }
}

/// Levenshtein distance, bounded input (names are short; longer inputs are
/// cut so this stays cheap on hostile text).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().take(128).collect();
    let b: Vec<char> = b.chars().take(128).collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The closest candidate within a small distance, if any.
pub(crate) fn closest<'c>(
    word: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> Option<&'c str> {
    let limit = (word.chars().count() / 3).clamp(1, 3);
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, c)| (*d, *c))
        .map(|(_, c)| c)
}

/// "did you mean `x`?" or the list of valid names.
pub(crate) fn suggest(word: &str, candidates: &[&str]) -> String {
    match closest(word, candidates.iter().copied()) {
        Some(c) => format!("did you mean \"{c}\"?"),
        None => format!("expected one of: {}", candidates.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use crate::diag::*;

    #[test]
    fn distance_and_suggestion() {
        assert_eq!(edit_distance("migrate_qp", "migrate_qps"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(closest("cordn", ["cordon", "drain"]), Some("cordon"));
        assert_eq!(closest("zzzzzz", ["cordon", "drain"]), None);
    }

    #[test]
    fn line_col_counts_characters() {
        let s = Source {
            file: "f",
            text: "a = 1\nbé = \"x\"\n",
        };
        assert_eq!(s.line_col(0), (1, 1));
        assert_eq!(s.line_col(6), (2, 1));
        // "é" is two bytes: byte 10 is the "=", the 4th character.
        assert_eq!(s.line_col(10), (2, 4));
        assert_eq!(s.line_col(10_000), (3, 1));
    }
}
