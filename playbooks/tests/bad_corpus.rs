//! Every file in tests/bad/ is rejected at the location and with the message
//! its first line announces: `# expect: LINE:COLUMN message fragment`.

use std::path::PathBuf;

use playbooks::{check_files, toml_files};

struct Expect {
    line: usize,
    column: usize,
    fragment: String,
}

fn expectation(text: &str) -> Option<Expect> {
    let first = text.lines().next()?;
    let rest = first.strip_prefix("# expect: ")?;
    let (at, fragment) = rest.split_once(' ')?;
    let (line, column) = at.split_once(':')?;
    Some(Expect {
        line: line.parse().ok()?,
        column: column.parse().ok()?,
        fragment: fragment.to_string(),
    })
}

#[test]
fn every_bad_playbook_is_rejected_where_and_how_announced() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/bad");
    let files = toml_files(&dir).expect("tests/bad");
    assert!(files.len() >= 30, "only {} bad playbooks", files.len());
    let mut failures = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let Some(want) = expectation(&text) else {
            failures.push(format!(
                "{name}: first line is not `# expect: L:C fragment`"
            ));
            continue;
        };
        let diags = check_files(&[f]);
        let Some(got) = diags.first() else {
            failures.push(format!("{name}: accepted"));
            continue;
        };
        if got.line != want.line
            || got.column != want.column
            || !got.message.contains(&want.fragment)
            || !got.file.ends_with(&name)
            || got.hint.is_none()
        {
            failures.push(format!(
                "{name}: want {}:{} {:?} with a hint, got {got}",
                want.line, want.column, want.fragment
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
