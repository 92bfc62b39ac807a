#!/usr/bin/env bash
# Regenerates the icon set (PNGs 32–512 px, icon.ico, icon.icns) from the
# vector source icons/icon.svg. The results are committed; run this after
# editing the SVG.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run -q --locked -p cohort-installer -- icons
