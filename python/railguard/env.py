"""The environment a railguard node agent gives each rank it launches.

The agent (``nodeagent/src/jobs/launch.rs``, ``rank_env``) starts every rank
as its own process with these variables, which win over anything the job
order's own ``env`` says:

===============================  ==============================================
``RAILGUARD_AGENT_SOCKET``       the agent's control socket (the job contract)
``RAILGUARD_JOB``                the job's name (what ``hello`` says)
``RAILGUARD_INCARNATION``        which (re)start of the job this is
``RAILGUARD_RANK``               this process's rank
``RAILGUARD_WORLD_SIZE``         the number of ranks
``RAILGUARD_PEERS``              ``host=addr0,addr1;host=...``, one per rank,
                                 in rank order (data NIC addresses by rail)
``RAILGUARD_NICS``               this host's data NICs in rail order,
                                 ``name=addr,name=addr`` (addr may be empty)
``RAILGUARD_PORT``               the job's data port
``RAILGUARD_CHECKPOINT_DIR``     where checkpoints go
``RAILGUARD_CHECKPOINT_EVERY``   steps between periodic checkpoints (0: only
                                 when ordered)
``RAILGUARD_RESUME_STEP``        resume from the complete checkpoint at this
                                 step (0: from scratch)
===============================  ==============================================

The agent sets no local rank and no ``MASTER_ADDR``/``MASTER_PORT``; under
``torchrun`` those come from torchrun (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ...). :meth:`JobEnv.from_environ` reads both, so one script
runs under the agent, under plain ``torchrun``, or alone:

* ``RAILGUARD_AGENT_SOCKET`` set: under railguard. ``RAILGUARD_JOB`` must be
  set too, and where both ``RAILGUARD_RANK`` and torchrun's ``RANK`` are
  set they must agree (else :class:`EnvError`).
* not set: standalone. Rank and world size come from torchrun's variables
  (default 0 and 1); :attr:`JobEnv.under_railguard` is False and
  :meth:`railguard.JobClient.from_env` gives a client that does nothing.

Use ``JobEnv.from_environ(require=True)`` in a program that must only run
under railguard: it raises :class:`NotUnderRailguard` otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

from .contract import SOCKET_ENV, ContractError, Invalid, check_name

__all__ = ["EnvError", "NotUnderRailguard", "Peer", "Nic", "JobEnv"]


class EnvError(ContractError):
    """A railguard variable is missing or does not parse."""


class NotUnderRailguard(EnvError):
    """The process was not started by a railguard agent (no
    ``RAILGUARD_AGENT_SOCKET``) but the caller required it."""


@dataclass(frozen=True)
class Peer:
    """One rank's host and its data NIC addresses in rail order."""

    host: str
    addrs: Tuple[str, ...]


@dataclass(frozen=True)
class Nic:
    """One of this host's data NICs (``addr`` empty if the agent does not
    know it)."""

    name: str
    addr: str


def _uint(env: Mapping[str, str], name: str) -> Optional[int]:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    s = raw.strip()
    if not s.isdigit() or not s.isascii():
        raise EnvError(f"{name}={raw!r} is not a non-negative integer")
    return int(s)


def _peers(raw: str) -> Tuple[Peer, ...]:
    out = []
    for i, entry in enumerate(p for p in raw.split(";") if p.strip()):
        host, eq, addrs = entry.partition("=")
        if not eq or not host.strip():
            raise EnvError(f"RAILGUARD_PEERS entry {i} ({entry!r}) is not host=addr,addr")
        out.append(Peer(host.strip(), tuple(a.strip() for a in addrs.split(",") if a.strip())))
    return tuple(out)


def _nics(raw: str) -> Tuple[Nic, ...]:
    out = []
    for entry in (n for n in raw.split(",") if n.strip()):
        name, eq, addr = entry.partition("=")
        if not eq or not name.strip():
            raise EnvError(f"RAILGUARD_NICS entry {entry!r} is not name=addr")
        out.append(Nic(name.strip(), addr.strip()))
    return tuple(out)


