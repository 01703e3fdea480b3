#!/bin/bash
# Issue 32's scenarios under a live pipeline, and what perf's own tools make of them.
#
#   benches/live-scenarios.sh scenarios [PERF_RECORD_OPTS...]
#       (a) a deploy by rename (two processes on libdep.so v1, `mv` of v2 over it, two
#       on v2), (b) a binary deleted while it runs, (c) a process in its own mount
#       namespace (a private tmpfs holding its binary and library) that exits before
#       the recording ends, all in one `perf record -B -g -o - ... | tee ... |`
#       pipeline read live by pdinject (table form, and --mmap2-buildid-all), perf
#       6.1 `inject -b` and perf 7.3 `inject -b`, each with its own build-ID cache
#       (HOME). Then every binary is removed, and perf 6.1 and 7.3 `script` count,
#       per output and scenario, the samples symbolised (and, for the deploy, those
#       given the other build's function).
#   benches/live-scenarios.sh rate [PERF_RECORD_OPTS...]
#       (d) 200 processes living 50 ms to 2 s each (one started every 50 ms, each
#       mapping a library of its own): how late MMAP2 records arrive
#       (benches/live-lag.py, recorded with -k mono) and how many mappings pdinject
#       read while their process lived.
#   benches/live-scenarios.sh overhead
#       pdinject --live on against --live off on a saved stream replayed through a
#       pipe (every mapping record is offered: the reader's cost), and on a live
#       system-wide recording while (d) runs (both read one stream through tee).
#
# Env: PDI (pdinject; default target/release/pdinject), P61 (perf 6.1: perf), P73
# (perf 7.3: /tmp/p73/perf, from ../shared/tools/perf73.sh), REC (the recording
# perf: $P61; P73 to record with perf 7.3, whose MMAP2 records carry build IDs),
# W (work dir, /tmp/pdi-live), STREAM (overhead: a saved stream to replay). Run as
# root (perf record, unshare -m, map_files).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FIX=$HERE/../testdata/fixtures/live
PDI=${PDI:-$HERE/../target/release/pdinject}
P61=${P61:-perf}
P73=${P73:-/tmp/p73/perf}
REC=${REC:-$P61}
W=${W:-/tmp/pdi-live}
mode=${1:-scenarios}
shift || true
OPTS=("$@")

ID_PROG=11ee000000000000000000000000000000000001
ID_V1=11ee000000000000000000000000000000000a01
ID_V2=11ee000000000000000000000000000000000b02
ID_DEL=11ee000000000000000000000000000000000d01
ID_NSPROG=11ee000000000000000000000000000000000c01
ID_NSLIB=11ee000000000000000000000000000000000c02

cc() { gcc -O1 -fno-omit-frame-pointer "$@"; }

build() {
	rm -rf "$W/bin" "$W/ns"
	mkdir -p "$W/bin" "$W/ns"
	cc -Wl,--build-id=0x$ID_PROG -o "$W/bin/liveprog" "$FIX/liveprog.c" -ldl
	cc -Wl,--build-id=0x$ID_DEL -o "$W/bin/delprog" "$FIX/liveprog.c" -ldl
	cc -Wl,--build-id=0x$ID_NSPROG -o "$W/bin/nsprog" "$FIX/liveprog.c" -ldl
	cc -shared -fPIC -Wl,--build-id=0x$ID_V1 -o "$W/bin/libdep.so" "$FIX/livelib.c"
	cc -shared -fPIC -DV2 -Wl,--build-id=0x$ID_V2 -o "$W/bin/libdep-v2.so" "$FIX/livelib.c"
	cc -shared -fPIC -Wl,--build-id=0x$ID_NSLIB -o "$W/bin/nslib.so" "$FIX/livelib.c"
	# File times are compared with the mappings' times: nothing written just before.
	sleep 0.2
}

