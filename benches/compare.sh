#!/bin/bash
# Times `pdinject --buildids FILE OUT` against `perf inject -b -i FILE -o OUT` (the
# system perf, and perf 6.12 from /tmp/p612 when present) on each FILE: best of 3
# wall-clock runs each, taken in 3 rounds that run every tool once (so that a slow
# spell of the machine does not fall on one tool's runs only), output on a tmpfs, then
# the number of BUILD_ID entries each output holds (entries of `perf buildid-list -i
# OUT` with an ID, read with perf 6.12 if present, from the last round's output).
# Two more rows put the figures in proportion:
#   cp           `cp FILE OUT`: copying the bytes to the same place, the floor of any
#                tool that writes a new file (pdinject must write the data section too);
#   perf-script  `perf script -F ip,dso -i FILE >/dev/null` (only with SCRIPT=1): perf's
#                own DWARF unwinder, the work pdinject's resolve stage does for
#                `--call-graph dwarf` recordings (minutes on multi-GB files).
# With BASELINE=/path/to/pdinject, a row `pdi-base` times that binary with the same
# arguments as pdinject (before/after a change in one run; its tool/pdi ratio > 1 means
# the current build is faster). Every run is timed by benches/timed.py, from its fork
# to its end (no shell, no date, no GNU time in the time: those added 2-3 ms to each
# run, a fifth of a 14 ms one). With RSS=1 a column `rss-KB` gives each tool's peak
# RSS, from one more run of each under /usr/bin/time -f %M after the timed rounds
# (with SCRIPT=1, one more perf script too).
#
# With INPLACE=1, two rows time the in-place modes, each on its own copy of FILE made
# beside it (same filesystem; WORK=DIR puts them elsewhere), reset to FILE's bytes and
# mtime before each run, untimed (see make_copy):
#   pdi-inplace  `pdinject --buildids --in-place COPY`;
#   pdi-mmap2-ip `pdinject --mmap2-buildid-all --in-place COPY`, whose size change is
#                printed after the table.
# and a summary line gives perf-script's (SCRIPT=1) and perf's times over pdi-inplace's.
#
# With MODE=convert, the job is `--convert-callchain` instead: rows pdinject
# (`pdinject --convert-callchain FILE OUT`), perf73 (`perf inject --convert-callchain`
# of perf 7.3 from /tmp/p73, ../shared/tools/perf73.sh) and cp; build IDs are counted
# with perf 7.3 (perf 6.1 and 6.12 refuse perf 7.3's output: its attrs are 144 bytes).
# With MODE=jit, the job is `--jit`: rows pdinject (`pdinject --jit`), perf (`perf
# inject --jit`, which also writes one jitted-PID-N.so per code load beside each
# jitdump), perf73 and cp; a column counts the files each run left in the jitdumps'
# directories (JITDIR=DIR names it; default the input's directory).
#
# Usage (from anywhere): bash benches/compare.sh FILE...
# Environment: RUNS (default 3), PDI_ARGS (extra pdinject arguments, e.g. "--jobs 1"),
#              TMPDIR_OUT (output directory; default a new dir on /dev/shm),
#              SCRIPT=1 (add the perf-script row),
#              BASELINE (a second pdinject binary, row pdi-base), RSS=1 (peak RSS column),
#              INPLACE=1 (the in-place rows), WORK (directory of their copies).
set -euo pipefail
# A failing step inside $(...) (a copy's reset, the images' removal) stops the script
# too, instead of timing a run on what it left.
shopt -s inherit_errexit

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
# Resolve BASELINE before changing directory, so a relative path works.
baseline=
if [ -n "${BASELINE:-}" ]; then
    if [ ! -x "$BASELINE" ] || [ -d "$BASELINE" ]; then
        echo "compare.sh: BASELINE=$BASELINE: not an executable file" >&2
        exit 2
    fi
    baseline="$(cd "$(dirname "$BASELINE")" && pwd)/$(basename "$BASELINE")"
fi
rss=${RSS:-0}
gnu_time=/usr/bin/time
if [ "$rss" = 1 ] && [ ! -x "$gnu_time" ]; then
    echo "compare.sh: RSS=1 needs GNU time at $gnu_time (apt-get install time)" >&2
    exit 2
fi
if ! command -v python3 >/dev/null; then
    echo "compare.sh: needs python3 (benches/timed.py times each run)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
timed=$PWD/benches/timed.py

runs=${RUNS:-3}
read -r -a pdi_args <<<"${PDI_ARGS:-}"
mode=${MODE:-buildids}
case $mode in
buildids) job=(--buildids) ;;
convert) job=(--convert-callchain) ;;
jit) job=(--jit) ;;
*)
    echo "compare.sh: MODE=$mode: expected buildids, convert or jit" >&2
    exit 2
    ;;
