"""Helpers for a PyTorch (DistributedDataParallel) training loop under
railguard: checkpoint orders turned into decisions every rank agrees on,
atomic checkpoint files, and finding where to resume.

Why agreement is needed
-----------------------
When the supervisor wants a checkpoint (before draining a host, say) each
rank's agent sends that rank its own ``checkpoint {step: null, halt}``
order, and the orders arrive at slightly different times. A checkpoint is
only a restart point if every rank wrote it *at the same step*, so after
every step :meth:`Coordinator.end_step` all-reduces (MAX) three flags
across the process group: "an order of mine is due" (checkpoint), "... and
it halts" (halt), "I was told to stop" (stop). A rank whose own order has
not arrived yet checkpoints anyway because a peer raised the flag; when its
order turns up it is answered at once with that step (the Rust ``ringtrain``
job does the same). The cost is one tiny all-reduce per step.

The loop::

    coord = Coordinator(client, total_steps=steps, checkpoint_every=every)
    for step in range(start, steps):
        train_one_step(step)
        n = step + 1
        coord.end_step(n)                  # polls orders, agrees the flags
        if coord.should_checkpoint():
            save_atomic(state, checkpoint_path(ckpt_dir, n, rank))
            coord.checkpoint_saved(n)      # `checkpointed`, answers orders
        if coord.should_halt():            # compute nothing more
            coord.wait_halted()            # until a stop order (or signal)
            sys.exit(143)
        if coord.should_stop():
            sys.exit(143)
    coord.finish()

Every order is answered: checkpoint orders with the step written (the
``order_done`` carries it in ``step``), orders that cannot be carried out
(no checkpoint directory, a step past the end, the job finished or halted
before it) with ``ok: false`` and a reason, ``stop`` with ``ok: true``
before the job stops, and ``migrate``/``pace`` (which a PyTorch job,
registering no connections, should never get) with ``ok: false``.

Without an agent (``client`` None or a :class:`railguard.NullClient`) no
order arrives: only periodic checkpoints happen, and the loop runs as under
plain ``torchrun``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Optional, Tuple

import torch
import torch.distributed as dist

from .client import NullClient
from .contract import Checkpoint, ContractError, Order, Stop
from .files import checkpoint_path, complete_steps, fsync_dir, write_atomic
from .files import resume_step as _resume_step

__all__ = [
    "Coordinator",
    "save_atomic",
    "load_atomic",
    "checkpoint_path",
    "complete_steps",
    "resume_step",
    "agree_resume_step",
    "load_latest",
    "fsync_dir",
]

log = logging.getLogger("railguard.torch")

#: A checkpoint a peer's order triggered stays claimable by this rank's own
#: order this long (seconds; the supervisor fails an order after 30 s).
CLAIM_WINDOW = 30.0
#: Most unclaimed checkpoints remembered.
MAX_UNCLAIMED = 16
#: Most checkpoint orders waiting for their step.
MAX_PENDING_ORDERS = 64

_CKPT, _HALT, _STOP = 0, 1, 2


# --- files ------------------------------------------------------------------


def save_atomic(state: Any, path: str) -> str:
    """``torch.save(state)`` to ``path`` atomically: a temporary file in the
    same directory, fsync, rename, fsync of the directory. A crash leaves
    the previous file (or none), never a torn one. Returns ``path``."""
    return write_atomic(path, lambda f: torch.save(state, f))


def load_atomic(path: str, map_location: Any = "cpu") -> Any:
    """``torch.load`` of a file :func:`save_atomic` wrote."""
    return torch.load(path, map_location=map_location)


def resume_step(directory: str, world_size: Optional[int] = None, rank: int = 0) -> int:
    """The newest step with a complete checkpoint in ``directory`` (every
    rank's file when ``world_size`` is given, else ``rank``'s); 0 if none."""
    return _resume_step(directory, world_size, rank)


def _distributed(group: Any = None) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def agree_resume_step(directory: Optional[str], world_size: int, rank: int, group: Any = None) -> int:
    """:func:`resume_step` agreed by every rank (the smallest any rank
    found, so that every rank has its file; collective when distributed).
    Ranks on hosts without a shared directory each look in their own."""
    local = resume_step(directory, world_size if world_size > 1 else None, rank) if directory else 0
    if not _distributed(group):
        return local
    t = torch.tensor([local], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())  # (see Coordinator.end_step on keeping buffers alive)


def load_latest(
    directory: str,
    rank: int = 0,
    world_size: Optional[int] = None,
    map_location: Any = "cpu",
    step: Optional[int] = None,
) -> Tuple[int, Any]:
    """``(step, state)`` of this rank's checkpoint at ``step`` (None: the
    newest complete one, :func:`resume_step`); ``(0, None)`` when there is
    none. A file that does not load raises: the ranks must not silently
    resume from different steps."""
    if step is None:
        step = resume_step(directory, world_size, rank)
    if step == 0:
        return 0, None
    return step, load_atomic(checkpoint_path(directory, step, rank), map_location)


# --- orders -----------------------------------------------------------------


@dataclass
class _Pending:
    order_id: int
    step: Optional[int]
    halt: bool

    def due(self, completed: int) -> bool:
        return self.step is None or self.step <= completed


@dataclass
class _Unclaimed:
    step: int
    halt: bool
    at: float


class Coordinator:
    """Turns the agent's orders into per-step decisions all ranks share.

    ``client``: a :class:`railguard.JobClient` (None or a
    :class:`railguard.NullClient`: no orders). ``total_steps``: the last
    step (orders past it are refused). ``checkpoint_every``: periodic
    checkpoints (0: only when ordered). ``can_checkpoint``: False when this
    run has nowhere to write (checkpoint orders are then refused).
    ``group``: the process group to agree in (default: the world, when
    ``torch.distributed`` is initialised). ``clock``: for tests.
    """

    def __init__(
        self,
        client: Any = None,
        total_steps: int = 0,
        checkpoint_every: int = 0,
        can_checkpoint: bool = True,
        group: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.client = client if client is not None else NullClient()
        self.total_steps = total_steps
        self.checkpoint_every = checkpoint_every
        self.can_checkpoint = can_checkpoint
        self.group = group
        self._clock = clock
        self._pending: List[_Pending] = []
        self._unclaimed: Deque[_Unclaimed] = deque()
        self._stop_local: Optional[str] = None
        self._flags = [0, 0, 0]
        self._raised = [0, 0, 0]
        self._buf = torch.zeros(3, dtype=torch.int64)
        self._step = 0
        #: The step the job halted at (None: not halted).
        self.halted_at: Optional[int] = None
        self.finished = False

    # --- the loop's side ----------------------------------------------------

    def request_stop(self, reason: str = "signal") -> None:
        """Stop at the end of the current step, with every rank (safe to
        call from a signal handler)."""
        if self._stop_local is None:
            self._stop_local = reason

    def end_step(self, completed: int) -> None:
        """Call after each step (``completed`` steps are done): takes the
        orders that arrived, then agrees with the other ranks (a collective
        call when distributed: every rank must make it at every step)."""
        self._step = completed
        self.poll()
        local = [0, 0, 0]
        for p in self._pending:
            if p.due(completed):
                local[_CKPT] = 1
                if p.halt:
                    local[_HALT] = 1
        if self._stop_local is not None:
            local[_STOP] = 1
        self._raised = local
        if _distributed(self.group):
            # One buffer for the whole run, kept alive here: with torch 1.13
            # a tensor that Python drops while a gloo work item still holds
            # it must be freed by the gloo thread under the GIL, which
            # deadlocks if the main thread is then destroying the process
            # group (it joins that thread holding the GIL).
            buf = self._buf
            for i, v in enumerate(local):
                buf[i] = v
            dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=self.group)
            self._flags = [int(v) for v in buf.tolist()]
        else:
            self._flags = local

    @property
    def ordered(self) -> bool:
        """This step's checkpoint was ordered (by this rank's order or a
        peer's)."""
        return bool(self._flags[_CKPT])

    def should_checkpoint(self) -> bool:
        """Write a checkpoint of the step just completed (ordered or
        periodic), then call :meth:`checkpoint_saved`."""
        n = self._step
        scheduled = self.checkpoint_every > 0 and n > 0 and n % self.checkpoint_every == 0
        return self.ordered or scheduled

    def should_halt(self) -> bool:
        """A halting checkpoint was written: compute nothing more, call
        :meth:`wait_halted`."""
        return self.halted_at is not None

    def should_stop(self) -> bool:
        """A rank was told to stop (an order or :meth:`request_stop`): every
        rank stops after this step."""
        return bool(self._flags[_STOP])

    @property
    def stop_reason(self) -> str:
        """Why :meth:`should_stop`: this rank's reason, else ``peer``."""
        return self._stop_local or "peer"

    def checkpoint_saved(self, step: int) -> None:
        """This rank's checkpoint at ``step`` is durable: tells the agent
        (``checkpointed``) and answers the orders it carries out."""
        self._send(lambda c: c.checkpointed(step), f"checkpointed {step}")
        if not self.ordered:
            return
        halt = bool(self._flags[_HALT]) and step < self.total_steps
        done = [p for p in self._pending if p.due(step) and (halt or not p.halt)]
        self._pending = [p for p in self._pending if p not in done]
        if not self._raised[_CKPT] and not done:
            # A peer's order made us write it; ours may be on its way.
            if len(self._unclaimed) >= MAX_UNCLAIMED:
                self._unclaimed.popleft()
            self._unclaimed.append(_Unclaimed(step, halt, self._clock()))
        for p in done:
            self._send(lambda c, p=p: c.checkpoint_done(p.order_id, step), f"order {p.order_id}")
        if halt:
            self.halted_at = step
            orphaned, self._pending = self._pending, []
            for p in orphaned:
                want = "the next step" if p.step is None else f"step {p.step}"
                self._answer(p.order_id, False, f"halted at step {step} before {want}")

    def wait_halted(
        self,
        timeout: Optional[float] = None,
        interrupted: Optional[Callable[[], bool]] = None,
        poll: float = 0.1,
    ) -> Optional[str]:
        """Halted: waits to be stopped, answering orders meanwhile (another
        checkpoint order gets the halted step). Returns ``"order"`` after a
        stop order (answered), ``"signal"`` once ``interrupted()`` or
        :meth:`request_stop` says so, None after ``timeout`` seconds (None:
        no limit: the agent stops halted jobs)."""
        if self.halted_at is None:
            raise RuntimeError("wait_halted() but the job did not halt")
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            if self._stop_local is not None or (interrupted is not None and interrupted()):
                return "signal"
            o = self.client.poll_order(poll)
            if o is not None:
                if isinstance(o.kind, Stop):
                    self._answer(o.order_id, True, f"stopping at step={self.halted_at}")
                    return "order"
                self._take(o)
            if deadline is not None and self._clock() >= deadline:
                return None

    def finish(self) -> None:
        """All steps done: fails the orders still waiting (there will be no
        further checkpoint)."""
        self.finished = True
        self.poll()
        stale, self._pending = self._pending, []
        for p in stale:
            self._answer(p.order_id, False, f"the job finished all {self.total_steps} steps first")

    # --- orders -------------------------------------------------------------

    def poll(self) -> None:
        """Takes every order waiting in the client (no collective call)."""
        while True:
            o = self.client.poll_order(0)
            if o is None:
                return
            self._take(o)

    def _take(self, o: Order) -> None:
        k = o.kind
        if isinstance(k, Stop):
            self._answer(o.order_id, True, f"stopping at step={self._step}")
            self.request_stop("order")
            return
        if not isinstance(k, Checkpoint):
            self._answer(o.order_id, False, f"{k.TYPE}: this job registers no connections with the agent")
            return
        if not self.can_checkpoint:
            return self._answer(o.order_id, False, "no checkpoint directory configured")
        if self.halted_at is not None:
            return self._checkpoint_done(o.order_id, self.halted_at)
        if self.finished:
            return self._answer(o.order_id, False, f"the job finished all {self.total_steps} steps; no checkpoint")
        if k.step is not None and k.step > self.total_steps:
            return self._answer(o.order_id, False, f"step {k.step} is past the job's last step {self.total_steps}")
        now = self._clock()
        while self._unclaimed and now - self._unclaimed[0].at >= CLAIM_WINDOW:
            self._unclaimed.popleft()
        for u in list(self._unclaimed):
            if (u.halt or not k.halt) and (k.step is None or k.step == u.step):
                self._unclaimed.remove(u)
                return self._checkpoint_done(o.order_id, u.step)
        if len(self._pending) >= MAX_PENDING_ORDERS:
            return self._answer(o.order_id, False, "too many checkpoint orders waiting")
        self._pending.append(_Pending(o.order_id, k.step, k.halt))

    def _checkpoint_done(self, order_id: int, step: int) -> None:
        self._send(lambda c: c.checkpoint_done(order_id, step), f"order {order_id}")

    def _answer(self, order_id: int, ok: bool, detail: str) -> None:
        self._send(lambda c: c.order_done(order_id, ok, detail), f"order {order_id}")

    def _send(self, f: Callable[[Any], Any], what: str) -> None:
        # An answer that cannot be delivered must not kill the training run:
        # the agent times the order out and the supervisor decides.
        try:
            f(self.client)
        except ContractError as e:
            log.warning("%s not delivered to the agent: %s", what, e)