# The workload of (a), (b) and (c); each process writes "ready PID" to a file.
workload() {
	cat > "$W/workload.sh" <<EOF
#!/bin/sh
B=$W/bin
\$B/liveprog \$B/libdep.so 200 800 > $W/a-v1-1.pid &
\$B/liveprog \$B/libdep.so 200 800 > $W/a-v1-2.pid &
sleep 0.4
mv \$B/libdep-v2.so \$B/libdep.so
# a rename within a few ms of a mapping is taken as after it (docs/live.md)
sleep 0.1
\$B/liveprog \$B/libdep.so 200 800 > $W/a-v2-1.pid &
\$B/liveprog \$B/libdep.so 200 800 > $W/a-v2-2.pid &
\$B/delprog - 300 700 > $W/b.pid &
sleep 0.2
rm \$B/delprog
unshare -m --propagation private sh -c "mount -t tmpfs none $W/ns && cp \$B/nsprog \$B/nslib.so $W/ns/ && sleep 0.2 && exec $W/ns/nsprog $W/ns/nslib.so 200 300" > $W/c.pid
wait
# The recording goes on after (c) has exited.
sleep 1
EOF
	chmod +x "$W/workload.sh"
}

pid_of() { awk '{print $2}' "$W/$1.pid"; }

# count OUT HOME PERF: per scenario "symbolised/samples" (and for the deploy, the
# samples given the other build's function), from `perf script` of OUT: a sample's
# own IP is the first frame after its pid line; only samples in the workload's own
# files (its programs and libraries) are counted.
count() {
	local out=$1 home=$2 perf=$3
	HOME=$home "$perf" script -i "$out" -F pid,ip,sym,dso 2>/dev/null |
		awk -v v1="$(pid_of a-v1-1) $(pid_of a-v1-2)" -v v2="$(pid_of a-v2-1) $(pid_of a-v2-2)" \
			-v b="$(pid_of b)" -v c="$(pid_of c)" '
		BEGIN { n = split(v1, x, " "); for (i = 1; i <= n; i++) k[x[i]] = "a-v1"
			n = split(v2, x, " "); for (i = 1; i <= n; i++) k[x[i]] = "a-v2"
			k[b] = "b"; k[c] = "c" }
		/^ *[0-9]+ *$/ { s = k[$1]; first = 1; next }
		first && NF > 0 { first = 0
		  if (s == "") next
		  if ($0 !~ /(liveprog|delprog|nsprog|libdep|nslib)/) next
		  tot[s]++
		  if ($0 ~ /unknown/) unk[s]++
		  if (s == "a-v1" && $0 ~ /v2_spin/) wrong[s]++
		  if (s == "a-v2" && $0 ~ /v2_spin/) v2n[s]++ }
		END { printf "%d/%d", tot["a-v1"] - unk["a-v1"], tot["a-v1"]
		  if (wrong["a-v1"]) printf " (%d in v2_spin!)", wrong["a-v1"]
		  printf " | %d/%d (%d in v2_spin)", tot["a-v2"] - unk["a-v2"], tot["a-v2"], v2n["a-v2"]
		  printf " | %d/%d | %d/%d\n", tot["b"] - unk["b"], tot["b"], tot["c"] - unk["c"], tot["c"] }'
}

scenarios() {
	build
	workload
	local d=$W/run
	rm -rf "$d"
	mkdir -p "$d"/{h-pdi,h-pdim,h-61,h-73}
	mkfifo "$d/f61" "$d/f73" "$d/fm"
	HOME=$d/h-61 "$P61" inject -b -i - -o - < "$d/f61" > "$d/inj61.pdata" 2> "$d/inj61.err" &
	local p1=$!
	HOME=$d/h-73 "$P73" inject -b -i - -o - < "$d/f73" > "$d/inj73.pdata" 2> "$d/inj73.err" &
	local p2=$!
	HOME=$d/h-pdim "$PDI" --mmap2-buildid-all - "$d/pdim.data" --report "$d/pdim.json" < "$d/fm" 2> "$d/pdim.err" &
	local p3=$!
	"$REC" record -q -B -g "${OPTS[@]}" -o - -- "$W/workload.sh" 2> "$d/record.err" |
		tee "$d/stream.pdata" "$d/f61" "$d/f73" "$d/fm" |
		HOME=$d/h-pdi "$PDI" - "$d/pdi.data" --report "$d/pdi.json" 2> "$d/pdi.err"
	wait $p1 $p2 $p3 || true
	# Every binary is gone now (the namespace's tmpfs went with it).
	rm -rf "$W/bin"
	echo "recorded by $("$REC" version) ${OPTS[*]:-(default buffering)}"
	grep -h 'live capture' "$d/pdi.err" || true
	echo
	echo "| output | read by | a: v1 processes | a: v2 processes | b: deleted binary | c: own mount namespace |"
	echo "|---|---|---|---|---|---|"
	for o in pdi:pdi.data:h-pdi "pdi --mmap2-buildid-all:pdim.data:h-pdim" "perf 6.1 inject -b:inj61.pdata:h-61" "perf 7.3 inject -b:inj73.pdata:h-73"; do
		IFS=: read -r name file home <<< "$o"
		for r in "6.1:$P61" "7.3:$P73"; do
			IFS=: read -r rv rp <<< "$r"
			if [ -s "$d/$file" ]; then
				echo "| $name | perf $rv | $(count "$d/$file" "$d/$home" "$rp") |"
			else
				echo "| $name | perf $rv | (no output: $(tail -1 "$d/${file%.*}.err" 2>/dev/null)) |"
			fi
		done
	done
}

