"""The vLLM check's and bench's own logic, without vLLM: comparing token ids, the T = 1
verdict, scoring samples, the rotation order and the bench's summary."""

import json
import random

import pytest
import torch

from minispec.commands import bench_vllm
from minispec.commands.vllm_check import (
    Z_LIMIT,
    compare_ids,
    sample_nll,
    sampling_verdict,
    strip_eos,
)
from minispec.commands.vllm_peer import speculative_config
from model.config import GPTConfig
from model.gpt import GPT


def test_strip_eos_cuts_at_the_first_eos_only():
    assert strip_eos([5, 6, 257, 7, 257], 257) == [5, 6]
    assert strip_eos([5, 6], 257) == [5, 6]


def test_compare_ids_counts_equal_rows_and_names_the_first_difference():
    reference = [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert compare_ids(reference, reference) == (3, None)
    assert compare_ids([[1, 2, 3], [4, 9, 6], [7]], reference) == (1, "prompt 1, token 1")
    # a row that stops early differs where it stops
    assert compare_ids([[1, 2, 3], [4, 5, 6], [7]], reference) == (2, "prompt 2, token 1")
    with pytest.raises(ValueError):
        compare_ids([[1]], reference)  # a missing row is an error, not a pass


def draws(rng: random.Random, mean: float, n: int = 36) -> list[float]:
    return [rng.gauss(mean, 0.3) for _ in range(n)]


def test_sampling_verdict_rarely_flags_one_distribution_and_always_flags_a_shift():
    rng = random.Random(0)
    # Same law: at |z| <= 4 a false alarm has probability ~6e-5 per comparison; allowing 1 in
    # 300 makes this test's own false-alarm rate about 1.5e-4 (Poisson, mean 0.02).
    alarms = sum(
        not sampling_verdict(draws(rng, 1.1), draws(rng, 1.1))["agrees"] for _ in range(300)
    )
    assert alarms <= 1
    # Power: a shift of 0.5 nats/token (z about 7 with 36 samples a side) is flagged every time,
    # and so is what a broken speculative sampler gives (11 nats/token against 1.1).
    assert all(not sampling_verdict(draws(rng, 1.6), draws(rng, 1.1))["agrees"] for _ in range(100))
    broken = sampling_verdict(draws(rng, 11.0), draws(rng, 1.1))
    assert not broken["agrees"] and broken["z"] > Z_LIMIT and broken["difference"] > 9


def test_sampling_verdict_flags_too_likely_samples_too():
    rng = random.Random(1)
    greedy_like = sampling_verdict(draws(rng, 0.4), draws(rng, 1.1))
    assert not greedy_like["agrees"] and greedy_like["z"] < -Z_LIMIT


def test_sample_nll_is_the_mean_negative_log_likelihood_of_the_sampled_tokens():
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=16, mlp_hidden=32, max_seq_len=32)
    )
    prompt, sample = [1, 2, 3], [4, 5]
    logp = torch.log_softmax(model(torch.tensor([prompt + sample]))[0].double(), -1)
    expected = -(logp[2, 4] + logp[3, 5]).item() / 2
    assert sample_nll(model, [prompt, prompt], [sample, []]) == [pytest.approx(expected)]
    # a different continuation scores differently: the sample's own tokens are read
    assert sample_nll(model, [prompt], [[5, 4]])[0] != pytest.approx(expected)


def test_speculative_config_per_mode():
    from pathlib import Path

    assert speculative_config("plain", Path("x"), 4) is None
    assert speculative_config("draft_model", Path("x"), 4)["model"] == str(Path("x") / "draft")
    assert speculative_config("ngram", Path("x"), 3)["num_speculative_tokens"] == 3
    assert "draft_sample_method" not in speculative_config("draft_model", Path("x"), 4)
    sampled = speculative_config("draft_model_probabilistic", Path("x"), 4)
    assert sampled["draft_sample_method"] == "probabilistic" and sampled["method"] == "draft_model"
    with pytest.raises(ValueError, match="mode must be one of"):
        speculative_config("eagle", Path("x"), 4)


def test_rotation_order_puts_each_setting_first_once_per_cycle():
    n = len(bench_vllm.SETTINGS)
    firsts = [bench_vllm.rotation_order(r)[0] for r in range(n)]
    assert sorted(firsts) == sorted(bench_vllm.SETTINGS)
    assert all(
        sorted(bench_vllm.rotation_order(r)) == sorted(bench_vllm.SETTINGS) for r in range(n)
    )


