#!/bin/bash
# What --symbol-store costs a batch, and what the store holds (docs/store.md).
#
#   bash benches/store.sh [CORPUS]
#
# CORPUS: a folder of perf.data files (default /tmp/pdinject-corpus; if it has none, a
# few small recordings of programs of this machine are made with perf in
# $WORK/corpus, as benches/batch.sh does). They are copied N times (default 1000) as
# hostNNNN/perf.data. Then, R rounds (default 5), one after the other:
#   plain   pdinject batch -b -N --force --out-dir OUT fleet
#   empty   the same with --symbol-store STORE, STORE emptied first (the first fill)
#   filled  the same again, STORE as the previous run left it (every ID present)
# and prints the median wall time of each and the ratios. -N (no build-ID cache) in
# all three, so the store's own cost is what differs. Then checks that the store
# holds each distinct file once: the bytes under STORE/.build-id equal the sum of the
# distinct files (each stored ID's source file, its debug file, the vdso image), and
# every stored file is byte for byte its source.
# Environment: N, R, WORK (default /tmp/pdinject-store-bench), PDINJECT, PERF.
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=${1:-/tmp/pdinject-corpus}
N=${N:-1000}
R=${R:-5}
WORK=${WORK:-/tmp/pdinject-store-bench}
PDINJECT=$(realpath "${PDINJECT:-target/release/pdinject}")
PERF=${PERF:-perf}
[ -x "$PDINJECT" ] || cargo build --release
mkdir -p "$WORK"
export HOME="$WORK/home"
mkdir -p "$HOME"

pick() {
  for f in "$1"/*; do
    [ -f "$f" ] || continue
    [ "$(stat -c %s "$f")" -le 4000000 ] || continue
    [ "$(head -c 8 "$f")" = PERFILE2 ] || continue
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
    (
      cd "$CORPUS"
      # -B: no build IDs at record time, as fleets record.
      $PERF record -q -B -g -o small-ls.data -- ls -R /usr/share/doc >/dev/null 2>&1
      $PERF record -q -B -g -F 1000 -o small-sh.data -- bash -c 'for i in $(seq 50); do gzip -c /etc/services >/dev/null; sort /etc/services >/dev/null; done'
      $PERF record -q -B -g -F 2000 -o small-py.data -- python3 -c 'sum(i*i for i in range(3000000))' >/dev/null 2>&1
      $PERF record -q -B -g -F 2000 -a -o med-sys.data -- sleep 0.5 >/dev/null 2>&1
    )
  fi
  mapfile -t SRC < <(pick "$CORPUS")
fi
echo "corpus: ${#SRC[@]} recordings from $CORPUS" >&2

FLEET="$WORK/fleet"
if [ ! -d "$FLEET" ] || [ "$(find "$FLEET" -name perf.data | wc -l)" -ne "$N" ]; then
  rm -rf "$FLEET"
  for i in $(seq 0 $((N - 1))); do
    d=$(printf '%s/host%04d' "$FLEET" "$i")
    mkdir -p "$d"
    cp "${SRC[$((i % ${#SRC[@]}))]}" "$d/perf.data"
  done
fi
STORE="$WORK/store"
OUT="$WORK/out"

run() { # name, extra args...
  local name=$1; shift
  /usr/bin/time -f "$name %e %U %S" -a -o "$WORK/times" \
    "$PDINJECT" batch -b -N -q --force --out-dir "$OUT" "$@" "$FLEET" || [ $? -eq 3 ]
}
rm -f "$WORK/times"
for r in $(seq "$R"); do
  run plain
  rm -rf "$STORE"
  run empty --symbol-store "$STORE"
  run filled --symbol-store "$STORE"
done
# Wall time, and CPU time (user + system), which a machine shared with other work
# disturbs less.
median() { grep "^$1 " "$WORK/times" | awk -v f="$2" '{print (f == "cpu") ? $3 + $4 : $2}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%d recordings, median of %d rounds (wall s, cpu s):\n' "$N" "$R"
for k in wall cpu; do
  P=$(median plain $k); E=$(median empty $k); F=$(median filled $k)
  printf '  %-4s without the store %.3f; store filled from empty %.3f (%.2fx); store already filled %.3f (%.2fx)\n' \
    "$k" "$P" "$E" "$(echo "$E / $P" | bc -l)" "$F" "$(echo "$F / $P" | bc -l)"
done

# What the store holds against the distinct files it was made from.
rm -rf "$STORE"
"$PDINJECT" batch -b -N -q --force --out-dir "$OUT" --symbol-store "$STORE" \
  --report "$WORK/report-size.jsonl" "$FLEET" || [ $? -eq 3 ]
python3 - "$STORE" "$WORK/report-size.jsonl" <<'PY'
import json, os, sys
store, report = sys.argv[1], sys.argv[2]
files = {}
for root, _, names in os.walk(os.path.join(store, ".build-id")):
    for n in names:
        p = os.path.join(root, n)
        files[os.path.relpath(p, os.path.join(store, ".build-id")).replace("/", "")] = p
sources = {}   # store name -> source path (None: made here, the vdso image)
added = {}
not_stored = {}
for line in open(report):
    v = json.loads(line)
    if "summary" in v:
        summary = v["summary"].get("store", {})
        continue
    for d in v.get("dsos", []):
        bid = d.get("build_id")
        if not bid or d.get("stored") is None:
            continue
        if d["stored"] == "not-stored":
            not_stored[(d["path"], bid)] = d.get("store_detail")
            continue
        sources[bid] = d["path"] if d["path"].startswith("/") else None
        if d["stored"] == "added":
            added[bid] = added.get(bid, 0) + 1
        det = d.get("store_detail") or ""
        if det.startswith("debug info from "):
            sources[bid + ".debug"] = det[len("debug info from "):].split(" (")[0]
total = sum(os.path.getsize(p) for p in files.values())
distinct = 0
for name, p in files.items():
    src = sources.get(name)
    if src is None:
        distinct += os.path.getsize(p)  # the vdso image, written from this process
        continue
    with open(src, "rb") as a, open(p, "rb") as b:
        assert a.read() == b.read(), f"{p} differs from {src}"
    distinct += os.path.getsize(src)
assert set(files) <= set(sources), set(files) - set(sources)
assert all(n == 1 for n in added.values()), added
print(f"store: {len(files)} files ({sum(1 for f in files if f.endswith('.debug'))} debug), "
      f"{total} bytes; distinct source files {distinct} bytes: {'equal' if total == distinct else 'DIFFERENT'}")
print(f"batch summary: {summary.get('added')} IDs added, {summary.get('bytes_added')} bytes, "
      f"{summary.get('present')} found present")
for (path, bid), why in sorted(not_stored.items()):
    print(f"not stored: {path} ({bid}): {why}")
PY