esac
p73=${PERF73:-/tmp/p73/perf}
if [ "$mode" = convert ] && [ ! -x "$p73" ]; then
    echo "compare.sh: MODE=convert needs perf 7.3 at $p73 (bash ../shared/tools/perf73.sh)" >&2
    exit 2
fi

echo "compare.sh: building the release binary" >&2
cargo build --release --quiet
pdinject=$PWD/target/release/pdinject

tools=(pdinject)
[ -n "$baseline" ] && tools+=(pdi-base)
perf61=$(command -v perf || true)
p612=/tmp/p612/usr/bin/perf
p612_lib=/tmp/p612/usr/lib/x86_64-linux-gnu
case $mode in
buildids)
    [ -n "$perf61" ] && tools+=(perf)
    [ -x "$p612" ] && tools+=(perf612)
    ;;
convert) tools+=(perf73) ;;
jit)
    [ -n "$perf61" ] && tools+=(perf)
    [ -x "$p73" ] && tools+=(perf73)
    ;;
esac
tools+=(cp)
inplace=${INPLACE:-0}
[ "$inplace" = 1 ] && tools+=(pdi-inplace pdi-mmap2-ip)
# perf script, the one long run (seconds), comes last in each round: right after it
# this VM runs the next short command 10-30 % slower (pdinject --in-place on the 116 MB
# dwarf-med: 33-44 ms as the first run after perf script, 30-33 ms as the next ones).
[ -n "$perf61" ] && [ "${SCRIPT:-0}" = 1 ] && tools+=(perf-script)

if [ -n "${TMPDIR_OUT:-}" ]; then
    out_dir=$TMPDIR_OUT
    mkdir -p "$out_dir"
else
    base=/dev/shm
    [ -d "$base" ] && [ -w "$base" ] || base=${TMPDIR:-/tmp}
    out_dir=$(mktemp -d "$base/pdinject-compare.XXXXXX")
    own_out=1
fi

version() {
    case $1 in
    pdinject) echo "pdinject ${job[*]} ($pdinject)" ;;
    perf73) echo "perf $("$p73" --version | awk '{print $3}') inject ${job[*]} ($p73)" ;;
    pdi-base) echo "$("$baseline" --version 2>/dev/null || echo "version unknown") ($baseline)" ;;
    perf) echo "perf $("$perf61" --version | awk '{print $3}')" ;;
    perf612) echo "perf $(LD_LIBRARY_PATH=$p612_lib "$p612" --version | awk '{print $3}')" ;;
    perf-script) echo "perf $("$perf61" --version | awk '{print $3}') script -F ip,dso" ;;
    cp) echo "$(cp --version | head -1)" ;;
    pdi-inplace) echo "pdinject --buildids --in-place (a reset copy in ${WORK:-the directory of the input})" ;;
    pdi-mmap2-ip) echo "pdinject --mmap2-buildid-all --in-place (a second reset copy)" ;;
    esac
}

# The in-place rows work on copies of the input beside it, one per mode, put back to
# the input's bytes before each run: the header and everything after the data section
# (all a --buildids run writes), the length, the mtime; a journal left by a failed run
# goes. The MMAP2 records an --mmap2-buildid-all run rewrote stay rewritten (putting
# back a multi-GB data section per run would dwarf the runs), so its later runs find
# them done; a --buildids run never sees them (its own copy).
copy=
copy2=
make_copy() {
    local f=$1
    copy=${WORK:-$(dirname "$f")}/.compare-inplace-$(basename "$f")
    copy2=${WORK:-$(dirname "$f")}/.compare-mmap2-$(basename "$f")
    cp --reflink=auto "$f" "$copy"
    cp --reflink=auto "$f" "$copy2"
    local off size
    read -r off size < <(od -An -t u8 -j 40 -N 16 "$f")
    copy_data_end=$((off + size))
    head -c 4096 "$f" >"$copy.head"
    tail -c +$((copy_data_end + 1)) "$f" >"$copy.tail"
    copy_len=$(stat -c %s "$f")
    copy_src=$f
    # Written back now, not by the kernel in the middle of the timed runs.
    sync "$copy" "$copy2"
}
# reset_copy COPY
reset_copy() {
    local c=$1
    truncate -s "$copy_len" "$c"
    dd if="$copy.head" of="$c" conv=notrunc status=none
    dd if="$copy.tail" of="$c" bs=1M seek="$copy_data_end" oflag=seek_bytes conv=notrunc status=none
    touch -r "$copy_src" "$c"
    rm -f "$(dirname "$c")/.$(basename "$c").pdinject-journal"
    # The copy's own writeback is not pdinject's cost.
    sync "$c"
}
drop_copy() {
    [ -n "$copy" ] && rm -f "$copy" "$copy.head" "$copy.tail" "$(dirname "$copy")/.$(basename "$copy").pdinject-journal"
    [ -n "$copy2" ] && rm -f "$copy2" "$(dirname "$copy2")/.$(basename "$copy2").pdinject-journal"
    copy=
    copy2=
}
# The copies, and the output directory when this script made it (the trap is set once,
# here: a second `trap ... EXIT` would replace the first).
trap 'drop_copy; [ -n "${own_out:-}" ] && rm -rf "$out_dir"' EXIT

