#!/bin/bash
# Builds pdinject's Debian package:   bash pkg/build-deb.sh [CARGO-DEB OPTIONS]
#
# Needs cargo-deb (`cargo install cargo-deb --locked`) and dpkg-shlibdeps (Debian's
# dpkg-dev) for the package's Depends. Builds the release binary (`--locked`), has it
# print its man pages and completions (`pdinject --generate ...`) into
# TARGET/release/pkg/, then lets cargo-deb pack the binary, those, the docs and the
# examples as [package.metadata.deb] of Cargo.toml lists them. The .deb's path is the
# last line printed (the debug symbols' .ddeb is beside it). CARGO_TARGET_DIR is
# honoured. See docs/install.md.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
cargo build --release --locked >&2
bin=$target/release/pdinject
assets=$target/release/pkg
rm -rf "$assets"
mkdir -p "$assets"
"$bin" --generate man >"$assets/pdinject.1"
"$bin" --generate man-batch >"$assets/pdinject-batch.1"
# Debian's man pages are gzipped; -n keeps the name and time out (same bytes each build).
gzip -9n "$assets/pdinject.1" "$assets/pdinject-batch.1"
"$bin" --generate complete-bash >"$assets/pdinject.bash"
"$bin" --generate complete-zsh >"$assets/_pdinject"
"$bin" --generate complete-fish >"$assets/pdinject.fish"

# The binary stripped, its debug info (the release profile keeps line tables) in a
# pdinject-dbgsym .ddeb beside the .deb, as Debian ships them. cargo-deb prints the
# paths it wrote.
deb=$(cargo deb --no-build --dbgsym "$@" | grep '\.deb$' | tail -n 1)
[ -f "$deb" ] || { echo "pkg/build-deb.sh: cargo deb wrote no package ($deb)" >&2; exit 1; }
echo "$deb"
