"""The vLLM check's and bench's own logic, without vLLM: comparing token ids, the T = 1
verdict, scoring samples, the rotation order and the bench's summary."""

import json
import random

import pytest
import torch

from benchmarks import bench_vllm
from benchmarks.vllm_check import (
    Z_LIMIT,
    compare_ids,
    sample_nll,
    sampling_verdict,
    strip_eos,
)
from benchmarks.vllm_peer import speculative_config
from minispec.stats import DecodeStats
from model.gpt import GPT, GPTConfig


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
    every = bench_vllm.settings([1, 2])
    assert len(every) == 6 and len({s.name for s in every}) == 6
    firsts = [bench_vllm.rotation_order(every, r)[0] for r in range(len(every))]
    assert sorted(s.name for s in firsts) == sorted(s.name for s in every)
    assert all(
        sorted(s.name for s in bench_vllm.rotation_order(every, r)) == sorted(s.name for s in every)
        for r in range(len(every))
    )


def test_settings_run_minispec_k0_and_auto_on_each_thread_count():
    ours = [s for s in bench_vllm.settings([1, 2]) if s.vllm_mode is None]
    assert [(s.spec.num_speculative_tokens, s.threads) for s in ours] == [
        (0, 1),
        ("auto", 1),
        (0, 2),
        ("auto", 2),
    ]
    assert ours[3].name == "minispec auto, 2 threads"


def test_only_target_only_counts_as_exact_when_sampling():
    plain, draft = (s.name for s in bench_vllm.VLLM_SETTINGS)
    assert bench_vllm.exact_vllm_modes(0.0) == {plain, draft}
    assert bench_vllm.exact_vllm_modes(1.0) == {plain}


def run(tokens: int, wall: float, cpu: float, rounds: float | None = None) -> dict:
    r = {"token_ids": [[0] * tokens], "wall_s": wall, "cpu_s": cpu}
    return r if rounds is None else {**r, "rounds_s": rounds}


def name(k, threads: int) -> str:
    return bench_vllm.minispec_setting(k, threads).name


def fake_runs() -> dict[str, list[dict]]:
    plain, draft = (s.name for s in bench_vllm.VLLM_SETTINGS)
    return {
        plain: [run(100, 1.0, 2.0), run(100, 1.0, 2.0)],  # 100 tok/s, 50 per CPU-second
        draft: [run(300, 1.0, 2.0), run(300, 1.0, 2.0)],  # fastest, but exact only at T = 0
        name(0, 1): [run(100, 1.0, 1.0, 0.5), run(100, 2.0, 2.0, 0.5)],
        name("auto", 1): [run(200, 1.0, 1.0, 0.25), run(200, 1.0, 1.0, 0.25)],
        name(0, 2): [run(100, 1.0, 2.0, 0.5), run(100, 1.0, 2.0, 0.5)],
        name("auto", 2): [run(300, 1.0, 2.0, 0.5), run(300, 1.0, 2.0, 0.5)],
    }


def test_summary_compares_auto_with_the_fastest_exact_vllm_mode_only():
    plain, draft = (s.name for s in bench_vllm.VLLM_SETTINGS)
    s = bench_vllm.summarize(fake_runs(), {plain}, [1, 2])
    assert s["best_exact_vllm"] == plain
    one, two = s["minispec"][1], s["minispec"][2]
    assert one["auto_over_best_vllm"]["median"] == pytest.approx(2.0)
    assert one["auto_over_best_vllm_per_cpu_s"]["median"] == pytest.approx(4.0)
    # paired by rotation: 2x in the first, 4x in the second
    assert (one["auto_over_k0"]["min"], one["auto_over_k0"]["max"]) == pytest.approx((2.0, 4.0))
    # rounds only: 200 tokens in 0.25 s against 100 in 0.5 s
    assert one["auto_over_k0_rounds"]["median"] == pytest.approx(4.0)
    assert two["auto_over_best_vllm"]["median"] == pytest.approx(3.0)
    assert two["auto_over_k0_rounds"]["median"] == pytest.approx(3.0)
    assert s["settings"][name(0, 1)]["rounds_tokens_per_s"]["median"] == pytest.approx(200)
    assert (
        s["settings"][draft]["exact"] is False and "rounds_tokens_per_s" not in s["settings"][draft]
    )
    assert bench_vllm.summarize(fake_runs(), {plain, draft}, [1, 2])["best_exact_vllm"] == draft


