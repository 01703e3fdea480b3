#!/bin/bash
# Coverage: which DSOs `perf script -F ip,dso` shows (perf's own view of what the samples
# touch, DWARF unwinding included; anonymous memory, heap, stack and inlined-frame
# markers left out) against the build-ID tables written by pdinject,
# perf 6.1 `inject -b` and (if unpacked by ../shared/tools/perf612.sh) perf 6.12.
# Pipe-format outputs have no table: there a DSO counts when perf reports receiving its
# HEADER_BUILD_ID record (`perf buildid-list -v`: "build id event received for P: ID"),
# since buildid-list itself lists only the DSOs of sample IPs for streams.
# Usage: benches/coverage.sh FILE...
set -uo pipefail
FILES=(); for f in "$@"; do FILES+=("$(realpath "$f")"); done
cd "$(dirname "$0")/.."
cargo build --release -q || exit 1
PDI=${PDI:-$PWD/target/release/pdinject}   # PDI=BIN measures another build (a baseline)
P612=/tmp/p612/usr/bin/perf
p612() { LD_LIBRARY_PATH=/tmp/p612/usr/lib/x86_64-linux-gnu $P612 "$@"; }
T=$(mktemp -d /dev/shm/pdi-cov.XXXXXX 2>/dev/null || mktemp -d); trap 'rm -rf "$T"' EXIT
# ids PERF... -- FILE: the paths with an ID that perf takes from FILE.
ids() {
  local f=${*: -1} cmd=("${@:1:$#-2}")
  if [ "$(head -c 16 "$f" | tail -c 8 | od -An -tu8 | tr -d ' ')" = 16 ]; then
    "${cmd[@]}" buildid-list -v -i "$f" 2>&1 >/dev/null | sed -n 's/^build id event received for \(.*\): [0-9a-f]*.*$/\1/p' | sort -u
  else
    "${cmd[@]}" buildid-list -i "$f" 2>/dev/null | awk 'NF==2{print $2}' | sort -u
  fi
}
printf '%-22s %8s %9s %9s %9s %s\n' file script pdinject perf6.1 perf6.12 "missed by pdinject (no ID and why)"
for f in "${FILES[@]}"; do
  perf script -F ip,dso -i "$f" 2>/dev/null | grep -o '([^()]*)$' | tr -d '()' | grep -v -e '^unknown$' -e '^\[unknown\]$' -e '^inlined$' -e '^//anon' -e '^\[heap\]$' -e '^\[stack' | sort -u > "$T/script"
  "$PDI" -q "$f" "$T/pdi.data" --report "$T/r.json" 2>/dev/null
  ids perf -- "$T/pdi.data" > "$T/pdi"
  perf inject -b -i "$f" -o "$T/p61.data" 2>/dev/null
  ids perf -- "$T/p61.data" > "$T/p61"
  if [ -x $P612 ]; then p612 inject -b -i "$f" -o "$T/p612.data" 2>/dev/null
    ids p612 -- "$T/p612.data" > "$T/p612"; else : > "$T/p612"; fi
  n=$(wc -l < "$T/script")
  c() { comm -12 "$T/script" "$T/$1" | wc -l; }
  missed=$(comm -23 "$T/script" "$T/pdi" | while read -r d; do
    why=$(python3 -c "import json,sys;r=json.load(open('$T/r.json'));print(next((x['reason'] or '?' for x in r['dsos'] if x['path']==sys.argv[1]),'not-hit'))" "$d"); echo -n "$d($why) "; done)
  printf '%-22s %8s %9s %9s %9s %s\n' "$(basename "$f")" "$n" "$(c pdi)/$n" "$(c p61)/$n" "$(c p612)/$n" "$missed"
done
