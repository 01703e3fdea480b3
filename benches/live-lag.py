#!/usr/bin/env python3
"""How late perf record's MMAP2 records reach the reader of its pipe (issue 32).

Reads a pipe-format stream on stdin (record it with `-k CLOCK_MONOTONIC`, so a
record's time is this boot's monotonic clock), notes the monotonic time at which
each user MMAP2 record has arrived whole, and prints per-record lateness (arrival
minus the record's time) as: count, median, 90th percentile, max, in ms. With
--pass FILE it also copies the stream to FILE.

    perf record -k mono -B -g -o - -- WORKLOAD | benches/live-lag.py
"""
import os, struct, sys, time

def main():
    out = None
    if len(sys.argv) > 2 and sys.argv[1] == "--pass":
        out = open(sys.argv[2], "wb")
    fd = sys.stdin.fileno()
    buf = bytearray()
    head = None
    trailer = None  # (size, time offset) of the sample_id trailer
    lags = []
    pos = 0
    while True:
        chunk = os.read(fd, 1 << 20)
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if not chunk:
            break
        if out:
            out.write(chunk)
        buf += chunk
        if head is None:
            if len(buf) < 16:
                continue
            head = buf[:16]
            pos = 16
        while len(buf) - pos >= 8:
            typ, misc, size = struct.unpack_from("<IHH", buf, pos)
            if size < 8 or len(buf) - pos < size:
                break
            if typ == 64 and trailer is None:  # HEADER_ATTR
                sample_type = struct.unpack_from("<Q", buf, pos + 8 + 24)[0]
                flags = struct.unpack_from("<Q", buf, pos + 8 + 40)[0]
                if flags & (1 << 18):
                    off, t = 0, None
                    if sample_type & (1 << 1):  # TID
                        off += 8
                    if sample_type & (1 << 2):  # TIME
                        t = off
                        off += 8
                    for b in (6, 4, 7, 16):  # ID, STREAM_ID, CPU, IDENTIFIER
                        if sample_type & (1 << b):
                            off += 8
                    trailer = (off, t)
            elif typ == 10 and (misc & 7) == 2 and trailer and trailer[1] is not None:
                tsize, toff = trailer
                t = struct.unpack_from("<Q", buf, pos + size - tsize + toff)[0]
                if t:
                    lags.append((now - t) / 1e6)
            pos += size
            if typ == 71:  # AUXTRACE payload follows
                pos += struct.unpack_from("<Q", buf, pos - size + 8)[0]
        if pos > (8 << 20):
            del buf[:pos]
            pos = 0
    lags.sort()
    if not lags:
        print("0 records")
        return
    q = lambda p: lags[min(len(lags) - 1, int(p * (len(lags) - 1)))]
    print(f"{len(lags)} records: median {q(0.5):.1f} ms, p90 {q(0.9):.1f} ms, max {lags[-1]:.1f} ms")

main()
