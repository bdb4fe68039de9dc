#!/usr/bin/env bash
# The README's second command (and CI's): installs what is missing, checks
# formatting and lints, builds every binary (the scenario tests start real
# supervisor processes from target/debug), then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A clean clone gains nothing from incremental artifacts; they only cost disk.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
cargo fmt --all --check
# No import circles between the files of a crate, no non-test file over
# 1,200 lines (see ARCHITECTURE.md).
python3 scripts/layout.py
/usr/bin/python3 -m pytest python/tests -q
cargo clippy --workspace --all-targets --all-features -- -D warnings
cargo build --workspace --bins --all-features
cargo test --workspace --all-features
