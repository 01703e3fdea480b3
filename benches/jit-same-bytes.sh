#!/bin/bash
# Before and after a refactor: records the real JIT workloads of tests/it/jit.rs
# (node --perf-prof running w.js, python3.13 -X perf_jit running w.py) and checks
# that two pdinject binaries write the same bytes for `--jit` on them. A refactor
# that is meant to change nothing must print "same" on every line.
#
# Forms: `--jit IN OUT` (file), `--jit --jit-maps all IN OUT` (maps-all), a stream
# on stdout (`--jit IN -`, stream-out), and a pipe-format copy of the recording
# (OLD_BINARY -N IN -) read from stdin (`cat IN.pipe | BIN --jit - OUT`, stream-in;
# `... - -`, stream-both). Compared per case: the output, the images written beside
# the jitdump (names and bytes: jit-PID.so, or jitted-PID-N.so), stderr, the exit
# code and what was left in HOME. The stdin forms get `--live off`: a stream of this
# host and boot turns live capture on, whose notes say how late the records arrived
# (wall-clock time, different on every run), and it is not the JIT's doing.
# Every run gets `-N`, an empty HOME and the same output path (messages name it); the
# images of the run before are moved away first, so both binaries read the same dumps
# and nothing of one run feeds the next.
#
# Usage: bash benches/jit-same-bytes.sh OLD_BINARY NEW_BINARY
# Environment: OUT (scratch directory; default a new dir on /dev/shm, removed unless
#   KEEP=1, which also keeps the runs of a DIFFERENT case as *.kept),
#   PDINJECT_TEST_PERF (perf to record with; default perf),
#   PDINJECT_PYTHON313 (python3.13; default ~/.pyenv/versions/*/bin/python3.13, then
#   python3.13 on PATH).
# A missing node or python3.13 (or a perf that cannot record) prints a SKIP line.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: bash benches/jit-same-bytes.sh OLD_BINARY NEW_BINARY" >&2
    exit 2
fi
old=$(realpath "$1")
new=$(realpath "$2")
perf=${PDINJECT_TEST_PERF:-perf}

# Found before HOME goes: pyenv's versions are under the real one.
python=
for p in "${PDINJECT_PYTHON313:-}" "$HOME"/.pyenv/versions/*/bin/python3.13 python3.13; do
    if [ -n "$p" ] && "$p" --version >/dev/null 2>&1; then
        python=$p
        break
    fi
done
node=
if node --version >/dev/null 2>&1; then node=$(command -v node); fi

out=${OUT:-$(mktemp -d /dev/shm/jit-same-bytes.XXXXXX)}
mkdir -p "$out"
home="$out/home"
pydump=
cleanup() {
    # CPython writes its dump in /tmp, outside the scratch directory.
    if [ -n "$pydump" ]; then
        local d pid
        d=$(dirname "$pydump")
        pid=$(basename "$pydump" .dump)
        pid=${pid#jit-}
        rm -f "$pydump" "$d/jit-$pid.so" "$d"/jitted-"$pid"-*.so
    fi
    [ -z "${OUT:-}" ] && [ -z "${KEEP:-}" ] && rm -rf "$out"
    return 0
}
trap cleanup EXIT
mkdir -p "$home"
export HOME="$home" PERF_PAGER=cat PAGER=cat

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# The jitdump a recording's marker mapping names.
dump_of() {
    "$perf" script -i "$1" --show-mmap-events 2>/dev/null |
        grep -o '/[^ ]*/jit-[0-9]*\.dump' | head -n 1 || true
}

