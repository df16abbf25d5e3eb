"""Start-up: how soon `minispec decode` prints, finishes, and runs at full speed, on a fresh
package cache and a warm one, for the default settings and then a first `--temperature 0`.

    python -m benchmarks.bench_startup [--out results/startup.md]

Each decode is a process of its own, as a user runs it (`make decode`: 200 tokens), with
TORCHINDUCTOR_CACHE_DIR a new temporary folder. In order, in that one folder:
  default, --no-compile  the eager tier alone: what the load on the machine allows
  default, fresh cache   rounds run eagerly while the builder compiles in the background
  default, warm          after the builder has finished: the packages load
  T = 0, first time      the default's graphs (each row drafts by its own temperature in
                         the round): they load, nothing is built
  T = 0, warm
"first token" is time_to_first_token_s (from interpreter start-up); "done" is the whole
process, and "cpu" its CPU seconds (on an idle core, about its wall time); "full speed" is
when every graph the setting uses is on disk (the builder's queue empty, its lock let go), from
the process start, and "build cpu" the builder's CPU seconds for them (from the packages'
manifests); tok/s is the decode's own figure. The load average is printed with each row: on a
shared machine the wall times grow with it, the CPU seconds much less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minispec.compilation.builder import builder_running, queued
from minispec.compilation.packages import read_manifest

SCENARIOS = (  # (label, cache state, decode's extra arguments)
    ("default, --no-compile", "none", ["--no-compile"]),
    ("default", "fresh", []),
    ("default", "warm", []),
    ("--temperature 0", "first time", ["--temperature", "0"]),
    ("--temperature 0", "warm", ["--temperature", "0"]),
)
BUILD_TIMEOUT_S = 3600


def decode(cache: Path, extra: list[str], device: str) -> dict:
    """One `minispec decode --json` process; its times."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "minispec", "decode", "--json", "--device", device, *extra]
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    wall, used = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"decode failed: {proc.stderr.strip().splitlines()[-1:]}")
    report = json.loads(proc.stdout)
    return {
        "first_token_s": report["time_to_first_token_s"],
        "done_s": wall,
        "cpu_s": used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime,
        "load_average": os.getloadavg()[0],
        "tokens_per_s": report["stats"]["tokens_per_second"],
        "started": start,
        "stderr": proc.stderr.strip().splitlines(),
    }


def wait_for_builder(folder: Path) -> float:
    """perf_counter() once the folder's builder has nothing left to build."""
    deadline = time.perf_counter() + BUILD_TIMEOUT_S
    while time.perf_counter() < deadline:
        idle = not folder.exists() or (not queued(folder) and not builder_running(folder))
        if idle:
            return time.perf_counter()
        time.sleep(0.5)
    raise RuntimeError(f"the builder in {folder} did not finish within {BUILD_TIMEOUT_S} s")


def run(device: str = "cpu") -> list[dict]:
    """Every scenario, in order, in one fresh cache folder; a row each."""
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        folder = Path(cache) / "minispec-aot"
        for label, state, extra in SCENARIOS:
            result = decode(Path(cache), extra, device)
            before = set(folder.glob("*.pt2"))
            full_speed = result["first_token_s"]
            if state in ("fresh", "first time"):
                full_speed = wait_for_builder(folder) - result["started"]
            row = {"setting": label, "cache": state, **result, "full_speed_s": full_speed}
            built = set(folder.glob("*.pt2")) - before
            row["packages_built"] = len(built)
            row["build_cpu_s"] = sum(read_manifest(p).get("cpu_seconds", 0.0) for p in built)
            del row["started"]
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


HEADER = [
    "| setting | cache | first token s | done s (cpu s) | full speed s | graphs built "
    "(build cpu s) | tok/s | load average |",
    "|---|---|---|---|---|---|---|---|",
]


def format_row(r: dict) -> str:
    return (
        f"| {r['setting']} | {r['cache']} | {r['first_token_s']:.1f} | {r['done_s']:.1f} "
        f"({r['cpu_s']:.1f}) | {r['full_speed_s']:.0f} | {r['packages_built']} "
        f"({r['build_cpu_s']:.0f}) | {r['tokens_per_s']:.0f} | {r['load_average']:.1f} |"
    )


def render(rows: list[dict]) -> list[str]:
    """The start-up table, as markdown lines (for bench's report too)."""
    return ["\n## Start-up (a decode process, 200 tokens)\n", *HEADER, *map(format_row, rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_startup", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    print("\n".join(HEADER), flush=True)
    rows = run(args.device)
    if args.out:
        Path(args.out).write_text("\n".join(render(rows)) + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
