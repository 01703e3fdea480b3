#!/usr/bin/env python3
"""The leak scan of issue 31 (`--aslr`): does any address of the recorded machine's
memory survive in a remapped perf.data?

    leak-scan.py [--json] [--unaligned] [--also FILE]... INPUT OUTPUT

From INPUT (a perf.data file or stream, `-z` or not) it collects every address the
recording names: mapping starts (MMAP, MMAP2, KSYMBOL), sample IPs, callchain entries
(context markers left out), branch-stack ends and sample ADDRs. `--also FILE` adds the
addresses of another recording of the same run (for a DWARF recording: the
`--convert-callchain` output, whose chains hold the unwound return addresses the input
only had in its stack dumps).

It then reads every record of OUTPUT (COMPRESSED records decompressed, by the `zstd`
command) and counts the 8-byte values equal to one of those addresses. A value that
also occurs in INPUT at a place that holds no address (a pid/tid word, a time, a
period, a counter, an id, a name's bytes, a flags word...) is a *coincidence*, not a
leak: it is counted apart (the input's feature sections, read at every byte offset,
are such places too). An input address equal to a mapping start of the output's
own layout (the new user layout from 0x200000 meets non-PIE executables at 0x400000)
is a *layout collision*, also counted apart. Stack and register dumps, raw tracepoint data and any
field the scan does not parse count as neither (their words are the recorded
machine's memory: an address there is an address).

Alignment: the kernel writes records whose size is a multiple of 8 and every field of
the sample and mapping layouts at a multiple of 8 from the record's start, so values
are read at 8-byte steps from each record's start. `--unaligned` also reads them at
every byte offset (a record of perf's own, HEADER_BUILD_ID of perf 6.1, is 100 bytes;
a name's bytes could hide one). The header's feature sections (after the data
section of a file) are read at every byte offset, and the whole output is searched
for the addresses written as hex text, and for any kernel address written as 16 hex
digits (perf's TRACING_DATA carries printk formats at their kernel addresses, and can
carry /proc/kallsyms: the KASLR slide, whether or not a sample named them).

Addresses below 0x1000 and the top page (callchain markers) are not counted: they
name no place.
"""

import argparse
import json
import re
import struct
import subprocess
import sys

PERFILE2 = b"PERFILE2"
ELIFREP2 = b"2ELIFREP"

# sample_type bits
IP, TID, TIME, ADDR, READ, CALLCHAIN, ID, CPU, PERIOD, STREAM_ID, RAW, BRANCH_STACK = (
    1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8, 1 << 9, 1 << 10, 1 << 11)
IDENTIFIER = 1 << 16
# read_format
RF_TE, RF_TR, RF_ID, RF_GROUP, RF_LOST = 1, 2, 4, 8, 16
BST_HW_INDEX = 1 << 17
# record types
MMAP, SAMPLE, MMAP2, KSYMBOL, TEXT_POKE, CALLCHAIN_DEFERRED = 1, 9, 10, 17, 20, 22
HEADER_ATTR, TRACING_DATA, AUXTRACE, AUXTRACE_ERROR, COMPRESSED, COMPRESSED2 = 64, 66, 71, 72, 81, 83

LOW, HIGH = 0x1000, (1 << 64) - 4096


def is_addr(v):
    return LOW <= v < HIGH


class Attr:
    def __init__(self, raw, e, ids):
        u64 = lambda off: struct.unpack_from(e + "Q", raw, off)[0] if off + 8 <= len(raw) else 0
        self.sample_type = u64(24)
        self.read_format = u64(32)
        self.flags = u64(40)
        self.branch_sample_type = u64(72)
        self.ids = ids


