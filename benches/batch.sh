#!/bin/bash
# Batch mode side by side with loops of single-file runs (docs/batch.md).
#
#   bash benches/batch.sh [CORPUS]
#
# CORPUS: a folder of perf.data files to copy (default /tmp/pdinject-corpus, from
# ../shared/tools/record-corpus.sh; if it has none, a few small recordings are made
# with perf in $WORK/corpus). Files over MAXSIZE bytes (default 4 MB) are left out,
# so 1,000 copies stay small. Environment: N (copies, default 1000), PERF_N (files the
# perf inject loop runs over, default 200, scaled to N), WORK (default
# /tmp/pdinject-batch-bench), PDINJECT (default target/release/pdinject), PERF.
#
# Measures, over N copies named host0000/perf.data ... with one damaged among them:
#   batch (default), batch with each file's stages on every thread instead of files
#   side by side, a rerun over finished outputs, a shell loop of single-file pdinject
#   runs, a loop of `perf inject -b` over PERF_N files; checks the damaged file gets
#   one error line and exit code 3, that batch outputs equal the loop's byte for byte,
#   and that shards 1/4..4/4 produce each output exactly once.
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=${1:-/tmp/pdinject-corpus}
N=${N:-1000}
PERF_N=${PERF_N:-200}
MAXSIZE=${MAXSIZE:-4000000}
WORK=${WORK:-/tmp/pdinject-batch-bench}
PDINJECT=$(realpath "${PDINJECT:-target/release/pdinject}")
PERF=${PERF:-perf}
[ -x "$PDINJECT" ] || cargo build --release
mkdir -p "$WORK"
# perf inject and pdinject get a HOME of their own: no ~/.debug of the user's.
export HOME="$WORK/home"
mkdir -p "$HOME"

now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc -l | xargs printf '%.3f'; }

