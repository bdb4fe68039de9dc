#!/usr/bin/env bash
# The README's first command: builds railguard and runs the demo (a real
# cluster in network namespaces: a NIC flap and a flap storm, then ringtrain
# across four hosts surviving a pulled cable; a printed timeline). The last
# line is the demo's JSON summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --workspace --bins
exec target/release/railguard-chaos demo
