"""What every benchmark shares for timing: calls timed in turns, and the machine they ran on.

Calls are timed in turns (A B C A B C ...), never one after the other's whole series, so that a
burst of load from another process on a shared machine falls on every contender alike.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call, the device's queued work included."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def in_turns(
    calls: dict[str, Callable[[], object]], repeats: int, device: torch.device
) -> dict[str, float]:
    """The median seconds of each call over `repeats` turns, after one untimed warm-up call
    each (which compiles or loads a graph)."""
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            times[name].append(timed(fn, device))
    return {name: statistics.median(values) for name, values in times.items()}


def machine(device: torch.device, threads: int | None = None) -> dict:
    """What a result was measured on: CPU model, cores, torch, Python, threads, the GPU."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = dict(cpu=cpu, cores=os.cpu_count(), torch=torch.__version__, device=str(device))
    info.update(python=platform.python_version(), threads=threads or torch.get_num_threads())
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = round(os.getloadavg()[0], 2)
    return info