# run TOOL IN OUT [rss]: one run, output to OUT; stderr to $out_dir/TOOL.err; its time
# to $out_dir/TOOL.t (benches/timed.py), or with `rss` its peak RSS (KB) to
# $out_dir/TOOL.rss (GNU time), untimed.
run() {
    # PYTHONCOERCECLOCALE=0: under the C locale python3 would otherwise set LC_CTYPE
    # in the environment the tool inherits.
    local tool=$1 in=$2 out=$3 w=(env PYTHONCOERCECLOCALE=0 python3 "$timed" "$out_dir/$tool.t" --)
    [ "${4:-}" = rss ] && w=("$gnu_time" -f %M -o "$out_dir/$tool.rss")
    case $tool in
    pdinject) "${w[@]}" "$pdinject" "${job[@]}" "$in" "$out" "${pdi_args[@]}" ;;
    pdi-base) "${w[@]}" "$baseline" "${job[@]}" "$in" "$out" "${pdi_args[@]}" ;;
    perf) "${w[@]}" "$perf61" inject "$(perf_job)" -i "$in" -o "$out" ;;
    perf73) "${w[@]}" "$p73" inject "${job[@]}" -i "$in" -o "$out" ;;
    perf612) "${w[@]}" env LD_LIBRARY_PATH="$p612_lib" "$p612" inject -b -i "$in" -o "$out" ;;
    perf-script) "${w[@]}" "$perf61" script -F ip,dso -i "$in" ;;
    cp) "${w[@]}" cp -r "$in" "$out" ;;
    pdi-inplace) "${w[@]}" "$pdinject" --buildids --in-place "$copy" "${pdi_args[@]}" ;;
    pdi-mmap2-ip) "${w[@]}" "$pdinject" --mmap2-buildid-all --in-place "$copy2" "${pdi_args[@]}" ;;
    esac >/dev/null 2>"$out_dir/$tool.err"
}

# perf_job: perf inject's flag for the job (-b is its --buildids).
perf_job() {
    case $mode in
    buildids) echo -b ;;
    *) echo "${job[0]}" ;;
    esac
}

# jit_files IN: the files in the jitdumps' directory (JITDIR, default IN's directory)
# whose names perf inject --jit gives its images, before they are cleared for the next
# tool's run.
jit_files() {
    find "${JITDIR:-$(dirname "$1")}" -maxdepth 1 -name 'jitted-*.so' | wc -l
}
clear_jit_files() {
    find "${JITDIR:-$(dirname "$1")}" -maxdepth 1 -name 'jitted-*.so' -delete
}

# peak_rss TOOL: the peak RSS in KB of TOOL's last rss run (GNU time's last line: it
# puts notes such as "Command exited with non-zero status" before the format's output).
peak_rss() {
    tail -n 1 "$out_dir/$1.rss" 2>/dev/null || echo "?"
}

# prepare TOOL IN OUT: what comes before a run, untimed: the in-place tools' copy
# reset, the last output and (MODE=jit) the last tool's images removed.
prepare() {
    local tool=$1 in=$2 out=$3
    case $tool in
    pdi-inplace) reset_copy "$copy" ;;
    pdi-mmap2-ip) reset_copy "$copy2" ;;
    esac
    rm -rf "$out" "$out_dir/$tool.t"
    if [ "$mode" = jit ]; then
        clear_jit_files "$in"
        # The deletion of the last tool's thousands of images is committed now, not
        # in the next timed run (ext4's journal made it wait on it: pdinject on
        # python 15 ms alone, 26 ms right after perf's 10,205 files were deleted).
        sync -f "${JITDIR:-$(dirname "$in")}"
    fi
}

# once TOOL IN OUT: one timed run's wall time in seconds, or "fail".
once() {
    local tool=$1 in=$2 out=$3 secs
    prepare "$tool" "$in" "$out"
    if ! run "$tool" "$in" "$out" || ! read -r secs <"$out_dir/$tool.t"; then
        echo fail
        return
    fi
    echo "$secs"
}