class Rec:
    """A perf.data file or stream: its byte order, attrs, records and feature bytes."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        b = self.buf
        if b[:8] == PERFILE2:
            self.e = "<"
        elif b[:8] == ELIFREP2:
            self.e = ">"
        else:
            sys.exit(f"{path}: not a perf.data file")
        e = self.e
        self.attrs = []
        size = struct.unpack_from(e + "Q", b, 8)[0]
        if size == 16:  # a stream
            self.data = (16, len(b))
            self.features = b""
        else:
            attr_size, a_off, a_size, d_off, d_size = struct.unpack_from(e + "QQQQQ", b, 16)
            for i in range(a_size // attr_size):
                at = a_off + i * attr_size
                raw = b[at:at + attr_size - 16]
                ids_off, ids_size = struct.unpack_from(e + "QQ", b, at + attr_size - 16)
                ids = list(struct.unpack_from(e + "%dQ" % (ids_size // 8), b, ids_off))
                self.attrs.append(Attr(raw, e, ids))
            self.data = (d_off, d_off + d_size)
            self.features = b[d_off + d_size:]

    def records(self):
        """(type, misc, bytes) of every record, COMPRESSED contents in place."""
        e, b = self.e, self.buf
        at, end = self.data
        zbuf = []
        while at + 8 <= end:
            kind, misc, size = struct.unpack_from(e + "IHH", b, at)
            if size < 8:
                raise SystemExit(f"bad record size {size} at {at}")
            rec = b[at:at + size]
            oob = 0
            if kind == TRACING_DATA:
                oob = struct.unpack_from(e + "I", rec, 8)[0]
            elif kind == AUXTRACE:
                oob = struct.unpack_from(e + "Q", rec, 8)[0]
            if kind == COMPRESSED:
                zbuf.append(rec[8:])
            elif kind == COMPRESSED2:
                n = struct.unpack_from(e + "Q", rec, 8)[0]
                zbuf.append(rec[16:16 + n])
            else:
                if kind == HEADER_ATTR:
                    asz = max(struct.unpack_from(e + "I", rec, 12)[0], 64)
                    ids = list(struct.unpack_from(e + "%dQ" % ((size - 8 - asz) // 8), rec, 8 + asz))
                    self.attrs.append(Attr(rec[8:8 + asz], e, ids))
                yield kind, misc, rec
            at += size + oob
        if zbuf:
            # perf writes one zstd stream across its COMPRESSED records, flushed at each
            # record and never ended: zstd decodes it all, then says the frame ends early.
            z = subprocess.run(["zstd", "-d", "-c", "-q"], input=b"".join(zbuf),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            inner = z.stdout
            if z.returncode != 0 and b"premature end" not in z.stderr:
                raise SystemExit(f"zstd: {z.stderr.decode(errors='replace').strip()}")
            at = 0
            while at + 8 <= len(inner):
                kind, misc, size = struct.unpack_from(e + "IHH", inner, at)
                if size < 8:
                    raise SystemExit(f"bad compressed record size {size}")
                yield kind, misc, inner[at:at + size]
                at += size

    def attr_of(self, rec):
        first = self.attrs[0]
        t = first.sample_type
        if t & IDENTIFIER:
            sid = struct.unpack_from(self.e + "Q", rec, 8)[0]
        elif t & ID:
            n = sum(1 for bit in (IP, TID, TIME, ADDR) if t & bit)
            sid = struct.unpack_from(self.e + "Q", rec, 8 + 8 * n)[0]
        else:
            return first
        for a in self.attrs:
            if sid in a.ids:
                return a
        return first


def classify(r, kind, rec, attr):
    """(addresses by category, word offsets that hold no address, offsets past which
    the record is not parsed) of one record."""
    e = r.e
    addrs = []  # (category, value)
    plain = set()
    n = len(rec) // 8
    q = lambda off: struct.unpack_from(e + "Q", rec, off)[0]
    if kind == SAMPLE:
        t = attr.sample_type
        at = 8
        plain.add(0)

        def field(cat):
            nonlocal at
            v = q(at)
            if cat:
                addrs.append((cat, v))
            else:
                plain.add(at)
            at += 8
            return v

        try:
            if t & IDENTIFIER: field(None)
            if t & IP: field("ip")
            if t & TID: field(None)
            if t & TIME: field(None)
            if t & ADDR: field("addr")
            for bit in (ID, STREAM_ID, CPU, PERIOD):
                if t & bit: field(None)
            if t & READ:
                rf = attr.read_format
                per = 1 + bool(rf & RF_ID) + bool(rf & RF_LOST)
                times = bool(rf & RF_TE) + bool(rf & RF_TR)
                cnt = field(None) * per + times if rf & RF_GROUP else per + times
                for _ in range(cnt): field(None)
            if t & CALLCHAIN:
                nr = field(None)
                for _ in range(nr):
                    v = q(at)
                    if v >= HIGH:
                        field(None)
                    else:
                        field("callchain")
            if t & RAW:
                return addrs, plain, at
            if t & BRANCH_STACK:
                nr = field(None)
                if attr.branch_sample_type & BST_HW_INDEX: field(None)
                for _ in range(nr):
                    field("branch"); field("branch"); field(None)
        except struct.error:
            pass
        return addrs, plain, at
    if kind in (MMAP, MMAP2):
        addrs.append(("map", q(16)))
        pg = q(32)
        for w in range(n):
            if w * 8 not in (16, 32):
                plain.add(w * 8)
        if is_addr(pg) and (misc_kernel(rec, e) or pg == q(16)):
            addrs.append(("map", pg))
        else:
            plain.add(32)
        return addrs, plain, len(rec)
    if kind in (KSYMBOL, TEXT_POKE, AUXTRACE_ERROR):
        off = {KSYMBOL: 8, TEXT_POKE: 8, AUXTRACE_ERROR: 32}[kind]
        addrs.append(("map" if kind == KSYMBOL else "other", q(off)))
        plain.update(w * 8 for w in range(n) if w * 8 != off)
        return addrs, plain, len(rec)
    if kind == CALLCHAIN_DEFERRED:
        nr = q(16)
        for i in range(nr):
            v = q(24 + 8 * i)
            if v < HIGH:
                addrs.append(("callchain", v))
        plain.update(w * 8 for w in range(n) if not (24 <= w * 8 < 24 + 8 * nr))
        return addrs, plain, len(rec)
    plain.update(w * 8 for w in range(n))
    return addrs, plain, len(rec)


def map_identities(r):
    """(pid, file name, start) of every MMAP and MMAP2 record."""
    ids = set()
    for kind, misc, rec in r.records():
        if kind in (MMAP, MMAP2) and len(rec) >= 40:
            pid, = struct.unpack_from(r.e + "I", rec, 8)
            start, = struct.unpack_from(r.e + "Q", rec, 16)
            name = rec[40 if kind == MMAP else 72:].split(b"\0", 1)[0]
            ids.add((pid, name, start))
    return ids


def misc_kernel(rec, e):
    misc = struct.unpack_from(e + "H", rec, 4)[0]
    return (misc & 7) in (1, 4)


def collect(path, into, plain_values):
    r = Rec(path)
    counts = {}
    for kind, misc, rec in r.records():
        attr = r.attr_of(rec) if kind == SAMPLE and r.attrs else None
        addrs, plain, _ = classify(r, kind, rec, attr)
        for cat, v in addrs:
            if is_addr(v):
                into.setdefault(v, cat)
                counts[cat] = counts.get(cat, 0) + 1
        for off in plain:
            if off + 8 <= len(rec):
                plain_values.add(struct.unpack_from(r.e + "Q", rec, off)[0])
    # The header's feature sections (counts, ids, names, topology) are places without
    # addresses too, read at every byte offset as the output's are.
    f = r.features
    for s in range(8):
        plain_values.update(v for (v,) in struct.iter_unpack(r.e + "Q", f[s:s + (len(f) - s) // 8 * 8]))
    return r, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--also", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--unaligned", action="store_true")
    a = ap.parse_args()

    addrs, plain = {}, set()
    _, in_counts = collect(a.input, addrs, plain)
    for extra in a.also:
        collect(extra, addrs, set())
    coincident = {v for v in addrs if v in plain}

    out = Rec(a.output)
    e = out.e
    # Mapping starts of the output's own layout: an input address equal to one is the
    # new layout landing where the old one had something (a non-PIE executable sits at
    # 0x400000, in the range of the new user layout), counted apart as a collision.
    # Not a collision: the output mapping of a pid and file at the very start the input
    # had it at (a mapping record copied as it is).
    in_maps = map_identities(Rec(a.input))
    out_starts = set()
    for ident in map_identities(out):
        if ident not in in_maps:
            out_starts.add(ident[2])
    collide = {v for v in out_starts if v in addrs and v not in coincident}
    coincident |= collide
    leaked = {}  # value -> occurrences
    coin = {}
    by_cat = {}
    records = words = 0
    unaligned_leaks = 0
    for kind, misc, rec in out.records():
        records += 1
        n = len(rec) // 8
        words += n
        for (v,) in struct.iter_unpack(e + "Q", rec[:n * 8]):
            if v in addrs:
                if v in coincident:
                    coin[v] = coin.get(v, 0) + 1
                else:
                    leaked[v] = leaked.get(v, 0) + 1
                    c = addrs[v]
                    by_cat[c] = by_cat.get(c, 0) + 1
        if a.unaligned:
            for s in range(1, 8):
                for (v,) in struct.iter_unpack(e + "Q", rec[s:s + (len(rec) - s) // 8 * 8]):
                    if v in addrs and v not in coincident:
                        unaligned_leaks += 1
    feat_leaks = 0
    f = out.features
    for s in range(8):
        for (v,) in struct.iter_unpack(e + "Q", f[s:s + (len(f) - s) // 8 * 8]):
            if v in addrs and v not in coincident:
                feat_leaks += 1
    hex_leaks = 0
    kernel_text = set()
    for m in re.finditer(rb"[0-9a-f]{12,16}", out.buf):
        v = int(m.group(0), 16)
        if v in addrs and v not in coincident:
            hex_leaks += 1
        # Kernel addresses written as text (TRACING_DATA's printk formats and, where
        # perf put it there, /proc/kallsyms) give the KASLR slide away whether or not
        # a sample named them. Counted: x86-64's kernel image and modules
        # (>= 0xffffffff80000000), far above perf's new kernel base 0xffff800010000000.
        if len(m.group(0)) == 16 and v >= 0xffffffff80000000:
            kernel_text.add(v)

    res = {
        "input": a.input,
        "output": a.output,
        "input_addresses": len(addrs),
        "input_address_fields": in_counts,
        "output_records": records,
        "output_words": words,
        "leaked_distinct": len(leaked),
        "leaked_occurrences": sum(leaked.values()),
        "leaked_by_category": by_cat,
        "layout_collisions_distinct": len(collide),
        "coincidences_distinct": len(coin),
        "coincidences_occurrences": sum(coin.values()),
        "feature_section_leaks": feat_leaks,
        "hex_text_leaks": hex_leaks,
        "kernel_addresses_as_text": len(kernel_text),
    }
    if a.unaligned:
        res["unaligned_leaks"] = unaligned_leaks
    res["coincidences_occurrences"] -= sum(coin.get(v, 0) for v in collide)
    res["layout_collisions_occurrences"] = sum(coin.get(v, 0) for v in collide)
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{a.output}: {res['leaked_distinct']} of {len(addrs)} input addresses leak "
              f"({res['leaked_occurrences']} times: {by_cat}); coincidences "
              f"{len(coin) - len(collide)} ({res['coincidences_occurrences']} times); "
              f"layout collisions {len(collide)} ({res['layout_collisions_occurrences']} times); feature sections {feat_leaks}; "
              f"hex text {hex_leaks}; kernel addresses as text {len(kernel_text)}" + (f"; unaligned {unaligned_leaks}" if a.unaligned else ""))


if __name__ == "__main__":
    main()
