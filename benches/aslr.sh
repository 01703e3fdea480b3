#!/bin/bash
# `pdinject --aslr FILE OUT` against perf 7.3's `perf inject --aslr -i FILE -o OUT`
# (/tmp/p73/perf; ../shared/tools/perf73.sh unpacks it) on each FILE: wall time, CPU
# time (user + system) and peak RSS of one run each (/usr/bin/time), the ratio of
# perf's wall time to pdinject's, whether `perf script` (perf 7.3: comm, tid, ip, sym,
# dso) reads the same of both outputs, and the leak scan of each (benches/leak-scan.py:
# input addresses still in the output). A DWARF recording (DWARF=FILE) is timed with
# `--aslr --convert-callchain` alone: perf 7.3 refuses that pair and drops every sample
# with a user stack. See docs/aslr.md.
#
# Usage: bash benches/aslr.sh FILE...
# Environment: PDINJECT (default target/release/pdinject), PERF73 (default
#              /tmp/p73/perf), OUT (output directory; default a new dir under /tmp),
#              DWARF (a --call-graph dwarf recording).
set -euo pipefail
cd "$(dirname "$0")/.."
pdi=${PDINJECT:-$PWD/target/release/pdinject}
p73=${PERF73:-/tmp/p73/perf}
out=${OUT:-$(mktemp -d /tmp/pdinject-aslr.XXXXXX)}
[ $# -gt 0 ] || { echo "usage: bash benches/aslr.sh FILE..." >&2; exit 2; }
[ -x "$pdi" ] || { echo "aslr.sh: build first (cargo build --release)" >&2; exit 2; }
[ -x "$p73" ] || { echo "aslr.sh: no perf 7.3 at $p73 (bash ../shared/tools/perf73.sh)" >&2; exit 2; }

# wall s, cpu s, rss KB of a command
measure() {
    /usr/bin/time -f "%e %U %S %M" -o "$out/time" "$@" >/dev/null 2>"$out/err" || {
        cat "$out/err" >&2
        return 1
    }
    awk '{printf "%8.2f %8.2f %10d", $1, $2 + $3, $4}' "$out/time"
}
leaks() { # input output -> "leaked of addresses"
    python3 benches/leak-scan.py --json "$1" "$2" |
        python3 -c 'import json,sys; v=json.load(sys.stdin); print("%d/%d" % (v["leaked_distinct"], v["input_addresses"]))'
}

printf "%-18s %-9s %8s %8s %10s %8s %12s\n" file tool wall-s cpu-s rss-KB ratio leaked
for f in "$@"; do
    b=$(basename "$f")
    # The page cache holds the input for both (one untimed read first).
    cat "$f" >/dev/null
    m_pdi=$(measure "$pdi" -q -N --aslr "$f" "$out/$b.pdi")
    m_p73=$(measure "$p73" inject --aslr -i "$f" -o "$out/$b.p73")
    w_pdi=$(echo "$m_pdi" | awk '{print $1}')
    w_p73=$(echo "$m_p73" | awk '{print $1}')
    ratio=$(awk -v a="$w_p73" -v b="$w_pdi" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "-" }')
    printf "%-18s %-9s %s %8s %12s\n" "$b" pdinject "$m_pdi" "$ratio" "$(leaks "$f" "$out/$b.pdi")"
    printf "%-18s %-9s %s %8s %12s\n" "$b" perf-7.3 "$m_p73" "" "$(leaks "$f" "$out/$b.p73")"
    args=(script -F comm,tid,ip,sym,dso)
    if cmp -s <("$p73" "${args[@]}" -i "$out/$b.pdi" 2>/dev/null) \
        <("$p73" "${args[@]}" -i "$out/$b.p73" 2>/dev/null); then
        echo "$b: perf 7.3 script reads the same of both outputs"
    else
        echo "$b: perf 7.3 script DIFFERS between the outputs"
    fi
    rm -f "$out/$b.pdi" "$out/$b.p73"
done
if [ -n "${DWARF:-}" ]; then
    b=$(basename "$DWARF")
    cat "$DWARF" >/dev/null
    printf "%-18s %-9s %s %8s %12s\n" "$b" pdinject \
        "$(measure "$pdi" -q -N --aslr --convert-callchain "$DWARF" "$out/$b.pdi")" "-" \
        "$(leaks "$DWARF" "$out/$b.pdi")"
    echo "$b: samples kept $("$p73" script -F ip -i "$out/$b.pdi" 2>/dev/null | grep -c .) (perf 7.3 --aslr keeps none with a user stack)"
fi
