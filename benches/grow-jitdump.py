#!/usr/bin/env python3
"""grow-jitdump.py SRC DST PER: DST is jitdump SRC with PER extra code loads after each
of its records, at the record's time, 16 bytes each at addresses no sample touches
(from 0x7e0000000000 up). It measures --jit on a dump far larger than a recording
gives, with the same samples: bind-mount DST's directory over SRC's (unshare -m) so
the recording's marker finds it, then compare perf script -F ip,sym,dso with the
real dump's output (docs/jit.md, "Records for the loads samples touch")."""
import struct
import sys

src, dst, per = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = open(src, "rb").read()
magic, _version, hsize, _mach, _pad, pid = struct.unpack_from("<IIIIII", d, 0)
if magic != 0x4A695444:
    sys.exit(f"{src}: not a little-endian jitdump")
out = open(dst, "wb", buffering=1 << 22)
out.write(d[:hsize])
off, n, addr = hsize, 0, 0x7E0000000000
code = b"\x90" * 15 + b"\xc3"
name = b"s\0"
size = 16 + 40 + len(name) + len(code)
while off + 16 <= len(d):
    rid, sz, ts = struct.unpack_from("<IIQ", d, off)
    if sz < 16 or off + sz > len(d):
        break
    out.write(d[off : off + sz])
    off += sz
    loads = []
    for _ in range(per):
        # JIT_CODE_LOAD: pid, tid, vma, code_addr, code_size, code_index, name, code
        loads.append(struct.pack("<IIQIIQQQQ", 0, size, ts, pid, pid, addr, addr, 16, 1 << 40 | n) + name + code)
        addr += 16
        n += 1
    out.write(b"".join(loads))
out.close()
print(f"{dst}: {n} code loads added")