# rss_once TOOL IN OUT: the peak RSS (KB) of one more run, untimed, or "?".
rss_once() {
    local tool=$1 in=$2 out=$3
    prepare "$tool" "$in" "$out"
    if run "$tool" "$in" "$out" rss; then peak_rss "$tool"; else echo "?"; fi
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
    if [ "$mode" = convert ]; then
        list=$("$p73" buildid-list -i "$out" 2>/dev/null) || list=\?
    elif [ -x "$p612" ]; then
        list=$(LD_LIBRARY_PATH=$p612_lib "$p612" buildid-list -i "$out" 2>/dev/null) || list=\?
    else
        list=$("$perf61" buildid-list -i "$out" 2>/dev/null) || list=\?
    fi
    # Without a table, buildid-list lists hit DSOs with an empty ID: count IDs only.
    if [ "$list" = "?" ]; then echo "?"; else awk 'NF >= 2' <<<"$list" | grep -c . || true; fi
}

echo "compare.sh: best of $runs runs, outputs in $out_dir; cores: $(nproc)" >&2
for t in "${tools[@]}"; do echo "  $t = $(version "$t")" >&2; done
# row FILE SIZE TOOL SECONDS RATIO IDS [RSS]: one line of the table; the rss-KB column
# only with RSS=1, so the default output stays as it was.
row() {
    if [ "$rss" = 1 ]; then
        printf '%-22s %10s %-12s %9s %9s %8s %10s\n' "$@"
    else
        printf '%-22s %10s %-12s %9s %9s %8s\n' "${@:1:6}"
    fi
}
row file size tool seconds tool/pdi build-ids rss-KB
for f in "${files[@]}"; do
    name=$(basename "$f")
    size=$(du -h --apparent-size "$f" | cut -f1)
    pdi_t=
    declare -A took=() mem=() ids=() jit_left=()
    [ "$inplace" = 1 ] && make_copy "$f"
    # Rounds, each running every tool once: the VM's speed drifts within a minute, and
    # a tool whose runs all fell in one slow spell would be judged by it alone.
    for ((i = 0; i < runs; i++)); do
        for t in "${tools[@]}"; do
            [ "${took[$t]:-}" = fail ] && continue
            out="$out_dir/$name.$t.out"
            secs=$(once "$t" "$f" "$out")
            if [ "$secs" = fail ]; then
                took[$t]=fail
                rm -rf "$out"
                continue
            fi
            if [ -z "${took[$t]:-}" ] || awk -v t="$secs" -v b="${took[$t]}" 'BEGIN { exit !(t < b) }'; then
                took[$t]=$secs
            fi
            if ((i == runs - 1)); then
                case $t in
                pdi-inplace) ids[$t]=$(count_ids "$copy") ;;
                pdi-mmap2-ip) ids[$t]=$(count_ids "$copy2") ;;
                *) ids[$t]=$(count_ids "$out") ;;
                esac
                [ "$t" = pdi-mmap2-ip ] && mmap2_size=$(stat -c %s "$copy2")
                [ "$mode" = jit ] && jit_left[$t]=$(jit_files "$f")
            fi
            rm -rf "$out"
        done
    done
    # The peak RSS from one more run of each tool, after the timed rounds: a long
    # run (perf on a large file) right before a timed one slows it.
    if [ "$rss" = 1 ]; then
        for t in "${tools[@]}"; do
            [ "${took[$t]:-}" = fail ] && continue
            out="$out_dir/$name.$t.out"
            mem[$t]=$(rss_once "$t" "$f" "$out")
            rm -rf "$out"
        done
    fi
    for t in "${tools[@]}"; do
        secs=${took[$t]:-fail}
        [ "$secs" != fail ] && secs=$(awk -v b="$secs" 'BEGIN { printf "%.3f", b }') && took[$t]=$secs
        ratio=-
        if [ "$t" = pdinject ]; then
            pdi_t=$secs
        elif [ "$secs" != fail ] && [ -n "$pdi_t" ] && [ "$pdi_t" != fail ]; then
            ratio=$(awk -v a="$secs" -v b="$pdi_t" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "inf" }')
        fi
        row "$name" "$size" "$t" "$secs" "$ratio" "${ids[$t]:--}" "${mem[$t]:--}"
        if [ "$secs" = fail ]; then
            sed 's/^/    /' "$out_dir/$t.err" | tail -3
        fi
    done
    if [ "$mode" = jit ]; then
        for t in "${tools[@]}"; do
            echo "$name: $t left ${jit_left[$t]:-?} jitted-*.so files beside the jitdumps"
        done
        clear_jit_files "$f"
    fi
    [ "$inplace" = 1 ] && echo "$name: --mmap2-buildid-all --in-place: $copy_len -> ${mmap2_size:-?} bytes"
    if [ "$inplace" = 1 ]; then
        ip=${took[pdi-inplace]}
        for t in perf-script perf perf612; do
            [ -n "${took[$t]:-}" ] && [ "${took[$t]}" != fail ] && [ "$ip" != fail ] &&
                echo "$name: $t / pdi-inplace = $(awk -v a="${took[$t]}" -v b="$ip" 'BEGIN { printf "%.1fx", a / b }')"
        done
        drop_copy
    fi
    unset took mem ids jit_left
done