def run(tokens: int, wall: float, cpu: float) -> dict:
    return {"token_ids": [[0] * tokens], "wall_s": wall, "cpu_s": cpu}


def test_summary_compares_auto_with_the_fastest_exact_vllm_mode_only():
    plain, draft, k0, auto = bench_vllm.SETTINGS
    runs = {
        plain: [run(100, 1.0, 2.0), run(100, 1.0, 2.0)],  # 100 tok/s, 50 per CPU-second
        draft: [run(300, 1.0, 2.0), run(300, 1.0, 2.0)],  # fastest, but not exact here
        k0: [run(100, 1.0, 1.0), run(100, 2.0, 2.0)],
        auto: [run(200, 1.0, 1.0), run(200, 1.0, 1.0)],
    }
    s = bench_vllm.summarize(runs, exact={plain})
    assert s["best_exact_vllm"] == plain
    assert s["auto_over_best_vllm"]["median"] == pytest.approx(2.0)
    assert s["auto_over_best_vllm_per_cpu_s"]["median"] == pytest.approx(4.0)
    # paired by rotation: 2x in the first, 4x in the second
    assert (s["auto_over_k0"]["min"], s["auto_over_k0"]["max"]) == pytest.approx((2.0, 4.0))
    assert bench_vllm.summarize(runs, exact={plain, draft})["best_exact_vllm"] == draft


def test_the_check_writes_its_table_and_fails_on_a_greedy_difference(tmp_path, monkeypatch):
    """main() end to end with the engines stubbed: one table row per engine, the per-sample
    scores beside it, exit 0 when every greedy run equals minispec K = 0, 1 when one differs."""
    from minispec.commands import vllm_check

    def fake_minispec(decoder, prompts, sampled, max_new, k):
        run = {
            "greedy": [[65] * max_new for _ in prompts],
            "sampled": [[66] * max_new] * len(sampled),
        }
        return {"K = 0": run, f"K = {k}": run}

    def fake_vllm(python, folder, modes, prompts, sampled, max_new, k, dtype, bad=None):
        info = {"vllm": "stub", "torch": torch.__version__, "device": "cpu", "startup_s": 1.0}
        info.update(probe="ab", tokenizer_ids=[256, 97, 98])
        rows = {
            mode: {
                "greedy": [[65] * max_new + ([257] if mode == "plain" else []) for _ in prompts],
                "sampled": [[66, 67][: 1 + i % 2] for i in range(len(sampled))],
            }
            for mode in modes
        }
        if bad:
            rows[bad]["greedy"][1][2] = 70
        return rows, {mode: info for mode in modes}

    monkeypatch.setattr(vllm_check, "minispec_rows", fake_minispec)
    monkeypatch.setattr(vllm_check, "vllm_rows", fake_vllm)
    out = tmp_path / "check.md"
    argv = ["--prompts", "2", "--samples", "2", "--max-new-tokens", "4", "--out", str(out)]
    assert vllm_check.main(argv + ["--modes", "ngram"]) == 0
    text = out.read_text()
    assert "| vLLM target-only | 2/2 |" in text and "| vLLM ngram K = 4 | 2/2 |" in text
    assert "draft_model" not in text  # only the modes asked for, and target-only always
    assert set(json.loads(out.with_suffix(".json").read_text())) == {
        "minispec K = 0",
        "minispec K = 4",
        "vLLM target-only",
        "vLLM ngram K = 4",
    }
    monkeypatch.setattr(vllm_check, "vllm_rows", lambda *a: fake_vllm(*a, bad="ngram"))
    assert vllm_check.main(argv + ["--modes", "ngram"]) == 1
    assert "1/2 (first difference: prompt 1, token 2)" in out.read_text()


def test_the_bench_part_is_one_line_without_the_vllm_environment(tmp_path, capsys):
    from types import SimpleNamespace

    args = SimpleNamespace(vllm_python=str(tmp_path / "no-venv" / "bin" / "python"))
    note = bench_vllm.vllm_section(None, ["a prompt"], args, tmp_path / "vllm" / "bench.md")
    assert note.startswith("vLLM rows skipped") and "make vllm-check" in note
    assert capsys.readouterr().out.count("\n") == 1
    assert not (tmp_path / "vllm").exists()  # nothing written
