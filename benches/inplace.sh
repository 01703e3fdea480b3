#!/bin/bash
# Times `pdinject --buildids --in-place` on a copy of each FILE (the copy is reset
# between runs: header and feature tail put back, length cut, mtime restored, so
# every run starts from the recording as perf wrote it) against perf on FILE:
#   perf-script  `perf script -F ip,dso -i FILE >/dev/null` (perf's DWARF unwinder);
#   inject       perf 6.1 `perf inject -b -i FILE -o OUT` (OUT beside the copy).
# Best of RUNS (default 3) wall-clock seconds and max RSS of each, then the ratio.
#
# Usage: bash benches/inplace.sh FILE...     Environment: RUNS, WORK (directory for
# the copy and perf inject's output; default beside FILE), ROWS ("script inject").
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
pdinject=$PWD/target/release/pdinject
runs=${RUNS:-3}
rows=${ROWS:-script inject}

best() { sort -n | head -1; }
timed() { # prints "seconds maxrss_kb" of "$@"
    /usr/bin/time -f '%e %M' -o /tmp/inplace-bench.time "$@" >/dev/null 2>/dev/null || true
    cat /tmp/inplace-bench.time
}

for f in "$@"; do
    work=${WORK:-$(dirname "$f")}
    copy=$work/.inplace-bench-$(basename "$f")
    cp --reflink=auto "$f" "$copy"
    touch -r "$f" "$copy"
    len=$(stat -c %s "$f")
    # data_end = data.offset + data.size (header bytes 40..56, little-endian).
    read -r off size < <(od -An -t u8 -j 40 -N 16 "$f")
    data_end=$((off + size))
    head -c 4096 "$f" > "$copy.head"
    tail -c +$((data_end + 1)) "$f" > "$copy.tail"
    reset() {
        truncate -s "$len" "$copy"
        dd if="$copy.head" of="$copy" conv=notrunc status=none
        dd if="$copy.tail" of="$copy" bs=1M seek="$data_end" oflag=seek_bytes conv=notrunc status=none
        touch -r "$f" "$copy"
        rm -f "$(dirname "$copy")/.$(basename "$copy").pdinject-journal"
        # The copy's own writeback is not pdinject's cost: flush it before timing.
        sync "$copy"
    }
    pdi=()
    for _ in $(seq "$runs"); do
        reset
        pdi+=("$(timed "$pdinject" -q --buildids --in-place "$copy")")
    done
    cmp -s <(head -c 4096 "$f") <(head -c 4096 "$copy") && echo "warning: header unchanged" >&2
    p=$(printf '%s\n' "${pdi[@]}" | best)
    echo "$(basename "$f"): pdinject --in-place best ${p% *} s, max RSS ${p#* } KB (runs: ${pdi[*]})"
    for row in $rows; do
        res=()
        for _ in $(seq "$runs"); do
            case $row in
            script) res+=("$(timed perf script -F ip,dso -i "$f")") ;;
            inject)
                rm -f "$work/.inplace-bench-inject.data"
                res+=("$(timed perf inject -b -i "$f" -o "$work/.inplace-bench-inject.data")")
                ;;
            esac
        done
        r=$(printf '%s\n' "${res[@]}" | best)
        ratio=$(awk -v a="${r% *}" -v b="${p% *}" 'BEGIN { printf "%.1f", a / b }')
        echo "$(basename "$f"): perf $row best ${r% *} s, max RSS ${r#* } KB: ${ratio}x pdinject's time"
    done
    # perf inject keeps an earlier output as .old.
    rm -f "$copy" "$copy.head" "$copy.tail" "$work/.inplace-bench-inject.data"{,.old}
done
