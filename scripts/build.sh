#!/usr/bin/env bash
# Release build of berth's two binaries: `berthd` (daemons) and the client `berth`, linked
# statically and not position-independent: no dynamic loading and no relocation at start, so
# every command, above all each `berth run`, starts ~0.45 ms sooner (BENCHMARKS.md, issue 4).
# A plain `cargo build --release` builds the same client dynamically (it works the same, it
# starts slower).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin berthd
if ! cargo rustc --release -p berth --bin berth -- -C target-feature=+crt-static -C relocation-model=static; then
  echo "WARNING: the static link of the berth client failed; building it dynamically (it starts slower)" >&2
  cargo build --release --bin berth
fi
