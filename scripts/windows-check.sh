#!/usr/bin/env bash
# The Windows build of the app, checked from Linux, and the "when to train"
# readers of `app/src/gui/desktop.rs` run under Wine.
#
#   1. `cargo clippy` (a check, warnings denied) of cohort-app (library and binary) for
#      x86_64-pc-windows-gnu: everything `#[cfg(windows)]` / not-Linux in
#      the app compiles (tray-icon, user-idle, starship-battery, the shell's
#      full-screen query), with the workspace's own lock file.
#   2. A throw-away program that includes `desktop.rs` itself (`#[path]`),
#      built for Windows and run under `wine` when it is installed: the
#      readings must come back (idle time and power source), the full-screen
#      query must answer.
#
# Needs: rustup's x86_64-pc-windows-gnu target, MinGW-w64 gcc (Debian:
# gcc-mingw-w64-x86-64), and Wine for step 2 (Debian: wine64). Exits non-zero on any
# failure; step 2 is refused, not skipped, without wine unless
# COHORT_NO_WINE=1 is set.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=x86_64-pc-windows-gnu
tdir=${CARGO_TARGET_DIR_WINDOWS:-$HOME/.cache/cohort-win-target}

rustup target list --installed | grep -qx "$target" || {
    echo "windows-check: rustup target $target is not installed (rustup target add $target)" >&2
    exit 2
}
command -v x86_64-w64-mingw32-gcc >/dev/null || {
    echo "windows-check: x86_64-w64-mingw32-gcc not found (Debian: gcc-mingw-w64-x86-64)" >&2
    exit 2
}

echo "== 1. cargo clippy -p cohort-app --target $target"
CARGO_TARGET_DIR=$tdir cargo clippy --locked --target "$target" -p cohort-app --lib --bins -- -D warnings

echo "== 2. desktop.rs under Wine"
wine=$(command -v wine || command -v wine64 || ls /usr/lib/wine/wine64 2>/dev/null || true)
if [ -z "$wine" ]; then
    if [ "${COHORT_NO_WINE:-0}" = 1 ]; then
        echo "windows-check: wine not installed; step 2 not run (COHORT_NO_WINE=1)"
        exit 0
    fi
    echo "windows-check: wine not installed (Debian: wine64), or set COHORT_NO_WINE=1" >&2
    exit 2
fi
smoke=$(mktemp -d)
trap 'rm -rf "$smoke"' EXIT
mkdir -p "$smoke/src"
# The same crate versions as the app's lock file.
ver() { awk -v n="$1" '$0=="name = \""n"\"" {getline; gsub(/version = |"/,""); print; exit}' "$root/Cargo.lock"; }
cat > "$smoke/Cargo.toml" <<TOML
[package]
name = "desktop-smoke"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
user-idle = "=$(ver user-idle)"
starship-battery = "=$(ver starship-battery)"
windows-sys = { version = "=0.61.2", features = ["Win32_UI_Shell"] }

[workspace]
TOML
cat > "$smoke/src/main.rs" <<RS
#[path = "$root/app/src/gui/desktop.rs"]
mod desktop;

fn main() {
    let idle = desktop::input_idle();
    let battery = desktop::on_battery();
    let fullscreen = desktop::fullscreen();
    println!("input_idle={idle:?} on_battery={battery:?} fullscreen={fullscreen:?}");
    let ok = idle.is_some() && battery.is_some() && fullscreen.is_some();
    std::process::exit(if ok { 0 } else { 1 });
}
RS
CARGO_TARGET_DIR=$tdir/smoke cargo build --quiet --manifest-path "$smoke/Cargo.toml" --target "$target"
bin=$tdir/smoke/$target/debug
# Rust's std (1.78+) imports ProcessPrng from bcryptprimitives.dll, which
# Wine 8 (Debian 12) lacks: a stand-in that answers from RtlGenRandom.
cat > "$smoke/bcp.c" <<'C'
#include <windows.h>
#include <ntsecapi.h>
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG n = len > 0x7fffffff ? 0x7fffffff : (ULONG)len;
        if (!RtlGenRandom(data, n)) return FALSE;
        data += n; len -= n;
    }
    return TRUE;
}
C
x86_64-w64-mingw32-gcc -shared -o "$bin/bcryptprimitives.dll" "$smoke/bcp.c" -ladvapi32
WINEDEBUG=-all WINEPREFIX=${WINEPREFIX:-$tdir/wine} "$wine" "$bin/desktop-smoke.exe"
echo "windows-check: ok"
