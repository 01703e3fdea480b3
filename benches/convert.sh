#!/bin/bash
# `pdinject --convert-callchain FILE OUT` against perf 7.3's `perf inject
# --convert-callchain -i FILE -o OUT` (/tmp/p73/perf; ../shared/tools/perf73.sh
# unpacks it) on each FILE: wall time, CPU time (user + system: the fair measure on a
# shared machine) and peak RSS of one run each (/usr/bin/time), the output sizes, and
# the share of samples whose chain in pdinject's output equals perf 7.3's own
# unwinding of the input (`perf script -F ip,sym,symoff,dso --no-inline`, the address
# column left out). With REPORT=1, `perf report --stdio` (the system perf) on the input
# and on pdinject's output. See docs/convert.md for figures and the classes of
# difference. perf 7.3's conversion of a multi-GB file takes minutes and as much
# memory as the file (it maps it); SKIP_PERF=1 leaves it out.
#
# Usage: bash benches/convert.sh FILE...
# Environment: PDINJECT (default target/release/pdinject), PERF73 (default
#              /tmp/p73/perf), OUT (output directory; default a new dir under /tmp),
#              SKIP_PERF=1, REPORT=1.
set -euo pipefail
cd "$(dirname "$0")/.."
pdi=${PDINJECT:-$PWD/target/release/pdinject}
p73=${PERF73:-/tmp/p73/perf}
out=${OUT:-$(mktemp -d /tmp/pdinject-convert.XXXXXX)}
[ $# -gt 0 ] || { echo "usage: bash benches/convert.sh FILE..." >&2; exit 2; }
[ -x "$pdi" ] || { echo "convert.sh: build first (cargo build --release)" >&2; exit 2; }

# wall s, cpu s, rss KB of a command
measure() {
    /usr/bin/time -f "%e %U %S %M" -o "$out/time" "$@" >/dev/null 2>"$out/err" || {
        cat "$out/err" >&2
        return 1
    }
    awk '{printf "%8.2f %8.2f %10d", $1, $2 + $3, $4}' "$out/time"
}

chains() { # perf FILE -> one line per sample, frames joined
    "$1" script -F ip,sym,symoff,dso --no-inline -i "$2" 2>/dev/null |
        awk 'NF == 0 { if (c != "") print c; c = ""; next }
             { sub(/^[ \t]*[^ ]+ /, ""); c = c "|" $0 }
             END { if (c != "") print c }'
}

printf "%-22s %-9s %8s %8s %10s %12s\n" file tool wall-s cpu-s rss-KB out-bytes
for f in "$@"; do
    b=$(basename "$f")
    printf "%-22s %-9s %s %12d\n" "$b" pdinject \
        "$(measure "$pdi" -q -N --convert-callchain "$f" "$out/$b.pdi")" \
        "$(stat -c %s "$out/$b.pdi")"
    if [ "${SKIP_PERF:-0}" != 1 ] && [ -x "$p73" ]; then
        printf "%-22s %-9s %s %12d\n" "$b" perf-7.3 \
            "$(measure "$p73" inject --convert-callchain -i "$f" -o "$out/$b.p73")" \
            "$(stat -c %s "$out/$b.p73")"
    fi
    if [ -x "$p73" ]; then
        chains "$p73" "$f" >"$out/$b.in.chains"
        chains "$p73" "$out/$b.pdi" >"$out/$b.pdi.chains"
        paste -d '\n' "$out/$b.in.chains" "$out/$b.pdi.chains" |
            awk -v f="$b" 'NR % 2 { a = $0; next } { n++; if ($0 == a) e++ }
                END { printf "%-22s chains equal to perf 7.3 unwinding the input: %d of %d (%.2f %%)\n", f, e, n, 100 * e / n }'
    fi
    if [ "${REPORT:-0}" = 1 ]; then
        for g in "$f" "$out/$b.pdi"; do
            printf "%-22s perf report --stdio on %s: %s\n" "$b" "$(basename "$g")" \
                "$(measure perf report --stdio -i "$g")"
        done
    fi
done
echo "outputs in $out"
