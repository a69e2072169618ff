#!/usr/bin/env bash
# README's first command: build berth, start a local cluster, run the demonstration jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --bin berth
exec ./target/release/berth demo "$@"
