"""Checkpoint files without torch: atomic writes and the directory layout.

Layout (the same as the Rust ``ringtrain`` job's)::

    <dir>/step-<N>/rank-<R>.pt

one file per rank per checkpointed step. A checkpoint at step N is
*complete* when every rank's file for N exists; the supervisor learns it
from the ranks' ``checkpointed`` messages, and a run started without an
agent finds it with :func:`resume_step`.

:func:`write_atomic` is how every file here is written: into a temporary
file in the same directory, flushed and fsync'd, renamed over the target,
then the directory fsync'd (and its parent, when the directory is new). A
crash at any point leaves either the whole new file or the old state: never
a torn file under the real name. Temporary names start with a dot and never
match ``rank-<R>.pt``, so a leftover one is ignored (and may be deleted).
"""

from __future__ import annotations

import os
import re
import threading
from typing import Callable, IO, List, Optional

__all__ = ["checkpoint_path", "write_atomic", "fsync_dir", "complete_steps", "resume_step"]

_STEP_DIR = re.compile(r"^step-(0|[1-9][0-9]*)$")


def checkpoint_path(directory: str, step: int, rank: int) -> str:
    """``<directory>/step-<step>/rank-<rank>.pt``."""
    if step < 0 or rank < 0:
        raise ValueError(f"step {step} and rank {rank} must be >= 0")
    return os.path.join(os.fspath(directory), f"step-{step}", f"rank-{rank}.pt")


def fsync_dir(path: str) -> None:
    """Makes a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, write: Callable[[IO[bytes]], None]) -> str:
    """Writes a file so that a crash leaves the whole new file or none:
    ``write(f)`` fills a temporary file next to ``path``, which is then
    fsync'd and renamed over ``path``; the directory is fsync'd. Creates the
    directory if needed. Returns ``path``. On an error the temporary file
    is removed and the error raised; ``path`` is untouched."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        os.makedirs(d, exist_ok=True)
        fsync_dir(os.path.dirname(d))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)
    return path


def complete_steps(directory: str, world_size: Optional[int] = None, rank: int = 0) -> List[int]:
    """Steps with a checkpoint in ``directory``, oldest first: with
    ``world_size``, the steps every rank ``0..world_size-1`` has a file for
    (complete checkpoints); without it, the steps rank ``rank`` has one for.
    A missing directory has none."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    ranks = range(world_size) if world_size is not None else [rank]
    steps = []
    for name in names:
        m = _STEP_DIR.match(name)
        if not m:
            continue
        step = int(m.group(1))
        if all(os.path.isfile(checkpoint_path(directory, step, r)) for r in ranks):
            steps.append(step)
    return sorted(steps)


def resume_step(directory: str, world_size: Optional[int] = None, rank: int = 0) -> int:
    """The newest step of :func:`complete_steps` (0: none, start from
    scratch)."""
    steps = complete_steps(directory, world_size, rank)
    return steps[-1] if steps else 0