def test_goal_lines_read_each_goal_at_its_point_and_say_whether_it_is_met():
    plain = bench_vllm.TARGET_ONLY.name
    rows = []
    for b, t in ((16, 0.0), (1, 0.0), (16, 1.0), (1, 1.0)):
        row = {"B": b, "temperature": t, **bench_vllm.summarize(fake_runs(), {plain}, [1, 2])}
        rows.append(row)
    lines = bench_vllm.goal_lines(rows)
    body = lines[2:]
    # the B = 1 goal at T = 0 only; per CPU-second and per second at each T; K = 0 per T and
    # clock: 1 + 2 + 2 + 4 goal lines, each on two thread counts
    assert len(body) == 2 * (1 + 2 + 2 + 4)
    assert all(line.count("|") == 7 for line in body)
    b1 = [line for line in body if "1.3x" in line]
    assert [line.split(" | ")[1:4] for line in b1] == [
        ["1", "0", "1 thread"],
        ["1", "0", "2 threads"],
    ]
    # auto over target-only: 2.00x on 1 thread, 3.00x on 2 threads, both every rotation
    assert b1[0].endswith("| 2.00x (2.00-2.00) | yes (every rotation) |")
    # auto over its own K = 0, whole calls, 1 thread: 2x and 4x, short of 1.5x in none
    whole = [line for line in body if "1.5x its own K = 0, whole" in line]
    assert whole[0].endswith("| yes (every rotation) |")
    assert not any(line.endswith("| no |") for line in body)
    assert bench_vllm.goal_lines(rows[1:2])[2:] == b1  # unmeasured points are left out
    # power: auto on 2 threads no faster than its own K = 0 misses the two K = 0 goals at T = 1
    runs = fake_runs()
    runs[name("auto", 2)] = runs[name(0, 2)]
    slow = {"B": 16, "temperature": 1.0, **bench_vllm.summarize(runs, {plain}, [1, 2])}
    missed = [line for line in bench_vllm.goal_lines([slow]) if line.endswith("| no |")]
    assert len(missed) == 2 and all("its own K = 0" in m and "2 threads" in m for m in missed)


def test_the_report_holds_both_tables_the_goals_and_the_exact_marks():
    plain, draft = (s.name for s in bench_vllm.VLLM_SETTINGS)
    rows = []
    for b, t in ((16, 0.0), (16, 1.0)):
        exact = bench_vllm.exact_vllm_modes(t)
        row = {"B": b, "temperature": t, "rotations": 2, "sample_scores": {}}
        rows.append({**row, **bench_vllm.summarize(fake_runs(), exact, [1, 2])})
    m = {"cpu": "x", "cores": 2, "torch": "2", "load_average_at_start": 0.1}
    report = {"machine": m, "compile_mode": "jit", "thread_counts": [1, 2], "usable_cores": 2}
    report.update(prompts=6, max_new_tokens=8, rows=rows)
    report["vllm"] = {"version": "v", "device": "cpu", "startup_s": {"plain": 30.0}}
    # as bench.json keeps it: the thread counts become strings
    text = bench_vllm.render(json.loads(json.dumps(report)), "make bench")
    assert bench_vllm.SETTINGS_HEADER in text and bench_vllm.RATIOS_HEADER in text
    assert f"| 16 | 1 | {draft} (not exact) |" in text and f"| 16 | 0 | {draft} |" in text
    assert "| 16 | 1 | 2 threads | target-only |" in text  # the best exact mode at T = 1
    assert "| 16 | 0 | 2 threads | draft_model K = 4 |" in text
    assert "| auto ≥ 1.2x its own K = 0, rounds only | 16 | 1 | 1 thread | 4.00x" in text
    assert "Engine start-up, to the first request (s): plain 30." in text


def test_verdict_tells_every_rotation_from_the_median_from_a_miss():
    def s(lo, med, hi):
        return {"min": lo, "median": med, "max": hi}

    assert bench_vllm.verdict(s(1.5, 1.6, 1.7), 1.5) == "yes (every rotation)"
    assert bench_vllm.verdict(s(1.4, 1.5, 1.7), 1.5) == "yes (median; not every rotation)"
    assert bench_vllm.verdict(s(1.2, 1.49, 1.7), 1.5) == "no"


def test_the_all_cores_decoder_is_a_second_decoder_on_the_same_models(monkeypatch):
    from minispec.decode import SpeculativeDecoder

    target = GPT(
        GPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=16, mlp_hidden=32, max_seq_len=32)
    )
    decoder = SpeculativeDecoder(target, target, compile=False, eos_token_id=3)
    monkeypatch.setattr(bench_vllm, "usable_cores", lambda: 2)
    decoders = bench_vllm.decoders_per_thread_count(decoder, 1)
    assert list(decoders) == [1, 2] and decoders[1] is decoder
    other = decoders[2]
    assert other is not decoder and other.target is target and other.eos_token_id == 3
    monkeypatch.setattr(bench_vllm, "usable_cores", lambda: 1)
    assert bench_vllm.decoders_per_thread_count(decoder, 1) == {1: decoder}


