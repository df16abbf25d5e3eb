"""The exported pair on vLLM, checked against minispec (needs a CUDA GPU and `pip install vllm`).

    python scripts/vllm_check.py [--out /tmp/minispec-hf] [--max-new-tokens 64] [--dtype float32]

1. Exports the pair (python -m minispec export) and checks that vLLM's tokenizer encodes the
   prompts to minispec's ids.
2. Runs vLLM's offline LLM(...) on the target, greedy, twice, each in its own process (one
   engine per process frees its GPU memory for sure): alone, and with the draft as a
   speculative draft model, K = 4.
3. Compares token ids: speculative vLLM must equal target-only vLLM (speculative decoding is
   exact), and both must equal minispec's greedy K = 0 output, computed here in float32.

Exit 0 when all three agree. In float32 (the default) they should; in bfloat16 vLLM and the
float32 reference may part at a near-tie, and a later position only shows where. Prints one
JSON line per run and a verdict.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minispec.commands.cli import DEFAULT_PROMPT  # noqa: E402 (after the path is set)

PROMPTS = [
    DEFAULT_PROMPT,
    "def add(a, b):\n    return",
    "class Parser:\n    def __init__(self, text):\n",
]
K = 4


def vllm_run(out: Path, speculative: bool, max_new_tokens: int, dtype: str) -> dict:
    """In a child process: greedy token ids from vLLM for every prompt."""
    from vllm import LLM, SamplingParams

    from model import tokenizer

    spec = (
        {
            "method": "draft_model",
            "model": str(out / "draft"),
            "num_speculative_tokens": K,
            "draft_sample_method": "probabilistic",
        }
        if speculative
        else None
    )
    llm = LLM(
        model=str(out / "target"),
        dtype=dtype,
        max_model_len=512,
        gpu_memory_utilization=0.3,
        speculative_config=spec,
        seed=0,
    )
    encoded = [llm.get_tokenizer().encode(p) for p in PROMPTS]
    outputs = llm.generate(
        [{"prompt_token_ids": tokenizer.encode(p)} for p in PROMPTS],
        SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
    )
    return {
        "speculative": speculative,
        "tokenizer_matches": encoded == [tokenizer.encode(p) for p in PROMPTS],
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
    }


def minispec_reference(max_new_tokens: int) -> list[list[int]]:
    import torch

    from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
    from minispec.decode import SpeculativeDecoder
    from minispec.params import SamplingParams, SpeculativeConfig
    from model import tokenizer
    from model.checkpoint import load_pair

    device = "cuda" if torch.cuda.is_available() else "cpu"
    target, draft = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, device=device)
    params = [SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens) for _ in PROMPTS]
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    return (
        SpeculativeDecoder(target, draft, compile=False)
        .generate(prompts, params, SpeculativeConfig(0))
        .token_ids
    )


def first_difference(a: list[list[int]], b: list[list[int]]) -> str | None:
    for row, (x, y) in enumerate(zip(a, b)):
        if x != y:
            at = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
            return f"prompt {row}, token {at}"
    return None


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="/tmp/minispec-hf")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--child", choices=["plain", "speculative"], help=argparse.SUPPRESS)
    args = p.parse_args()
    out = Path(args.out)
    if args.child:
        print(
            json.dumps(vllm_run(out, args.child == "speculative", args.max_new_tokens, args.dtype))
        )
        return 0
    subprocess.run([sys.executable, "-m", "minispec", "export", str(out)], cwd=ROOT, check=True)
    reference = minispec_reference(args.max_new_tokens)
    runs = {}
    for child in ("plain", "speculative"):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                child,
                "--out",
                str(out),
                "--max-new-tokens",
                str(args.max_new_tokens),
                "--dtype",
                args.dtype,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        if done.returncode:
            print(f"vLLM ({child}) failed with exit code {done.returncode}")
            return 1
        runs[child] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(runs[child]))
    checks = {
        "vLLM tokenizer == minispec tokenizer": None
        if all(r["tokenizer_matches"] for r in runs.values())
        else "ids differ",
        "vLLM speculative == vLLM target-only": first_difference(
            runs["speculative"]["token_ids"], runs["plain"]["token_ids"]
        ),
        "vLLM target-only == minispec K = 0": first_difference(
            runs["plain"]["token_ids"], reference
        ),
    }
    for name, problem in checks.items():
        print(
            f"{'ok  ' if problem is None else 'FAIL'} {name}"
            + (f" (first difference: {problem})" if problem else "")
        )
    return 0 if all(problem is None for problem in checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
