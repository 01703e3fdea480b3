#!/usr/bin/env python3
"""Endless hostile perf streams (pipe format, little-endian) on stdout, for measuring
what pdinject keeps of a stream (README, "Limits": --stream-memory). Each runs until
its reader stops or LIMIT bytes are written (0, the default: endless).

  hostile-streams.py MODE [LIMIT]

MODE:
  buildid    HEADER_BUILD_ID records, each of a new 60 KB name
  mmap2      MMAP2 records of new 256-byte paths at new addresses in 1,000 pids,
             a FINISHED_ROUND after every 256
  mmap2pad   mmap2 with 4 MB of other records after each round: the model grows
             slowly, over many batches
  events     MMAP2 records of 50 paths at new addresses (the model grows by its
             events, not names), 64 KB of other records after each round
  oneround   events with one FINISHED_ROUND only: what follows waits for a second

e.g. peak RSS over 20 s:
  timeout 20 python3 benches/hostile-streams.py buildid \\
    | /usr/bin/time -v pdinject -N - out.data
"""
import struct
import sys


def rec(kind, misc, body):
    return struct.pack('<IHH', kind, misc, 8 + len(body)) + body


def pad8(b):
    return b + b'\0' * (-len(b) % 8)


def head():
    attr = bytearray(128)
    struct.pack_into('<II', attr, 0, 1, 128)  # PERF_TYPE_SOFTWARE, size
    struct.pack_into('<Q', attr, 16, 4000)  # sample_period
    struct.pack_into('<Q', attr, 24, 0x1 | 0x2 | 0x4 | 0x100)  # IP TID TIME PERIOD
    struct.pack_into('<Q', attr, 40, (1 << 18) | (1 << 5) | (1 << 6))  # sample_id_all
    return b'PERFILE2' + struct.pack('<Q', 16) + rec(64, 0, bytes(attr))


def name(n, size):
    s = b'/usr/lib/hostile-%d/' % n
    return s + b'x' * max(0, size - len(s) - 3) + b'.so'


def buildid(n):
    body = struct.pack('<iI', -1, n & 0xffffffff) + b'\x5a' * 16 + bytes([20, 0, 0, 0])
    return rec(67, 2 | 0x8000, body + pad8(name(n, 60 * 1024) + b'\0'))


NAMES = {}


def mmap2(n, libs):
    pid = 1000 + n % 1000
    start = 0x10000000 + n * 0x10000
    ino = n % libs if libs else n
    body = struct.pack('<IIQQQIIQQII', pid, pid, start, 0x1000, 0, 8, 1, ino, 0, 5, 2)
    if ino not in NAMES:
        NAMES[ino] = pad8(name(ino, 256) + b'\0')
    body += NAMES[ino] if libs else NAMES.pop(ino)
    body += struct.pack('<IIQ', pid, pid, 1000 + n)  # sample-id trailer: TID, TIME
    return rec(10, 2, body)


def filler(total):
    """Records of an unknown user type (passed on, never kept), `total` bytes."""
    one = rec(99, 0, bytes(65520))
    return one * (total // len(one))


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ''
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if mode not in ('buildid', 'mmap2', 'mmap2pad', 'events', 'oneround'):
        sys.exit(__doc__)
    libs = 50 if mode in ('events', 'oneround') else 0
    pad = {'mmap2pad': filler(4 << 20), 'events': filler(64 << 10),
           'oneround': filler(64 << 10)}.get(mode, b'')
    rnd = rec(68, 0, b'')
    out = sys.stdout.buffer
    written = 0
    n = 0
    try:
        h = head()
        out.write(h)
        written += len(h)
        while limit == 0 or written < limit:
            if mode == 'buildid':
                chunk = [buildid(n + i) for i in range(256)]
            else:
                chunk = [mmap2(n + i, libs) for i in range(256)]
                if mode != 'oneround' or n == 0:
                    chunk.append(rnd)
                chunk.append(pad)
            n += 256
            b = b''.join(chunk)
            out.write(b)
            written += len(b)
    except BrokenPipeError:
        pass


main()