# (d): 200 processes living 50 ms to 2 s, one started every 50 ms, each dlopen()ing
# its own copy of the library.
rate_workload() {
	mkdir -p "$W/bin/rate"
	for i in $(seq 1 200); do cp "$W/bin/libdep.so" "$W/bin/rate/lib$i.so"; done
	sleep 0.2
	cat > "$W/rate.sh" <<EOF
#!/bin/bash
RANDOM=42
for i in \$(seq 1 200); do
	life=\$(( RANDOM % 1951 + 50 ))
	spin=\$(( life < 40 ? life / 2 : 20 ))
	$W/bin/liveprog $W/bin/rate/lib\$i.so \$spin \$(( life - spin )) > /dev/null &
	sleep 0.05
done
wait
EOF
	chmod +x "$W/rate.sh"
}

rate() {
	build
	rate_workload
	local d=$W/rate-run
	rm -rf "$d"
	mkdir -p "$d/home"
	"$REC" record -q -B -g -k mono "${OPTS[@]}" -o - -- "$W/rate.sh" 2> "$d/record.err" |
		tee >("$HERE/live-lag.py" > "$d/lag.txt") |
		HOME=$d/home "$PDI" - - --report "$d/pdi.json" 2> "$d/pdi.err" > /dev/null
	sleep 0.5
	python3 - "$d/pdi.json" "$d/lag.txt" "${OPTS[*]:-default}" <<'EOF'
import json, sys
rep = json.load(open(sys.argv[1]))
r = rep["live"]
lag = open(sys.argv[2]).read().strip()
libs = [d for d in rep["dsos"] if "/rate/lib" in d["path"]]
live = sum(1 for d in libs if d.get("source") == "live")
print(f"| {sys.argv[3]} | {lag} | {live}/{len(libs)} | {r['dropped']} |")
EOF
}

overhead() {
	build
	rate_workload
	local d=$W/overhead
	rm -rf "$d"
	mkdir -p "$d/h-on" "$d/h-off"
	local t="/usr/bin/time -f %e,%U,%S"
	if [ -n "${STREAM:-}" ]; then
		for i in 1 2 3; do
			for l in off on; do
				r=$( { cat "$STREAM" | HOME=$d/h-$l $t "$PDI" -q --live $l - - > /dev/null; } 2>&1 | tail -1)
				echo "replay $(basename "$STREAM") --live $l: wall,user,sys = $r"
			done
		done
	fi
	# A live system-wide recording while (d) runs: one stream, both pdinjects.
	mkfifo "$d/f"
	( HOME=$d/h-off $t -o "$d/off.time" "$PDI" -q --live off - - < "$d/f" > /dev/null ) &
	local p=$!
	"$P61" record -q -B -a -g -F 999 -o - -- "$W/rate.sh" 2> /dev/null |
		tee "$d/f" >(wc -c > "$d/bytes") |
		HOME=$d/h-on $t -o "$d/on.time" "$PDI" --live auto - - --report "$d/on.json" 2> "$d/on.err" > /dev/null
	wait $p || true
	sleep 0.5
	echo "system-wide (perf record -a -g -F 999 while (d) runs, $(($(cat "$d/bytes") >> 20)) MB piped) wall,user,sys: --live off $(cat "$d/off.time"), --live auto $(cat "$d/on.time")"
	grep -h 'live capture' "$d/on.err" || true
}

case $mode in
scenarios) scenarios ;;
rate) rate ;;
overhead) overhead ;;
*)
	echo "usage: $0 scenarios|rate|overhead [PERF_RECORD_OPTS...]" >&2
	exit 2
	;;
esac