# The images beside DUMP (jit-PID.so, jitted-PID-N.so), moved into DIR.
take_images() {
    local dump=$1 dir=$2 d pid f
    d=$(dirname "$dump")
    pid=$(basename "$dump" .dump)
    pid=${pid#jit-}
    mkdir -p "$dir"
    for f in "$d/jit-$pid.so" "$d"/jitted-"$pid"-*.so; do
        [ -e "$f" ] && mv "$f" "$dir/"
    done
    return 0
}

# The workloads of tests/it/jit.rs, from the fixtures both read.
fixtures="$(cd "$(dirname "$0")/.." && pwd)/testdata/fixtures/jit"
cp "$fixtures/node-work.js" "$out/w.js"
cp "$fixtures/python-work.py" "$out/w.py"

fail=0
printf '%-8s %-12s %s\n' workload form result
for w in node python; do
    rec="$out/$w"
    mkdir -p "$rec"
    data="$rec/$w.data"
    case $w in
    node)
        if [ -z "$node" ]; then
            echo "!!!!!!!! SKIP node: node not found on PATH (apt-get install nodejs) !!!!!!!!"
            continue
        fi
        # As record_node: perf record -k 1 -- node --perf-prof w.js 200 800 (the dump
        # goes into the cwd).
        cp "$out/w.js" "$rec/"
        cmd=(-k 1 -- "$node" --perf-prof w.js 200 800)
        ;;
    python)
        if [ -z "$python" ]; then
            echo "!!!!!!!! SKIP python: python3.13 not found (PDINJECT_PYTHON313, ~/.pyenv/versions/*/bin/python3.13, PATH) !!!!!!!!"
            continue
        fi
        # As jit_python_matches_perf_inject's fp case (the dump goes to /tmp).
        cp "$out/w.py" "$rec/"
        cmd=(-k 1 --call-graph fp -- "$python" -X perf_jit "$rec/w.py")
        ;;
    esac
    t0=$(now)
    if ! (cd "$rec" && "$perf" record -q -o "$data" "${cmd[@]}" >/dev/null 2>"$rec/record.err"); then
        echo "!!!!!!!! SKIP $w: perf record failed: $(tail -n 1 "$rec/record.err") !!!!!!!!"
        continue
    fi
    t1=$(now)
    dump=$(dump_of "$data")
    [ "$w" = python ] && pydump=$dump
    if [ -z "$dump" ] || [ ! -e "$dump" ]; then
        echo "$w: no jitdump in the recording ($dump)" >&2
        fail=1
        continue
    fi
    take_images "$dump" "$out/stale" # none expected; never fed to a run
    rm -rf "$out/stale"
    rm -rf "$home" && mkdir -p "$home"
    pipe=
    if "$old" -q -N "$data" - >"$rec/$w.pipe" 2>/dev/null; then pipe="$rec/$w.pipe"; fi

    for form in file maps-all stream-out stream-in stream-both; do
        if [ -z "$pipe" ] && [[ $form == stream-in || $form == stream-both ]]; then
            echo "!!!!!!!! SKIP $w $form: no pipe-format copy ($old -N IN -) !!!!!!!!"
            continue
        fi
        for which in old new; do
            bin=${!which}
            # Both binaries write to the same path (messages name it), then it moves.
            r="$out/run"
            o="$r/out.data"
            rm -rf "$r" "$home"
            mkdir -p "$r" "$home"
            take_images "$dump" "$out/stale" && rm -rf "$out/stale"
            case $form in
            file) "$bin" -N --jit "$data" "$o" 2>"$r/err" || echo "exit $?" >>"$r/err" ;;
            maps-all) "$bin" -N --jit --jit-maps all "$data" "$o" 2>"$r/err" || echo "exit $?" >>"$r/err" ;;
            stream-out) "$bin" -N --jit "$data" - >"$o" 2>"$r/err" || echo "exit $?" >>"$r/err" ;;
            stream-in) cat "$pipe" | "$bin" -N --live off --jit - "$o" 2>"$r/err" || echo "exit $?" >>"$r/err" ;;
            stream-both) cat "$pipe" | "$bin" -N --live off --jit - - >"$o" 2>"$r/err" || echo "exit $?" >>"$r/err" ;;
            esac
            [ -e "$o" ] || : >"$o"
            take_images "$dump" "$r/images"
            mv "$home" "$r/home"
            mv "$r" "$out/$w.$form.$which"
        done
        a="$out/$w.$form.old"
        b="$out/$w.$form.new"
        n=$(find "$a/images" -type f | wc -l)
        if diff -r "$a" "$b" >/dev/null 2>&1; then
            res=same
        else
            res="DIFFERENT: $({ diff -rq "$a" "$b" 2>&1 || true; } | sed "s|$out/||g" | tr '\n' ';')"
            fail=1
            # Kept for a look: KEEP=1 leaves them (and the scratch directory).
            if [ -n "${KEEP:-}" ]; then
                mv "$a" "$a.kept" && mv "$b" "$b.kept"
            fi
        fi
        printf '%-8s %-12s %s (%s image(s))\n' "$w" "$form" "$res" "$n"
        rm -rf "$a" "$b"
    done
    t2=$(now)
    printf '%-8s %-12s recorded in %s s, checked in %s s\n' "$w" time "$(secs "$t0" "$t1")" "$(secs "$t1" "$t2")"
done
exit $fail
