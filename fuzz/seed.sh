#!/bin/bash
# Fills fuzz/corpus/<target>/ with small real inputs (< 300 KB): the crate's testdata,
# the external quipper corpus (../shared/testdata/quipper, read in place, copied only
# into the git-ignored fuzz corpus) and the recorded corpus in /tmp/pdinject-corpus.
# testdata/mutation/hostile-*.data carry the structures of issue 11 (fork chains,
# aliased sections, damaged tables, names longer than PATH_MAX).
# Run from anywhere: bash fuzz/seed.sh
set -euo pipefail
cd "$(dirname "$0")"
crate=..
max=$((300 * 1024))
sources=("$crate/testdata" "$crate/../shared/testdata/quipper" /tmp/pdinject-corpus)

perf_files() {
    for s in "${sources[@]}"; do
        [ -d "$s" ] || continue
        find "$s" -type f -size -${max}c -print0 | while IFS= read -r -d '' f; do
            # perf.data magic: PERFILE2 (LE), 2ELIFREP (BE), PERFFILE (v1).
            m=$(head -c 8 "$f" 2>/dev/null | tr -d '\0' || true)
            case "$m" in PERFILE2 | 2ELIFREP | PERFFILE) printf '%s\0' "$f" ;; esac
        done
    done
}

elf_files() {
    for s in "${sources[@]}"; do
        [ -d "$s" ] || continue
        find "$s" -type f -size -${max}c -print0 | while IFS= read -r -d '' f; do
            if [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
                printf '%s\0' "$f"
            fi
        done
    done
    # A few small host ELF files and the running kernel's notes.
    for f in /bin/true /usr/lib/x86_64-linux-gnu/libdl.so.2 /sys/kernel/notes; do
        if [ -r "$f" ]; then printf '%s\0' "$f"; fi
    done
}

copy_into() {
    local dst=corpus/$1
    mkdir -p "$dst"
    local n=0
    while IFS= read -r -d '' f; do
        # Name by content hash, like libFuzzer does, so reruns do not duplicate.
        h=$(sha1sum <"$f" | cut -c1-40)
        [ -s "$f" ] || continue
        cat "$f" >"$dst/$h"
        n=$((n + 1))
    done
    echo "seed.sh: $n files -> $dst" >&2
}

perf_files | copy_into parse
perf_files | copy_into rewrite
perf_files | copy_into stream
(elf_files; perf_files) | copy_into notes

# sample: 32 bytes of attr words (sample_type, read_format, branch_sample_type,
# regs mask) followed by a SAMPLE record, as the target reads them.
mkdir -p corpus/sample
seed_sample() { # name sample_type read_format bst regs record-words...
    local name=$1 && shift
    python3 - "$@" >"corpus/sample/$name" <<'PY'
import struct, sys
a = [int(x, 0) for x in sys.argv[1:]]
head, words = a[:4], a[4:]
rec = struct.pack('<IHH', 9, 2, 8 + 8 * len(words)) + b''.join(struct.pack('<Q', w) for w in words)
sys.stdout.buffer.write(b''.join(struct.pack('<Q', w) for w in head) + rec)
PY
}
if command -v python3 >/dev/null; then
    # IP|TID|TIME|CALLCHAIN|PERIOD (perf record -g).
    seed_sample fp 0x127 0 0 0 0x401000 0x0000000700000007 99 1 3 0xfffffffffffffe00 0x401000 0x401010
    # + BRANCH_STACK with hw_index.
    seed_sample br 0x927 0 0x20000 0 0x401000 0x0000000700000007 99 1 1 0xfffffffffffffe00 0x401000 1 0 0x401000 0x401010 0
    # IP|TID|TIME|PERIOD|READ(group,id)|CALLCHAIN|REGS_USER|STACK_USER (dwarf).
    seed_sample dwarf 0x3137 0x0c 0 0x3 0x401000 0x0000000700000007 99 1 2 10 1 20 2 1 0x401000 2 0x7ffc0000 0x401000 16 0 0 16
    echo "seed.sh: 3 synthetic files -> corpus/sample" >&2
fi

# jitdump: a small dump of each kind of record (header, two CODE_LOADs at one
# address, DEBUG_INFO, UNWINDING_INFO, CODE_MOVE, CLOSE), in both byte orders, and
# any small real dump a JIT left in /tmp.
mkdir -p corpus/jitdump
if command -v python3 >/dev/null; then
    for order in '<' '>'; do
        python3 - "$order" >"corpus/jitdump/synthetic-$([ "$order" = '<' ] && echo le || echo be)" <<'PY'
import struct, sys
o = sys.argv[1]
def rec(kind, ts, body):
    return struct.pack(o + 'IIQ', kind, 16 + len(body), ts) + body
def load(ts, name, code, index):
    return rec(0, ts, struct.pack(o + 'IIQQQQ', 7, 7, 0x7f0000001000, 0x7f0000001000, len(code), index) + name + b'\0' + code)
out = struct.pack(o + 'IIIIIIQQ', 0x4A695444, 1, 40, 62, 0, 7, 1, 0)
out += rec(2, 5, struct.pack(o + 'QQ', 0x7f0000001000, 2)
           + struct.pack(o + 'QII', 0x7f0000001000, 10, 0) + b'a.js\0'
           + struct.pack(o + 'QII', 0x7f0000001004, 11, 0) + b'\xff\0')
out += load(10, b'fnA', b'\x55\x48\x89\xe5\xc3', 0)
out += rec(4, 11, struct.pack(o + 'QQQ', 8, 0, 8) + b'\0' * 8)
out += rec(1, 12, struct.pack(o + 'IIQQQQQ', 7, 7, 0x7f0000001000, 0x7f0000001000, 0x7f0000002000, 5, 0))
out += load(20, b'fnB', b'\x90\xc3', 1)
out += rec(3, 30, b'')
sys.stdout.buffer.write(out)
PY
    done
fi
find /tmp -maxdepth 4 -name 'jit-*.dump' -size -${max}c -exec cp {} corpus/jitdump/ \; 2>/dev/null || true
echo "seed.sh: $(ls corpus/jitdump | wc -l) files -> corpus/jitdump" >&2
