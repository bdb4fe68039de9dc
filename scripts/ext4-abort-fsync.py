#!/usr/bin/env python3
"""Does `fsync` survive an ext4 error that aborts the journal? (root)

Why railguard's leader re-sends entries to a follower whose log went back
(see ARCHITECTURE.md, raft-store). Each round: a thread appends to a file on
a small ext4 filesystem (loop device, `errors=remount-ro`), each write
followed by `fsync`, and notes the file's size after each `fsync` returns;
meanwhile ext4's error path is triggered (`trigger_fs_error`: the journal
aborts and the mount turns read-only). Then unmount, `e2fsck -fy` (or only
the kernel's own journal replay with --no-fsck), mount, and compare the
size with the last one `fsync` reported done.

On Linux 6.18 with e2fsprogs 1.47.0, 8 rounds in 100 lost the last append
whose `fsync` had returned 0 (defaults), and 13 in 100 with `--fdatasync
--no-fsck`. No sled, no railguard code.

Usage: scripts/ext4-abort-fsync.py [--rounds N] [--fdatasync] [--no-fsck]
The last line is one JSON object: rounds, losses, largest loss in bytes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def appender(fd, sync, acked):
    """Appends and syncs until a call fails; acked[0]: size after the last
    sync that returned."""
    for i in range(10_000_000):
        try:
            os.write(fd, b"x" * (100 + (i * 7919) % 1000))
            sync(fd)
            acked[0] = os.fstat(fd).st_size
        except OSError:
            return


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--fdatasync", action="store_true", help="fdatasync instead of fsync")
    ap.add_argument("--no-fsck", action="store_true", help="mount again without e2fsck")
    a = ap.parse_args()
    if not 1 <= a.rounds <= 10_000:
        sys.exit("--rounds takes 1..=10000")
    if os.geteuid() != 0:
        sys.exit("needs root (loop device, mount)")
    sync = os.fdatasync if a.fdatasync else os.fsync
    work = tempfile.mkdtemp(prefix="railguard-ext4-")
    img, mnt = os.path.join(work, "img"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    run("mkfs.ext4", "-q", "-F", "-m", "0", img)
    dev = run("losetup", "-f", "--show", img)
    knob = f"/sys/fs/ext4/{os.path.basename(dev)}/trigger_fs_error"
    losses, worst = 0, 0
    try:
        run("mount", "-t", "ext4", "-o", "errors=remount-ro", dev, mnt)
        path = os.path.join(mnt, "log")
        for rnd in range(a.rounds):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            acked = [os.fstat(fd).st_size]
            t = threading.Thread(target=appender, args=(fd, sync, acked))
            t.start()
            time.sleep(0.05 + 0.013 * (rnd % 7))
            with open(knob, "w") as k:
                k.write("1")
            t.join()
            os.close(fd)
            run("umount", mnt)
            if not a.no_fsck:
                # 1 and 2: errors corrected (the error the knob recorded).
                r = subprocess.run(["e2fsck", "-fy", dev], capture_output=True, text=True)
                if r.returncode not in (0, 1, 2):
                    sys.exit(f"e2fsck {dev}: status {r.returncode}: {r.stdout}")
            run("mount", "-t", "ext4", "-o", "errors=remount-ro", dev, mnt)
            after = os.stat(path).st_size
            if after < acked[0]:
                losses += 1
                worst = max(worst, acked[0] - after)
                print(f"round {rnd}: size after the last fsync {acked[0]}, after the repair {after}")
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)
        subprocess.run(["rm", "-rf", work])
    print(json.dumps({"rounds": a.rounds, "losses": losses, "max_lost_bytes": worst,
                      "sync": "fdatasync" if a.fdatasync else "fsync", "fsck": not a.no_fsck}))


if __name__ == "__main__":
    main()