def test_minispec_runs_its_rounds_on_the_settings_thread_count(monkeypatch):
    seen = []

    class Decoder:
        def generate(self, prompts, params, spec):
            from types import SimpleNamespace

            seen.append((torch.get_num_threads(), len(prompts), spec.num_speculative_tokens))
            stats = DecodeStats(spec.num_speculative_tokens, time_round=0.5)
            return SimpleNamespace(token_ids=[[7, 8]] * len(prompts), stats=stats)

    before = torch.get_num_threads()
    setting = bench_vllm.minispec_setting("auto", 2)
    r = bench_vllm.minispec_run(Decoder(), [[1], [2], [3]], setting, 0.0, 2, 0, batch=False)
    assert seen == [(2, 1, "auto")] * 3  # B = 1: one request after another
    assert r["rounds_s"] == pytest.approx(1.5) and bench_vllm.tokens(r) == 6
    assert torch.get_num_threads() == before


def test_the_check_writes_its_table_and_fails_on_a_greedy_difference(tmp_path, monkeypatch):
    """main() end to end with the engines stubbed: one table row per engine, the per-sample
    scores beside it, exit 0 when every greedy run equals minispec K = 0, 1 when one differs."""
    from benchmarks import vllm_check

    def fake_minispec(decoder, prompts, sampled, max_new, k):
        run = {
            "greedy": [[65] * max_new for _ in prompts],
            "sampled": [[66] * max_new] * len(sampled),
        }
        return {"K = 0": run, f"K = {k}": run}

    def fake_vllm(args, folder, prompts, sampled, bad=None):
        modes, max_new = args.modes, args.max_new_tokens
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


def test_measure_rotates_every_setting_and_sends_vllm_no_seed(monkeypatch, tmp_path):
    """measure() end to end with the engines stubbed and a tiny eager decoder per thread count:
    each point runs every setting once per rotation, warms each decoder on its own thread
    count, hands vLLM no seed, and scores the vLLM samples at T > 0 only."""
    from types import SimpleNamespace

    from minispec.decode import SpeculativeDecoder

    class Engine:
        def __init__(self):
            self.seeds, self.running = [], False

        def resume(self):
            self.running = True

        def pause(self):
            self.running = False

        def generate(self, prompts, temperature, max_new, seed, batch):
            assert self.running  # only a resumed engine is asked
            self.seeds.append(seed)
            return {"token_ids": [[65] * max_new for _ in prompts], "wall_s": 1.0, "cpu_s": 2.0}

    torch.manual_seed(0)
    target = GPT(
        GPTConfig(vocab_size=258, n_layer=1, n_head=2, d_model=16, mlp_hidden=32, max_seq_len=32)
    )
    decoders = {t: SpeculativeDecoder(target, target, compile=False) for t in (1, 2)}
    warmed = []
    monkeypatch.setattr(
        bench_vllm,
        "warm_up",
        lambda d, prompts, specs, t: warmed.append((d, torch.get_num_threads(), len(specs))),
    )
    monkeypatch.setattr(bench_vllm, "BATCH_SIZES", (2, 1))
    engines = {"plain": Engine(), "draft_model": Engine()}
    seen = []
    args = SimpleNamespace(temperatures=[0.0, 1.0], max_new_tokens=3, rotations=2)
    rows = bench_vllm.measure(decoders, engines, ["ab", "cd"], args, lambda r: seen.append(len(r)))
    assert seen == [1, 2, 3, 4] and [(r["B"], r["temperature"]) for r in rows] == [
        (2, 0.0),
        (1, 0.0),
        (2, 1.0),
        (1, 1.0),
    ]
    assert [(d is decoders[t], t, n) for d, t, n in warmed] == [(True, 1, 2), (True, 2, 2)] * 4
    # 4 points x 2 rotations; B = 1 sends both prompts in one job (one request at a time)
    assert all(e.seeds == [None] * 8 for e in engines.values())
    for r in rows:
        assert len(r["settings"]) == 6 and set(r["minispec"]) == {1, 2}
        assert bool(r["sample_scores"]) == (r["temperature"] > 0)
    assert rows[2]["best_exact_vllm"] == "vLLM target-only"