@dataclass(frozen=True)
class JobEnv:
    """What the agent (or torchrun) told this process; see the module
    docstring for where each field comes from."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    job: Optional[str] = None
    incarnation: int = 0
    #: The agent's control socket; None when standalone.
    socket_path: Optional[str] = None
    peers: Tuple[Peer, ...] = ()
    nics: Tuple[Nic, ...] = ()
    port: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0
    #: The step to resume from as the agent said it (0: from scratch); None
    #: when the agent did not say (standalone: look in the directory).
    resume_step: Optional[int] = None
    extra: Dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def under_railguard(self) -> bool:
        """Started by a railguard agent (its socket is known)."""
        return self.socket_path is not None

    @property
    def nic_names(self) -> Tuple[str, ...]:
        """This host's data NIC names in rail order."""
        return tuple(n.name for n in self.nics)

    @classmethod
    def from_environ(
        cls, environ: Optional[Mapping[str, str]] = None, require: bool = False
    ) -> "JobEnv":
        """Reads the environment (``os.environ`` by default). Raises
        :class:`EnvError` for a value that does not parse or contradicts
        another, and :class:`NotUnderRailguard` when ``require`` and the
        agent's socket is not set."""
        env = os.environ if environ is None else environ
        socket = env.get(SOCKET_ENV) or None
        if socket is None and require:
            raise NotUnderRailguard(
                f"{SOCKET_ENV} is not set: this process was not started by a railguard "
                "agent. Run it as a railguard job, or call JobEnv.from_environ() / "
                "JobClient.from_env() without require=True to run standalone."
            )

        def pick(ours: str, theirs: str, default: int) -> int:
            a, b = _uint(env, ours), _uint(env, theirs)
            if a is not None and b is not None and a != b:
                raise EnvError(
                    f"{ours}={a} but {theirs}={b}: railguard and the launcher disagree "
                    "about this process (one railguard rank must be one process)"
                )
            return a if a is not None else b if b is not None else default

        rank = pick("RAILGUARD_RANK", "RANK", 0)
        world = pick("RAILGUARD_WORLD_SIZE", "WORLD_SIZE", 1)
        if world < 1:
            raise EnvError(f"world size {world}: must be at least 1")
        if rank >= world:
            raise EnvError(f"rank {rank} is outside a world of {world}")
        job = env.get("RAILGUARD_JOB") or None
        if socket is not None:
            if job is None:
                raise EnvError(f"{SOCKET_ENV} is set but RAILGUARD_JOB is not: which job is this?")
            try:
                check_name("RAILGUARD_JOB", job)
            except Invalid as e:
                raise EnvError(str(e)) from None
        peers = _peers(env.get("RAILGUARD_PEERS", ""))
        if peers and len(peers) != world:
            raise EnvError(f"RAILGUARD_PEERS names {len(peers)} ranks for a world of {world}")
        port = _uint(env, "RAILGUARD_PORT")
        if port is not None and not 0 < port < 65536:
            raise EnvError(f"RAILGUARD_PORT={port} is not a port")
        return cls(
            rank=rank,
            world_size=world,
            local_rank=_uint(env, "LOCAL_RANK") or 0,
            job=job,
            incarnation=_uint(env, "RAILGUARD_INCARNATION") or 0,
            socket_path=socket,
            peers=peers,
            nics=_nics(env.get("RAILGUARD_NICS", "")),
            port=port,
            checkpoint_dir=env.get("RAILGUARD_CHECKPOINT_DIR") or None,
            checkpoint_every=_uint(env, "RAILGUARD_CHECKPOINT_EVERY") or 0,
            resume_step=_uint(env, "RAILGUARD_RESUME_STEP"),
            extra={k: v for k, v in env.items() if k.startswith("RAILGUARD_")},
        )

    def master_addr(self) -> Optional[str]:
        """Rank 0's first data address (from ``RAILGUARD_PEERS``), a
        ``MASTER_ADDR`` for ranks the agent launched; None if unknown."""
        if self.peers and self.peers[0].addrs:
            return self.peers[0].addrs[0]
        return None
