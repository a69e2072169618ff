#!/usr/bin/env bash
# README's second command: formatting, lints, unit and system tests (system tests need root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$(id -u)" -ne 0 ]; then
  echo "WARNING: not root: the cgroup and system tests will fail; run as root (CI does)." >&2
fi
# A non-root user for the tests that check jobs run as the submitting user.
if [ "$(id -u)" -eq 0 ] && ! id berthtest >/dev/null 2>&1; then
  groupadd -f berthgrp
  useradd --create-home --shell /bin/sh --groups berthgrp berthtest
fi
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
bash scripts/build.sh
cargo test --all-targets -- --test-threads 2
echo "all tests passed"
