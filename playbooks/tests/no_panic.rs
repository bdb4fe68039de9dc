//! Validation and planning never panic, whatever the input: random bytes,
//! random text, and random mutations of the shipped playbooks.

use std::path::PathBuf;

use proptest::prelude::*;

use playbooks::{
    check_sources, matching, parse, plan, toml_files, validate_set, ClusterView, HostStatus,
    HostView, IncidentView, NicHealth, NicView,
};

fn library_texts() -> Vec<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("library");
    let mut files = toml_files(&dir).unwrap();
    files.extend(toml_files(&dir.join("../tests/bad")).unwrap());
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect()
}

/// Pieces that push mutations towards interesting places.
const SNIPPETS: &[&str] = &[
    "\"",
    "[",
    "]",
    "[[steps]]\n",
    "=",
    "\n",
    "{",
    "}",
    "not ",
    "end",
    "escalate",
    "step-1",
    "99999999999999999999",
    "-1",
    "1e400",
    "\"1h\"",
    "\"0s\"",
    "é",
    "\u{0}",
    "\\u00e9",
    "'''",
    "action = \"drain\"\n",
    "next = \"step-9\"\n",
    "on_failure = \"x\"\n",
    "retries = 10\n",
    "when = \"job_checkpoint_younger_than 999999999y\"\n",
];

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize, usize),
    Insert(usize, usize),
    Duplicate(usize, usize),
    Byte(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0usize..40).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (any::<usize>(), 0..SNIPPETS.len()).prop_map(|(a, s)| Mutation::Insert(a, s)),
        (any::<usize>(), 0usize..200).prop_map(|(a, n)| Mutation::Duplicate(a, n)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Byte(a, b)),
    ]
}

fn apply(text: &str, muts: &[Mutation]) -> String {
    let mut b = text.as_bytes().to_vec();
    for m in muts {
        let len = b.len().max(1);
        match *m {
            Mutation::Delete(at, n) => {
                let at = at % len;
                let end = (at + n).min(b.len());
                if at < end {
                    b.drain(at..end);
                }
            }
            Mutation::Insert(at, s) => {
                let at = (at % len).min(b.len());
                b.splice(at..at, SNIPPETS[s].bytes());
            }
            Mutation::Duplicate(at, n) => {
                let at = at % len;
                let end = (at + n).min(b.len());
                if at < end {
                    let chunk = b[at..end].to_vec();
                    b.splice(end..end, chunk);
                }
            }
            Mutation::Byte(at, v) => {
                if !b.is_empty() {
                    let at = at % b.len();
                    b[at] = v;
                }
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn view() -> (IncidentView, ClusterView) {
    let mut view = ClusterView::default();
    let mut h = HostView {
        status: HostStatus::Ready,
        clock_synced: false,
        ..Default::default()
    };
    h.nics.insert(
        "eth1".into(),
        NicView {
            health: NicHealth::Down,
            rail: Some(0),
            backup: Some("eth2".into()),
        },
    );
    h.jobs.insert("train".into());
    view.hosts.insert("h1".into(), h);
    let inc = IncidentView {
        kind: "nic_down".into(),
        host: "h1".into(),
        nic: Some("eth1".into()),
        ..Default::default()
    };
    (inc, view)
}

/// Every parsed playbook is planned and matched without panicking; every
/// diagnostic has a real location.
fn exercise(text: &str) {
    match parse("fuzz.toml", text) {
        Ok(pb) => {
            let (mut inc, view) = view();
            for kind in ["nic_down", "nic_flapping", "host_down", "clock_unsynced"] {
                inc.kind = kind.into();
                let _ = plan(&pb, &inc, &view);
            }
            let set = vec![pb.clone(), pb];
            let _ = matching(&set, &inc);
            let _ = validate_set(&set);
        }
        Err(e) => {
            assert!(!e.diagnostics().is_empty());
            for d in e.diagnostics() {
                assert!(d.line >= 1 && d.column >= 1, "{d}");
                assert!(d.line <= text.lines().count().max(1) + 1, "{d}");
            }
        }
    }
    let _ = check_sources([("a.toml", text), ("b.toml", text)]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        exercise(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn random_text_never_panics(text in "[a-z_\\[\\]=\"{} \n.0-9-]{0,300}") {
        exercise(&text);
    }

    #[test]
    fn mutated_playbooks_never_panic(
        which in any::<usize>(),
        muts in proptest::collection::vec(mutation(), 1..6),
    ) {
        let texts = library_texts();
        let text = apply(&texts[which % texts.len()], &muts);
        exercise(&text);
    }
}

#[test]
fn oversized_file_is_refused_not_parsed() {
    let text = "# x\n".repeat(100_000);
    let err = parse("big.toml", &text).unwrap_err();
    assert!(err.to_string().contains("more than"), "{err}");
}
