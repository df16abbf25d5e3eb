"""vLLM on the exported pair, driven from another process: the engine side and the caller side.

vLLM lives in its own virtual environment (its CPU build pins torch and pulls packages minispec
does not want), so minispec talks to it through a child process running this module
(`VLLM_PYTHON -m benchmarks.vllm_peer --folder EXPORT_DIR --mode MODE`). The child builds one
`vllm.LLM` (timed: the engine's start-up), then reads one JSON job per line on stdin, writes
each answer to the file the job names and prints `DONE_MARK` and the job's id: vLLM's own
logging may share stdout, so no answer travels there. `VLLMEngine` is the caller's side.

Settings that make vLLM's CPU build run (the same code runs on a GPU with the CUDA build):
`VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache) set when unset, `max_model_len` 512 (the pair's
context), the caller's dtype, and the engine built under `if __name__ == "__main__"` (vLLM
starts worker processes that re-import the main module).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DONE_MARK = "minispec-vllm-done"
# draft_model drafts greedily (vLLM's default draft_sample_method: one-hot draft probabilities);
# draft_model_probabilistic samples its drafts and passes their probabilities.
MODES = ("plain", "draft_model", "draft_model_probabilistic", "ngram")
ROOT = Path(__file__).resolve().parent.parent  # the repository: benchmarks/ sits in it


def speculative_config(mode: str, folder: Path, k: int) -> dict | None:
    """vLLM's speculative_config for a mode: none, the exported draft, or prompt lookup."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "plain":
        return None
    config = {"method": mode.removesuffix("_probabilistic"), "num_speculative_tokens": k}
    if mode == "ngram":
        return config | {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
    config["model"] = str(folder / "draft")
    if mode == "draft_model_probabilistic":
        config["draft_sample_method"] = "probabilistic"
    return config


def process_tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and every live descendant."""
    import psutil  # a dependency of vLLM

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def run_job(llm, job: dict) -> dict:
    """Generate for every prompt of the job: one `generate` call for the whole batch, or (batch
    false) one call per prompt; timed in wall and CPU seconds."""
    from vllm import SamplingParams

    prompts = job["prompt_token_ids"]
    params = [
        SamplingParams(
            temperature=job["temperature"],
            max_tokens=job["max_tokens"],
            seed=None if job.get("seed") is None else job["seed"] + i,
        )
        for i in range(len(prompts))
    ]
    groups = [range(len(prompts))] if job.get("batch", True) else [[i] for i in range(len(prompts))]
    token_ids: list[list[int]] = [[] for _ in prompts]
    cpu, wall = process_tree_cpu_seconds(), time.perf_counter()
    for group in groups:
        outputs = llm.generate(
            [{"prompt_token_ids": prompts[i]} for i in group],
            [params[i] for i in group],
            use_tqdm=False,
        )
        for i, out in zip(group, outputs):
            token_ids[i] = list(out.outputs[0].token_ids)
    wall = time.perf_counter() - wall
    return {"token_ids": token_ids, "wall_s": wall, "cpu_s": process_tree_cpu_seconds() - cpu}


def serve(args: argparse.Namespace) -> None:
    """The child: build the engine, report its start-up, then answer jobs until stdin closes
    (args: main's flags)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    start = time.perf_counter()
    import torch
    from vllm import LLM

    extra = {"gpu_memory_utilization": 0.3} if torch.cuda.is_available() else {}
    llm = LLM(
        model=str(args.folder / "target"),
        dtype=args.dtype,
        max_model_len=512,
        speculative_config=speculative_config(args.mode, args.folder, args.k),
        enable_prefix_caching=not args.no_prefix_caching,
        seed=0,
        **extra,
    )
    import vllm

    probe = "def add(a, b):\n    return"
    info = dict(startup_s=time.perf_counter() - start, vllm=vllm.__version__)
    info.update(torch=torch.__version__, device="cuda" if torch.cuda.is_available() else "cpu")
    info.update(tokenizer_ids=llm.get_tokenizer().encode(probe), probe=probe)
    write_json(args.ready_file, info)
    print(DONE_MARK, "ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        write_json(Path(job["answer_file"]), run_job(llm, job))
        print(DONE_MARK, job["id"], flush=True)


def write_json(path: Path, value: dict) -> None:
    """Whole or not at all: a reader never sees half an answer."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


class VLLMEngine:
    """A vLLM engine in a child process (`python` of the vLLM environment), one mode, kept for
    many jobs. `info` holds the child's start-up report; `startup_s` is the wall time from
    launching the child to its engine being ready, as a user waits for it."""

    def __init__(
        self,
        python: str,
        folder: Path,
        mode: str,
        k: int = 4,
        dtype: str = "float32",
        prefix_caching: bool = True,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="minispec-vllm-"))
        self.mode, self.jobs = mode, 0
        env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        start = time.perf_counter()
        self.proc = subprocess.Popen(
            [python, "-m", "benchmarks.vllm_peer", "--folder", str(folder)]
            + ["--mode", mode, "--k", str(k), "--dtype", dtype, "--ready-file"]
            + [str(self.dir / "ready.json")]
            + ([] if prefix_caching else ["--no-prefix-caching"]),
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: pause() stops all its processes
        )
        self.wait_for("ready")
        self.startup_s = time.perf_counter() - start
        self.info = json.loads((self.dir / "ready.json").read_text())

    def pause(self) -> None:
        """Stop every process of the engine: an idle vLLM engine polls, and takes CPU time from
        whatever runs beside it."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def wait_for(self, job_id: str) -> None:
        for line in self.proc.stdout:
            if line.split() == [DONE_MARK, job_id]:
                return
        code = self.proc.wait()
        raise RuntimeError(f"vLLM ({self.mode}) exited with code {code} before answering")

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        temperature: float,
        max_tokens: int,
        seed: int | None = None,
        batch: bool = True,
    ) -> dict:
        """{"token_ids", "wall_s", "cpu_s"} for the prompts, seeded per prompt (seed + i)."""
        self.jobs += 1
        job_id = str(self.jobs)
        answer = self.dir / f"{job_id}.json"
        job = dict(id=job_id, answer_file=str(answer), prompt_token_ids=prompt_token_ids)
        job.update(temperature=temperature, max_tokens=max_tokens, seed=seed, batch=batch)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        self.wait_for(job_id)
        return json.loads(answer.read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", type=Path, required=True, help="the export: target/, draft/")
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--ready-file", type=Path, required=True)
    p.add_argument("--no-prefix-caching", action="store_true", help="recompute every prompt")
    serve(p.parse_args())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
