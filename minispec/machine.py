"""What this machine gives the decoder: which devices it can use, and how many CPU threads
torch runs on (the caller's count for the rounds, every core for the prefill).

A round is a few milliseconds of small kernels, where an OpenMP team's barrier per kernel costs
more than a second core saves (and far more when another process holds that core), so the
rounds run on whatever the caller set (the CLI and the bench default to one thread). The
prefill is the opposite case: every prompt token of every row through each model at once,
large matrix products (tens of GFLOP at B = 16) that split well across cores, run once per
call. So the prefill takes every core this process may use, and gives the count back after.

Every core is the right default on a machine of one's own and the wrong one on a shared one: an
OpenMP step waits for its slowest thread, and a core that another process holds makes that
thread late at every step (docs/benchmarks.md measures both cases). So the count is a setting
(`prefill_threads`, CLI `--prefill-threads`).

One rule of devices serves the API's `device` and the commands' --device (`device_problem`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import ContextManager

import torch


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity where the OS reports one (a container or
    `taskset` may allow fewer than the machine has), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with torch on `count` CPU threads; the caller's count is back afterwards,
    also when the block raises."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def prefill_threads(device: torch.device, count: int | None) -> ContextManager[None]:
    """torch_threads(count) for work on the CPU, every usable core when count is None; nothing
    on another device, whose kernels torch's CPU threads do not run."""
    if device.type != "cpu":
        return nullcontext()
    return torch_threads(count or usable_cores())


def device_problem(device: str | torch.device) -> str | None:
    """Why `device` cannot be used on this machine (torch would fail later with an assertion or
    a traceback), or None."""
    try:
        device = torch.device(device)
    except RuntimeError:
        return f"unknown device {str(device)!r}"
    if device.type == "cpu":
        return None
    backend = getattr(torch, device.type, None)
    if backend is None or not backend.is_available():
        return f"no {device.type} device is available to this torch build"
    if device.index is not None and device.index >= backend.device_count():
        return f"there are only {backend.device_count()} {device.type} devices"
    return None
