#!/usr/bin/env python3
"""timed.py RESULT -- CMD...: runs CMD (stdin, stdout and stderr inherited) and
writes its wall-clock seconds to RESULT; exits with CMD's status.

The clock runs from just before the spawn to the child's end: the interpreter's own
start is not in it, nor a shell's, nor GNU time's extra fork and exec (together 2-3
ms, a fifth of a 14 ms run). The child's peak RSS is not taken here: a child of this
interpreter counts the interpreter's pages in it (compare.sh asks GNU time).
"""
import os
import signal
import sys
import time


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.stderr.write("usage: timed.py RESULT -- CMD...\n")
        return 2
    result, cmd = sys.argv[1], sys.argv[3:]
    start = time.monotonic()
    try:
        # posix_spawn: no copy of this interpreter's page tables, as a fork makes.
        # The signals Python ignores go back to their defaults, as from a shell.
        pid = os.posix_spawnp(
            cmd[0], cmd, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
        )
    except OSError as e:
        sys.stderr.write(f"timed.py: {cmd[0]}: {e}\n")
        return 126 if isinstance(e, PermissionError) else 127
    _, status = os.waitpid(pid, 0)
    secs = time.monotonic() - start
    with open(result, "w") as f:
        f.write(f"{secs:.6f}\n")
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = main()
    sys.exit(code if code >= 0 else 128 - code)
