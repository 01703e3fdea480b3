#!/bin/bash
# Every mode's speed, before and after a change, in one run: two pdinject binaries
# timed in alternation (A B A B ..., so a slow spell of the machine falls on both),
# each with a HOME of its own, on the recordings of record-corpus.sh in CORPUS.
# Prints per mode the median and best wall time of each and the median of the
# pair-by-pair ratios NEW/OLD (below 1: the new build is faster).
#
# Modes: the default table on fp-med, dwarf-med, multi, z and sys; --buildid-all,
# --mmap2-buildids and --mmap2-buildid-all on fp-med; --convert-callchain on
# dwarf-med; pipe-fp from stdin; dwarf-med to stdout; --in-place on a fresh copy of
# fp-med (the copy timed with it); --jit on CORPUS/jit/node.data when it is there (a
# node --perf-prof recording made with `perf record -k 1 -N`; its images are removed
# before each run).
#
# CACHE=user (the default) runs as users do: the build-ID cache is written, and the
# warm-up runs fill each HOME's cache before the counted ones (a file whose ctime moved
# is proven from what a run noted there: docs/cache.md). CACHE=none gives every run -N:
# what a first run costs.
#
# Usage: bash benches/modes.sh OLD_BINARY NEW_BINARY CORPUS
# Environment: RUNS (counted pairs, default 10), WARMUP (default 2), CACHE (user|none),
#   MODES (a list of the mode names printed, to time those alone),
#   OUT (scratch directory; default a new dir on /dev/shm).
set -euo pipefail
shopt -s inherit_errexit

if [ $# -ne 3 ]; then
    echo "usage: bash benches/modes.sh OLD_BINARY NEW_BINARY CORPUS" >&2
    exit 2
fi
old=$(realpath "$1")
new=$(realpath "$2")
corpus=$(realpath "$3")
timed="$(cd "$(dirname "$0")" && pwd)/timed.py"
runs=${RUNS:-10}
warmup=${WARMUP:-2}
case ${CACHE:-user} in
user) nflag=() ;;
none) nflag=(-N) ;;
*)
    echo "modes.sh: CACHE=$CACHE: expected user or none" >&2
    exit 2
    ;;
esac
out=${OUT:-$(mktemp -d /dev/shm/modes.XXXXXX)}
home_old=$(mktemp -d)
home_new=$(mktemp -d)
trap 'rm -rf "$home_old" "$home_new"; [ -z "${OUT:-}" ] && rm -rf "$out"' EXIT
cd "$corpus"

# One run of BIN (old or new) for mode NAME; its wall seconds on stdout.
run() {
    local who=$1 name=$2 bin home
    if [ "$who" = old ]; then bin=$old home=$home_old; else bin=$new home=$home_new; fi
    local o="$out/$name.$who.data" t="$out/t"
    local cmd=(env HOME="$home" "$bin" -q "${nflag[@]}")
    case $name in
    def-*) python3 "$timed" "$t" -- "${cmd[@]}" "${name#def-}.data" "$o" ;;
    buildid-all | mmap2-buildids | mmap2-buildid-all)
        python3 "$timed" "$t" -- "${cmd[@]}" "--$name" fp-med.data "$o" ;;
    convert) python3 "$timed" "$t" -- "${cmd[@]}" --convert-callchain dwarf-med.data "$o" ;;
    stdin)
        # --live off: the old build has no live capture; a stream of this host
        # recorded seconds ago would turn it on in the new one.
        local live=()
        "$bin" --help | grep -q -- '--live ' && live=(--live off)
        python3 "$timed" "$t" -- sh -c 'exec "$@" < pipe-fp.data' sh "${cmd[@]}" "${live[@]}" - "$o" ;;
    stdout) python3 "$timed" "$t" -- sh -c 'exec "$@" > "$0"' "$o" "${cmd[@]}" dwarf-med.data - ;;
    in-place) python3 "$timed" "$t" -- sh -c 'cp fp-med.data "$0" && exec "$@" --in-place "$0"' "$o" "${cmd[@]}" ;;
    jit)
        rm -f jit/jit-*.so jit/jitted-*.so
        python3 "$timed" "$t" -- "${cmd[@]}" --jit jit/node.data "$o" ;;
    esac >/dev/null 2>&1
    cat "$t"
}

modes=(def-fp-med def-dwarf-med def-multi def-z def-sys buildid-all mmap2-buildids
    mmap2-buildid-all convert stdin stdout in-place)
[ -e jit/node.data ] && modes+=(jit)
# MODES="in-place jit" times those alone.
[ -n "${MODES:-}" ] && read -r -a modes <<<"$MODES"
printf '%-18s %-17s %-17s %s\n' mode "old med (best)" "new med (best)" "new/old (median of pairs)"
for m in "${modes[@]}"; do
    for _ in $(seq "$warmup"); do run old "$m" >/dev/null; run new "$m" >/dev/null; done
    a=() b=()
    for _ in $(seq "$runs"); do
        a+=("$(run old "$m")")
        b+=("$(run new "$m")")
    done
    python3 - "$m" "${a[*]}" "${b[*]}" <<'EOF'
import statistics, sys
name, a, b = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ratio = statistics.median(y / x for x, y in zip(a, b))
print(f"{name:<18} {statistics.median(a):.3f} ({min(a):.3f})   {statistics.median(b):.3f} ({min(b):.3f})   {ratio:.2f}")
EOF
done
rm -f jit/jit-*.so jit/jitted-*.so
