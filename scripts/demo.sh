#!/usr/bin/env bash
# README's first command: build berth, start a local cluster, run the demonstration jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec ./target/release/berth demo "$@"
