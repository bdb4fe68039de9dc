"""railguard: the Python side of railguard's job contract.

A railguard node agent launches each rank of a training job with a few
``RAILGUARD_*`` environment variables (:mod:`railguard.env`), among them the
path of a Unix socket. Over that socket the rank and the agent exchange
JSON lines (:mod:`railguard.contract`): the rank says ``hello``, reports
``checkpointed`` steps and answers orders; the agent answers every line
``ok`` or ``error`` and sends orders (checkpoint now, halt after it, stop).
:class:`JobClient` (:mod:`railguard.client`) speaks it; the
:mod:`railguard.torch` helpers turn checkpoint orders into "checkpoint at
this step" decisions every rank of a DistributedDataParallel job agrees on
and write checkpoints atomically.

Quick start::

    import railguard
    client = railguard.JobClient.from_env()   # a no-op client without an agent
    ...
    order = client.poll_order()               # None, or an Order to answer

This package needs only the standard library; importing it does not
import torch (only ``railguard.torch`` does).
"""

from .client import (
    AgentGone,
    AgentRefused,
    AgentUnavailable,
    CallTimeout,
    ClientClosed,
    ClientOptions,
    Delivery,
    JobClient,
    NullClient,
)
from .contract import (
    Checkpoint,
    ContractError,
    Invalid,
    LineTooLong,
    Malformed,
    Migrate,
    Order,
    Pace,
    Stop,
    UnknownType,
)
from .env import EnvError, JobEnv, NotUnderRailguard

__version__ = "0.1.0"

__all__ = [
    "AgentGone",
    "AgentRefused",
    "AgentUnavailable",
    "CallTimeout",
    "Checkpoint",
    "ClientClosed",
    "ClientOptions",
    "ContractError",
    "Delivery",
    "EnvError",
    "Invalid",
    "JobClient",
    "JobEnv",
    "LineTooLong",
    "Malformed",
    "Migrate",
    "NotUnderRailguard",
    "NullClient",
    "Order",
    "Pace",
    "Stop",
    "UnknownType",
]
