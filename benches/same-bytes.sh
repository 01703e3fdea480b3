#!/bin/bash
# Before and after a refactor: runs two pdinject binaries on each FILE in every output
# form and checks that they write the same bytes, then prints each binary's wall time
# and peak RSS for the default form. A refactor that is meant to change nothing must
# print "same" on every line.
#
# Forms: the default table (`IN OUT`), `--buildid-all`, `--mmap2-buildids`,
# `--mmap2-buildid-all`, a stream on stdout (`IN -`), and `--in-place` on a copy.
# Every run gets `-N` (no build-ID cache) and an empty HOME, so both binaries see the
# same host and nothing is carried from one run to the next.
#
# Usage: bash benches/same-bytes.sh OLD_BINARY NEW_BINARY FILE...
# Environment: OUT (scratch directory; default a new dir on /dev/shm).
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: bash benches/same-bytes.sh OLD_BINARY NEW_BINARY FILE..." >&2
    exit 2
fi
old=$(realpath "$1")
new=$(realpath "$2")
shift 2
out=${OUT:-$(mktemp -d /dev/shm/same-bytes.XXXXXX)}
home=$(mktemp -d)
trap 'rm -rf "$home"; [ -z "${OUT:-}" ] && rm -rf "$out"' EXIT
export HOME="$home"
gnu_time=/usr/bin/time

fail=0
printf '%-16s %-20s %s\n' file form result
for f in "$@"; do
    name=$(basename "$f" .data)
    for form in table all mmap2 mmap2-all stream in-place; do
        case $form in
        table) args=() ;;
        all) args=(--buildid-all) ;;
        mmap2) args=(--mmap2-buildids) ;;
        mmap2-all) args=(--mmap2-buildid-all) ;;
        stream | in-place) args=() ;;
        esac
        for which in old new; do
            bin=${!which}
            # Both binaries write to the same path (messages name it), then it moves.
            o="$out/$name.$form.run"
            rm -rf "$o" "$o.err"
            case $form in
            stream) "$bin" -q -N "${args[@]}" "$f" - >"$o" 2>"$o.err" || echo "exit $?" >>"$o.err" ;;
            in-place)
                cp -a "$f" "$o"
                "$bin" -q -N --in-place "$o" 2>"$o.err" || echo "exit $?" >>"$o.err"
                ;;
            *) "$bin" -q -N "${args[@]}" "$f" "$o" 2>"$o.err" || echo "exit $?" >>"$o.err" ;;
            esac
            [ -e "$o" ] || : >"$o"
            mv "$o" "$out/$name.$form.$which"
            mv "$o.err" "$out/$name.$form.$which.err"
        done
        a="$out/$name.$form.old"
        b="$out/$name.$form.new"
        if cmp -s "$a.err" "$b.err" && diff -rq "$a" "$b" >/dev/null 2>&1; then
            r=same
        else
            r=DIFFERENT
            fail=1
        fi
        printf '%-16s %-20s %s\n' "$name" "$form" "$r"
        rm -rf "$a" "$b" "$a.err" "$b.err"
    done
    for which in old new; do
        bin=${!which}
        "$gnu_time" -f "%e %M" -o "$out/t" "$bin" -q -N "$f" "$out/t.data" 2>/dev/null || true
        # /usr/bin/time writes a line of its own before the figures when the run fails.
        read -r secs kb < <(tail -n 1 "$out/t")
        printf '%-16s %-20s %s s, %s MB\n' "$name" "time $which" "$secs" "$((kb / 1024))"
        rm -rf "$out/t.data"
    done
done
exit $fail
