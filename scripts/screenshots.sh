#!/usr/bin/env bash
# Opens the real desktop app under Xvfb, walks every screen on a fresh
# Sandbox wallet (`cohort app --tour`) and saves a screenshot of each to
# docs/screenshots/. Needs Xvfb (`apt-get install xvfb`); a software
# renderer (Mesa llvmpipe) is enough.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v xvfb-run >/dev/null || { echo "needs xvfb-run: apt-get install xvfb" >&2; exit 1; }
cargo build -q -p cohort-app --bin cohort
out=docs/screenshots
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
RUST_LOG=error xvfb-run -a -s "-screen 0 1280x900x24" \
  "${CARGO_TARGET_DIR:-target}/debug/cohort" app --tour "$tmp" | grep -E '^(screenshot|tour)'
grep -q '"ok":true' "$tmp/frames.json" || { echo "the tour did not finish" >&2; exit 1; }
mkdir -p "$out"
rm -f "$out"/*.png
cp "$tmp"/*.png "$out"/
ls "$out"
