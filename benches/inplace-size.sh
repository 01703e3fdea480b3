#!/bin/bash
# The file size before and after `pdinject MODE --in-place`, for each MODE, on a
# fresh copy of each FILE (mtime kept); with no FILE, on a `perf record -B -g`
# recording of a small workload (gzip, ls) made here first. perf's build-ID cache is
# left alone (-N).
#
# Usage: bash benches/inplace-size.sh [FILE...]
# Environment: MODES (default "--mmap2-buildid-all --mmap2-buildids --buildids"),
# WORK (directory for the recording and the copies; default /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
pdinject=$PWD/target/release/pdinject
work=${WORK:-/tmp}
modes=${MODES:---mmap2-buildid-all --mmap2-buildids --buildids}
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    rec=$work/inplace-size.data
    perf record -q -B -g -o "$rec" -- sh -c \
        'head -c 30000000 /dev/urandom | gzip -1 >/dev/null; ls -lR /usr/lib >/dev/null' \
        >/dev/null 2>&1
    files=("$rec")
fi
field() { sed -n "s/.*\"$1\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}\$/\1/p" "$2" | head -1; }
for f in "${files[@]}"; do
    for mode in $modes; do
        copy=$work/.inplace-size-$(basename "$f")
        cp "$f" "$copy"
        touch -r "$f" "$copy"
        before=$(stat -c %s "$copy")
        "$pdinject" -q -N "$mode" --in-place "$copy" --report "$copy.json"
        after=$(stat -c %s "$copy")
        echo "$(basename "$f"): $mode --in-place: $before -> $after bytes" \
            "(table $(field table "$copy.json"), $(field strings_repadded "$copy.json") strings re-padded," \
            "grew by $(field grew_bytes "$copy.json"))"
        rm -f "$copy" "$copy.json"
    done
done
