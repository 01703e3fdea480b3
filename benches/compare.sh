#!/bin/bash
# Times `pdinject --buildids FILE OUT` against `perf inject -b -i FILE -o OUT` (the
# system perf, and perf 6.12 from /tmp/p612 when present) on each FILE: best of 3
# wall-clock runs each, output on a tmpfs, then the number of BUILD_ID entries each
# output holds (entries of `perf buildid-list -i OUT` with an ID, read with perf 6.12 if present).
# Two more rows put the figures in proportion:
#   cp           `cp FILE OUT`: copying the bytes to the same place, the floor of any
#                tool that writes a new file (pdinject must write the data section too);
#   perf-script  `perf script -F ip,dso -i FILE >/dev/null` (only with SCRIPT=1): perf's
#                own DWARF unwinder, the work pdinject's resolve stage does for
#                `--call-graph dwarf` recordings (minutes on multi-GB files).
#
# Usage (from anywhere): bash benches/compare.sh FILE...
# Environment: RUNS (default 3), PDI_ARGS (extra pdinject arguments, e.g. "-j 1"),
#              TMPDIR_OUT (output directory; default a new dir on /dev/shm),
#              SCRIPT=1 (add the perf-script row).
set -euo pipefail

if [ $# -eq 0 ]; then
    echo "usage: bash benches/compare.sh FILE..." >&2
    exit 2
fi
# Make the file arguments absolute before changing to the crate root.
files=()
for f in "$@"; do
    if [ ! -e "$f" ]; then
        echo "compare.sh: $f: no such file" >&2
        exit 2
    fi
    files+=("$(cd "$(dirname "$f")" && pwd)/$(basename "$f")")
done
cd "$(dirname "$0")/.."

runs=${RUNS:-3}
read -r -a pdi_args <<<"${PDI_ARGS:-}"

echo "compare.sh: building the release binary" >&2
cargo build --release --quiet
pdinject=$PWD/target/release/pdinject

tools=(pdinject)
perf61=$(command -v perf || true)
[ -n "$perf61" ] && tools+=(perf)
p612=/tmp/p612/usr/bin/perf
p612_lib=/tmp/p612/usr/lib/x86_64-linux-gnu
[ -x "$p612" ] && tools+=(perf612)
[ -n "$perf61" ] && [ "${SCRIPT:-0}" = 1 ] && tools+=(perf-script)
tools+=(cp)

if [ -n "${TMPDIR_OUT:-}" ]; then
    out_dir=$TMPDIR_OUT
    mkdir -p "$out_dir"
else
    base=/dev/shm
    [ -d "$base" ] && [ -w "$base" ] || base=${TMPDIR:-/tmp}
    out_dir=$(mktemp -d "$base/pdinject-compare.XXXXXX")
    trap 'rm -rf "$out_dir"' EXIT
fi

version() {
    case $1 in
    pdinject) echo "pdinject" ;;
    perf) echo "perf $("$perf61" --version | awk '{print $3}')" ;;
    perf612) echo "perf $(LD_LIBRARY_PATH=$p612_lib "$p612" --version | awk '{print $3}')" ;;
    perf-script) echo "perf $("$perf61" --version | awk '{print $3}') script -F ip,dso" ;;
    cp) echo "$(cp --version | head -1)" ;;
    esac
}

# run TOOL IN OUT: one run, output to OUT; stderr to $out_dir/TOOL.err.
run() {
    local tool=$1 in=$2 out=$3
    rm -rf "$out"
    case $tool in
    pdinject) "$pdinject" --buildids "$in" "$out" "${pdi_args[@]}" ;;
    perf) "$perf61" inject -b -i "$in" -o "$out" ;;
    perf612) LD_LIBRARY_PATH=$p612_lib "$p612" inject -b -i "$in" -o "$out" ;;
    perf-script) "$perf61" script -F ip,dso -i "$in" ;;
    cp) cp -r "$in" "$out" ;;
    esac >/dev/null 2>"$out_dir/$tool.err"
}

# best TOOL IN OUT: the best wall time of $runs runs in seconds, or "fail".
best() {
    local tool=$1 in=$2 out=$3 best= t i
    for ((i = 0; i < runs; i++)); do
        local s e
        s=$(date +%s.%N)
        if ! run "$tool" "$in" "$out"; then
            echo fail
            return
        fi
        e=$(date +%s.%N)
        t=$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.6f", e - s }')
        if [ -z "$best" ] || awk -v t="$t" -v b="$best" 'BEGIN { exit !(t < b) }'; then best=$t; fi
    done
    awk -v b="$best" 'BEGIN { printf "%.3f\n", b }'
}

# count_ids OUT: entries with an ID in `perf buildid-list -i OUT`, read with perf 6.12 when present
# (perf 6.1 refuses files perf 6.12 wrote: their attrs are 8 bytes longer), else the
# system perf; "?" when the reader fails, "-" when there is no output.
count_ids() {
    local out=$1 list
    [ -e "$out" ] || {
        echo "-"
        return 0
    }
    if [ -x "$p612" ]; then
        list=$(LD_LIBRARY_PATH=$p612_lib "$p612" buildid-list -i "$out" 2>/dev/null) || list=\?
    else
        list=$("$perf61" buildid-list -i "$out" 2>/dev/null) || list=\?
    fi
    # Without a table, buildid-list lists hit DSOs with an empty ID: count IDs only.
    if [ "$list" = "?" ]; then echo "?"; else awk 'NF >= 2' <<<"$list" | grep -c . || true; fi
}

echo "compare.sh: best of $runs runs, outputs in $out_dir; cores: $(nproc)" >&2
for t in "${tools[@]}"; do echo "  $t = $(version "$t")" >&2; done
printf '%-22s %10s %-10s %9s %9s %8s\n' file size tool seconds tool/pdi build-ids
for f in "${files[@]}"; do
    name=$(basename "$f")
    size=$(du -h --apparent-size "$f" | cut -f1)
    pdi_t=
    for t in "${tools[@]}"; do
        out="$out_dir/$name.$t.out"
        secs=$(best "$t" "$f" "$out")
        ids=$(count_ids "$out")
        ratio=-
        if [ "$t" = pdinject ]; then
            pdi_t=$secs
        elif [ "$secs" != fail ] && [ -n "$pdi_t" ] && [ "$pdi_t" != fail ]; then
            ratio=$(awk -v a="$secs" -v b="$pdi_t" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "inf" }')
        fi
        printf '%-22s %10s %-10s %9s %9s %8s\n' "$name" "$size" "$t" "$secs" "$ratio" "$ids"
        if [ "$secs" = fail ]; then
            sed 's/^/    /' "$out_dir/$t.err" | tail -3
        fi
        rm -rf "$out"
    done
done
