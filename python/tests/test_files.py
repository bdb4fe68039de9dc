"""Atomic checkpoint files and finding the newest complete checkpoint
(railguard.files: no torch needed)."""

import os
import subprocess
import sys
import textwrap

import pytest

from railguard.files import checkpoint_path, complete_steps, resume_step, write_atomic

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(path, data):
    return write_atomic(path, lambda f: f.write(data))


def test_write_atomic_writes_replaces_and_creates_directories(tmp_path):
    p = checkpoint_path(str(tmp_path / "ck"), 10, 0)
    assert p == str(tmp_path / "ck" / "step-10" / "rank-0.pt")
    assert _write(p, b"one") == p
    assert open(p, "rb").read() == b"one"
    _write(p, b"two")
    assert open(p, "rb").read() == b"two"
    assert os.listdir(os.path.dirname(p)) == ["rank-0.pt"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = str(tmp_path / "state.pt")
    _write(p, b"old")

    def boom(f):
        f.write(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_atomic(p, boom)
    assert open(p, "rb").read() == b"old"
    assert os.listdir(tmp_path) == ["state.pt"]


def test_a_crash_between_write_and_rename_keeps_the_previous_checkpoint(tmp_path):
    d = str(tmp_path / "ck")
    for r in (0, 1):
        _write(checkpoint_path(d, 10, r), b"step 10 rank %d" % r)
    # A process dies after writing and fsyncing step 20's file, before the
    # rename (and one that dies after overwriting in place at step 10).
    child = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {PKG!r})
        from railguard.files import checkpoint_path, write_atomic
        os.replace = lambda a, b: os._exit(9)
        which = sys.argv[1]
        step = 20 if which == "new" else 10
        write_atomic(checkpoint_path({d!r}, step, 0), lambda f: f.write(b"torn"))
        """
    )
    for which in ("new", "overwrite"):
        r = subprocess.run([sys.executable, "-c", child, which], timeout=30)
        assert r.returncode == 9
    assert any(n.startswith(".rank-0.pt.tmp-") for n in os.listdir(os.path.join(d, "step-20")))
    # The leftover temporary file is not a checkpoint; step 10 is untouched.
    assert complete_steps(d, world_size=2) == [10]
    assert resume_step(d, world_size=2) == 10
    assert resume_step(d, rank=0) == 10
    assert open(checkpoint_path(d, 10, 0), "rb").read() == b"step 10 rank 0"


def test_complete_means_every_rank_has_its_file(tmp_path):
    d = str(tmp_path)
    assert resume_step(str(tmp_path / "missing"), world_size=2) == 0
    for step, ranks in ((5, (0, 1)), (10, (0, 1)), (15, (0,)), (20, (1,))):
        for r in ranks:
            _write(checkpoint_path(d, step, r), b"x")
    os.makedirs(os.path.join(d, "step-x"))
    os.makedirs(os.path.join(d, "step-007"))
    assert complete_steps(d, world_size=2) == [5, 10]
    assert resume_step(d, world_size=2) == 10
    assert resume_step(d, rank=0) == 15
    assert resume_step(d, rank=1) == 20
    with pytest.raises(ValueError):
        checkpoint_path(d, -1, 0)
