#!/usr/bin/env python3
"""A deterministic PyTorch DistributedDataParallel job that speaks railguard's
job contract.

It trains a small MLP (16 -> hidden -> 1, tanh) on synthetic regression data
with gloo on CPU. Every rank's batch at step s is a function of (seed, s,
rank) only, so the data position *is* the step, and gradients are
averaged in rank order (``rank_ordered_mean``, a DDP communication hook):
a run interrupted and resumed from a checkpoint computes exactly what an
uninterrupted run does, and the final weights have the same bytes (same
digest) at any world size.

Run it under torchrun (``torchrun --nproc-per-node 2 torch_ddp.py``), as
two processes by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), alone,
or as a railguard job: the agent sets ``RAILGUARD_*`` (its socket, the job,
rank, world size, peers, port, checkpoint directory and period, resume
step); MASTER_ADDR/MASTER_PORT then default to rank 0's first data address
and the job's port.

Checkpoints go to ``<dir>/step-<N>/rank-<R>.pt`` every ``--checkpoint-every``
steps and whenever the agent orders one (all ranks agree on the step); a
halting order stops the computation until the job is stopped. Without a
resume step from the agent the run resumes from the newest checkpoint that
every rank completed.

Output (stdout, one event per line; the last two are for harnesses):

    start rank=R world=W step=S steps=T params=P
    resumed step=N path=P
    step=N unix_ms=T loss=L              every --log-every steps and the last
    checkpoint step=N ordered=0|1 path=P
    halted step=N
    stopped step=N reason=order|signal|peer     (exit 143)
    interrupted step=N                   --stop-after (exit 3)
    STALL {"max_step_gap_ms": ..., "steps": ..., ...}
    DIGEST <64 hex>                      sha256 of the final weights' bytes

``max_step_gap_ms`` is the longest time between the ends of two consecutive
steps in this process (the first gap starts when the loop starts), in
milliseconds; ``--step-log FILE`` also appends one JSON line per step with
wall-clock time (``{"rank","step","unix_ms"}``) to measure gaps across a
restart. Exit codes: 0 done, 1 error, 2 bad configuration or a checkpoint of
another run, 3 interrupted by --stop-after, 143 stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
# Run from a checkout without installing the package.
if os.path.isdir(os.path.join(HERE, "..", "railguard")):
    sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import railguard  # noqa: E402
from railguard.torch import Coordinator, agree_resume_step, checkpoint_path, load_atomic, save_atomic  # noqa: E402

INPUTS = 16
EXIT_DONE, EXIT_ERROR, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_STOPPED = 0, 1, 2, 3, 143


def out(line: str) -> None:
    print(line, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="total steps (counting those before a resume)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--checkpoint-dir", default=os.environ.get("RAILGUARD_CHECKPOINT_DIR") or None)
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="steps between checkpoints (default $RAILGUARD_CHECKPOINT_EVERY, else 0: only when ordered)",
    )
    p.add_argument(
        "--resume",
        default="auto",
        help="auto (the agent's RAILGUARD_RESUME_STEP, else the newest complete checkpoint), "
        "none, or a step",
    )
    p.add_argument("--stop-after", type=int, default=0, help="exit 3 right after this step (a crash)")
    p.add_argument("--step-delay-ms", type=float, default=0.0, help="sleep after each step")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--step-log", default=None, help="append a JSON line per step to this file")
    a = p.parse_args(argv)
    if a.steps < 1 or a.hidden < 1 or a.batch < 1 or a.log_every < 1:
        p.error("--steps, --hidden, --batch and --log-every must be positive")
    if a.checkpoint_every is not None and a.checkpoint_every < 0:
        p.error("--checkpoint-every must be >= 0")
    return a


def mix(*parts) -> int:
    """A 63-bit seed from the parts (stable across runs and Python versions)."""
    h = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def teacher(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(mix(seed, "teacher"))
    return torch.randn(INPUTS, 1, generator=g) / INPUTS**0.5


def batch(seed: int, step: int, rank: int, size: int, w: torch.Tensor):
    """Rank ``rank``'s batch at ``step``: a function of these only (no
    generator carried between steps, so a resumed run sees the same data)."""
    g = torch.Generator().manual_seed(mix(seed, step, rank))
    x = torch.randn(size, INPUTS, generator=g)
    y = torch.sin(3.0 * (x @ w)) + 0.1 * x[:, :1] ** 2
    return x, y


def make_model(seed: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(mix(seed, "init"))
    return torch.nn.Sequential(torch.nn.Linear(INPUTS, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


def rank_ordered_mean(process_group, bucket):
    """A DDP communication hook: the mean of the ranks' gradients, summed in
    rank order (all_gather, then add), element by element.

    DDP's default hook all-reduces each bucket with gloo's ring algorithm,
    where the order in which an element's terms are added depends on the
    element's offset in its bucket; and DDP lays its buckets out anew after
    each process's first iteration. So a run resumed from a checkpoint
    would add some gradients in another order than an uninterrupted run and
    differ from it in the last bits once there are more than two ranks.
    Summing in rank order makes every step's result independent of the
    layout, at the cost of an all_gather (small for this model)."""
    group = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    t = bucket.buffer()
    parts = [torch.empty_like(t) for _ in range(world)]
    fut = dist.all_gather(parts, t, group=group, async_op=True).get_future()

    def add(_):
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return total.div_(world)

    return fut.then(add)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        env = railguard.JobEnv.from_environ()
    except railguard.EnvError as e:
        print(f"torch_ddp: bad config: {e}", file=sys.stderr)
        return EXIT_CONFIG
    rank, world = env.rank, env.world_size
    every = a.checkpoint_every if a.checkpoint_every is not None else env.checkpoint_every
    ckdir = a.checkpoint_dir
    if every and not ckdir:
        print("torch_ddp: bad config: --checkpoint-every needs --checkpoint-dir", file=sys.stderr)
        return EXIT_CONFIG
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    identity = {
        "seed": a.seed,
        "hidden": a.hidden,
        "batch": a.batch,
        "lr": a.lr,
        "momentum": a.momentum,
        "world": world,
        "rank": rank,
    }

    # Stop cleanly on SIGTERM/SIGINT: every rank stops after the same step.
    stop_signal = {"n": 0}
    coord_ref = {}

    def on_signal(signum, frame):
        stop_signal["n"] += 1
        if stop_signal["n"] > 1:
            os._exit(EXIT_STOPPED)
        if "c" in coord_ref:
            coord_ref["c"].request_stop("signal")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if world > 1:
        os.environ.setdefault("MASTER_ADDR", env.master_addr() or "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            if env.port is None:
                print("torch_ddp: bad config: MASTER_PORT (or RAILGUARD_PORT) is not set", file=sys.stderr)
                return EXIT_CONFIG
            os.environ["MASTER_PORT"] = str(env.port)
        dist.init_process_group(
            "gloo", init_method="env://", rank=rank, world_size=world, timeout=timedelta(seconds=30)
        )

    try:
        client = railguard.JobClient.from_env()
    except railguard.ContractError as e:
        print(f"torch_ddp: job contract with the agent: {e}", file=sys.stderr)
        return EXIT_ERROR
    coord = Coordinator(client, total_steps=a.steps, checkpoint_every=every, can_checkpoint=ckdir is not None)
    coord_ref["c"] = coord
    if stop_signal["n"]:
        coord.request_stop("signal")

    # Where to start.
    if a.resume == "none":
        start = 0
    elif a.resume == "auto":
        if env.resume_step is not None:
            start = env.resume_step  # the supervisor knows which checkpoints are complete
        else:
            start = agree_resume_step(ckdir, world, rank)
    else:
        try:
            start = int(a.resume)
        except ValueError:
            print(f"torch_ddp: bad config: --resume {a.resume!r}", file=sys.stderr)
            return EXIT_CONFIG
    if start > a.steps or start < 0:
        print(f"torch_ddp: bad config: resume step {start} is past the last step {a.steps}", file=sys.stderr)
        return EXIT_CONFIG
    if start > 0 and not ckdir:
        print("torch_ddp: bad config: resuming needs --checkpoint-dir", file=sys.stderr)
        return EXIT_CONFIG

    model = make_model(a.seed, a.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    if start > 0:
        path = checkpoint_path(ckdir, start, rank)
        try:
            state = load_atomic(path)
        except FileNotFoundError:
            print(f"torch_ddp: checkpoint {path} is missing", file=sys.stderr)
            return EXIT_ERROR
        for k, v in identity.items():
            if state.get("identity", {}).get(k) != v:
                found = state.get("identity", {}).get(k)
                print(
                    f"torch_ddp: bad config: checkpoint {path} belongs to another run: "
                    f"{k} is {found}, this run has {v}",
                    file=sys.stderr,
                )
                return EXIT_CONFIG
        if state["step"] != start:
            print(f"torch_ddp: checkpoint {path} holds step {state['step']}, not {start}", file=sys.stderr)
            return EXIT_ERROR
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        out(f"resumed step={start} path={path}")
    if world > 1:
        net = DDP(model)
        net.register_comm_hook(None, rank_ordered_mean)
    else:
        net = model
    w_true = teacher(a.seed)
    nparams = sum(p.numel() for p in model.parameters())
    out(f"start rank={rank} world={world} step={start} steps={a.steps} params={nparams}")

    step_log = open(a.step_log, "a", buffering=1) if a.step_log else None
    t_loop = last = time.monotonic()
    max_gap, max_gap_step = 0.0, start
    for s in range(start, a.steps):
        x, y = batch(a.seed, s, rank, a.batch, w_true)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        n = s + 1
        coord.end_step(n)
        if coord.should_checkpoint() and ckdir:
            state = {"step": n, "identity": identity, "model": model.state_dict(), "optim": opt.state_dict()}
            path = save_atomic(state, checkpoint_path(ckdir, n, rank))
            coord.checkpoint_saved(n)
            out(f"checkpoint step={n} ordered={int(coord.ordered)} path={path}")
        now = time.monotonic()
        if now - last > max_gap:
            max_gap, max_gap_step = now - last, n
        last = now
        if step_log:
            step_log.write(json.dumps({"rank": rank, "step": n, "unix_ms": round(time.time() * 1000, 3)}) + "\n")
        if n % a.log_every == 0 or n == a.steps:
            out(f"step={n} unix_ms={int(time.time() * 1000)} loss={loss.item():.6f}")
        if coord.should_halt():
            out(f"halted step={n}")
            reason = coord.wait_halted(interrupted=lambda: stop_signal["n"] > 0)
            out(f"stopped step={n} reason={reason}")
            return EXIT_STOPPED
        if coord.should_stop():
            out(f"stopped step={n} reason={coord.stop_reason}")
            return EXIT_STOPPED
        if a.stop_after and n == a.stop_after and n < a.steps:
            out(f"interrupted step={n}")
            sys.stdout.flush()
            os._exit(EXIT_INTERRUPTED)  # like a crash: no cleanup, no final checkpoint
        if a.step_delay_ms:
            time.sleep(a.step_delay_ms / 1000)
    coord.finish()
    computed = a.steps - start
    summary = {
        "max_step_gap_ms": round(max_gap * 1000, 3),
        "max_gap_step": max_gap_step,
        "steps": a.steps,
        "computed_steps": computed,
        "resumed_from": start,
        "elapsed_ms": round((time.monotonic() - t_loop) * 1000, 3),
        "rank": rank,
        "world": world,
    }
    out("STALL " + json.dumps(summary, sort_keys=True))
    out(f"DIGEST {digest(model)}")
    if step_log:
        step_log.close()
    client.close()
    if world > 1:
        leave_process_group(dist)
    return EXIT_DONE


def leave_process_group(dist, within: float = 10.0) -> None:
    """Tears the process group down, bounded.

    All ranks meet first (none leaves while another is still in a
    collective). Torch 1.13's gloo teardown has been seen to hang once the
    run was done (the digest printed, the process never exiting); if it
    does not end within ``within`` seconds the process exits at once, its
    output flushed: the work is done and nothing is left to lose.
    """
    import threading

    dist.barrier()
    t = threading.Thread(target=dist.destroy_process_group, daemon=True)
    t.start()
    t.join(within)
    if t.is_alive():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_DONE)


if __name__ == "__main__":
    sys.exit(main())