# Source recordings: regular perf.data files (not pipe format) up to MAXSIZE.
pick() {
  for f in "$1"/*; do
    [ -f "$f" ] || continue
    [ "$(stat -c %s "$f")" -le "$MAXSIZE" ] || continue
    [ "$(head -c 8 "$f")" = PERFILE2 ] || continue
    # Pipe-format files start with the same magic but a 16-byte header size.
    [ "$(od -An -tu8 -j8 -N8 "$f" | tr -d ' ')" = 104 ] || continue
    echo "$f"
  done
}
mapfile -t SRC < <(pick "$CORPUS" 2>/dev/null || true)
if [ ${#SRC[@]} -eq 0 ]; then
  CORPUS="$WORK/corpus"
  mkdir -p "$CORPUS"
  if [ -z "$(pick "$CORPUS")" ]; then
    echo "recording a small corpus in $CORPUS" >&2
    cat > "$CORPUS/w.c" <<'C'
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
int main(int c, char **v) {
  double s = 0; int n = c > 1 ? atoi(v[1]) : 2000000;
  for (int i = 0; i < n; i++) {
    s += sin(i);
    if (i % 1000 == 0) { char *b = malloc(4096); memset(b, i, 4096); s += b[7]; free(b); }
  }
  printf("%f\n", s);
}
C
    gcc -O2 -o "$CORPUS/w" "$CORPUS/w.c" -lm
    (
      cd "$CORPUS"
      # -B: no build IDs at record time, as fleets record.
      $PERF record -q -B -g -o small-ls.data -- ls -R /usr/share/doc >/dev/null 2>&1
      $PERF record -q -B -g -F 2000 -o small-w.data -- ./w 3000000 >/dev/null 2>&1
      $PERF record -q -B -g -F 1000 -o small-sh.data -- bash -c 'for i in $(seq 50); do gzip -c /etc/services >/dev/null; sort /etc/services >/dev/null; done'
      $PERF record -q -B --call-graph dwarf -F 500 -o dwarf-w.data -- ./w 2000000 >/dev/null 2>&1
      $PERF record -q -B -g -F 4000 -o med-w.data -- ./w 40000000 >/dev/null 2>&1
      $PERF record -q -B -g -F 2000 -a -o med-sys.data -- sleep 0.5 >/dev/null 2>&1
      $PERF record -q -B -g -F 4000 -o med-fp2.data -- ./w 150000000 >/dev/null 2>&1
      $PERF record -q -B --call-graph dwarf,4096 -F 400 -o med-dwarf.data -- ./w 80000000 >/dev/null 2>&1
    )
  fi
  mapfile -t SRC < <(pick "$CORPUS")
fi
echo "corpus: ${#SRC[@]} recordings from $CORPUS: $(for f in "${SRC[@]}"; do printf '%s (%s) ' "$(basename "$f")" "$(stat -c %s "$f")"; done)"

FLEET="$WORK/fleet"
rm -rf "$FLEET" "$WORK"/out-*
mkdir -p "$FLEET"
BAD=$(printf 'host%04d/perf.data' $((N / 2)))
for i in $(seq 0 $((N - 1))); do
  d=$(printf '%s/host%04d' "$FLEET" "$i")
  mkdir -p "$d"
  cp --reflink=auto "${SRC[$((i % ${#SRC[@]}))]}" "$d/perf.data"
done
# One damaged recording: cut in the middle of its data section.
head -c $(($(stat -c %s "$FLEET/$BAD") / 2)) "$FLEET/$BAD" > "$WORK/bad.tmp"
mv "$WORK/bad.tmp" "$FLEET/$BAD"
echo "fleet: $N recordings, $(du -sh "$FLEET" | cut -f1), damaged: $BAD"
sync

# 1. batch (files side by side, one thread each)
t0=$(now)
set +e
"$PDINJECT" batch --buildids --out-dir "$WORK/out-batch" --report "$WORK/batch.jsonl" "$FLEET" 2> "$WORK/batch.err"
rc=$?
set -e
t1=$(now)
T_FIRST=$(secs "$t0" "$t1")
echo "first batch (cold): $T_FIRST s, exit $rc"
cat "$WORK/batch.err"
ERRS=$(grep -c -v ' inputs' "$WORK/batch.err" || true)
[ "$rc" = 3 ] || { echo "FAIL: exit code $rc, expected 3 (some failed)"; exit 1; }
[ "$ERRS" = 1 ] && grep -q "$FLEET/$BAD" "$WORK/batch.err" || { echo "FAIL: expected one error line naming $BAD"; exit 1; }
OK=$(grep -c '"status":"ok"' "$WORK/batch.jsonl")
[ "$OK" = $((N - 1)) ] || { echo "FAIL: $OK done, expected $((N - 1))"; exit 1; }

# 2. timed runs, alternating so that both strategies see the same machine state
#    (the machine is shared; each figure is the median of RUNS): files side by side
#    with one thread each (the default) against files one at a time with each
#    file's stages on every thread; then a rerun over the finished outputs.
RUNS=${RUNS:-3}
timed() { # OUT ARGS...: seconds of one batch into a fresh OUT
  local out=$1; shift
  rm -rf "$out"; sync
  local t0; t0=$(now)
  "$PDINJECT" batch --buildids -q "$@" --out-dir "$out" "$FLEET" 2>/dev/null || true
  secs "$t0" "$(now)"
}
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
A=(); B=(); R=()
for r in $(seq "$RUNS"); do
  A+=("$(timed "$WORK/out-batch")")
  t0=$(now)
  "$PDINJECT" batch --buildids -q --out-dir "$WORK/out-batch" "$FLEET" 2>/dev/null || true
  R+=("$(secs "$t0" "$(now)")")
  B+=("$(timed "$WORK/out-seq" --concurrent-below 0)")
done
T_BATCH=$(median "${A[@]}"); T_SEQ=$(median "${B[@]}"); T_RERUN=$(median "${R[@]}")
echo "batch: ${A[*]} s; files one at a time: ${B[*]} s; rerun: ${R[*]} s"

# 4. shell loop of single-file runs
t0=$(now)
for d in "$FLEET"/host*; do
  h=$(basename "$d")
  mkdir -p "$WORK/out-loop/$h"
  "$PDINJECT" --buildids -q "$d/perf.data" "$WORK/out-loop/$h/perf.data" 2>/dev/null || true
done
t1=$(now)
T_LOOP=$(secs "$t0" "$t1")
echo "pdinject loop: $T_LOOP s"
DIFF=0
for d in "$WORK"/out-loop/host*; do
  h=$(basename "$d")
  [ -f "$d/perf.data" ] || continue
  cmp -s "$d/perf.data" "$WORK/out-batch/$h/perf.data" || { echo "differs: $h"; DIFF=$((DIFF + 1)); }
done
echo "batch outputs differing from the loop's: $DIFF"

# 5. loop of perf inject -b over PERF_N files, scaled to N
mkdir -p "$WORK/out-perf"
t0=$(now)
for d in $(ls -d "$FLEET"/host* | head -n "$PERF_N"); do
  $PERF inject -b -i "$d/perf.data" -o "$WORK/out-perf/$(basename "$d").data" 2>/dev/null || true
done
t1=$(now)
T_PERF=$(secs "$t0" "$t1")
T_PERF_N=$(echo "$T_PERF * $N / $PERF_N" | bc -l | xargs printf '%.1f')
echo "perf inject loop: $T_PERF s over $PERF_N files (x$N/$PERF_N = $T_PERF_N s)"

# 6. shards 1/4..4/4: every output exactly once
for k in 1 2 3 4; do
  "$PDINJECT" batch --buildids -q --shard "$k/4" --out-dir "$WORK/out-shard" --report "$WORK/shard$k.jsonl" "$FLEET" 2>/dev/null || true
done
SHARD_OK=$(cat "$WORK"/shard?.jsonl | grep -c '"status":"ok"' || true)
SHARD_DISTINCT=$(cat "$WORK"/shard?.jsonl | grep -o '"input":"[^"]*"' | sort -u | wc -l)
SHARD_FILES=$(find "$WORK/out-shard" -path "$WORK/out-shard/.pdinject" -prune -o -type f -name perf.data -print | wc -l)
PER_SHARD=$(for k in 1 2 3 4; do grep -c '"status"' "$WORK/shard$k.jsonl"; done | xargs)
echo "shards: inputs per shard $PER_SHARD; $SHARD_DISTINCT distinct inputs reported, $SHARD_OK done, $SHARD_FILES outputs"

echo
echo "== $N recordings (one damaged), $(nproc) cores; medians of $RUNS runs"
printf '%-44s %8s s\n' "pdinject batch, first run (cold cache)" "$T_FIRST"
printf '%-44s %8s s\n' "pdinject batch" "$T_BATCH"
printf '%-44s %8s s\n' "pdinject batch, files one at a time" "$T_SEQ"
printf '%-44s %8s s  (%.1f%% of batch)\n' "rerun over finished outputs" "$T_RERUN" "$(echo "100 * $T_RERUN / $T_BATCH" | bc -l)"
printf '%-44s %8s s  (batch %.1fx faster)\n' "shell loop of single-file pdinject" "$T_LOOP" "$(echo "$T_LOOP / $T_BATCH" | bc -l)"
printf '%-44s %8s s  (batch %.0fx faster; %s s measured on %s)\n' "loop of perf inject -b (scaled)" "$T_PERF_N" "$(echo "$T_PERF_N / $T_BATCH" | bc -l)" "$T_PERF" "$PERF_N"
yes() { [ "$(echo "$1" | bc -l)" = 1 ] && echo yes || echo NO; }
echo "targets: batch >= 3x the pdinject loop: $(yes "$T_LOOP >= 3 * $T_BATCH");" \
  "batch >= 50x the perf inject loop: $(yes "$T_PERF_N >= 50 * $T_BATCH");" \
  "rerun < 1/10 of batch: $(yes "10 * $T_RERUN < $T_BATCH");" \
  "shards each output once: $([ "$SHARD_DISTINCT" = "$N" ] && [ "$SHARD_OK" = $((N - 1)) ] && [ "$SHARD_FILES" = $((N - 1)) ] && echo yes || echo NO);" \
  "damaged file: one error line, exit 3: yes"
