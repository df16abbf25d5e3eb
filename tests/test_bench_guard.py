"""The speed guard (benchmarks/guard.py): its rule and its reference on hand-made guard.json
dicts, and its measurement through the harness's rotations on a tiny eager pair."""

from __future__ import annotations

import pytest
from _enumerate import one_thread, perturbed_copy, random_gpt  # noqa: F401 (one_thread: a fixture)


def guard_run(speedups: dict[str, tuple[float, float, float]]) -> dict:
    """A guard.json dict with a setting per item: its name, and (median, min, max)."""
    settings = {
        name: {
            "temperature": 0.0,
            "K": name.removeprefix("T=0 K="),
            "speedup": {"median": m, "min": lo, "max": hi},
            "pairs": 6,
            "tokens_per_s": 100.0,
            "alpha": 0.9,
        }
        for name, (m, lo, hi) in speedups.items()
    }
    return {
        "command": "make bench-guard",
        "machine": {"cpu": "a CPU", "cores": 2, "torch": "2.13.0"},
        "threads": 1,
        "prompts": 4,
        "max_new_tokens": 96,
        "pairs": 6,
        "compile_mode": "aot",
        "wall_s": 1.0,
        "graphs_s": 0.5,
        "settings": settings,
    }


def test_the_guard_flags_a_fall_beyond_both_spreads_and_nothing_within_them() -> None:
    """FELL is new max < reference min. K = 4 fell clearly. K = 8's new median is below the
    reference's min and its max below the reference's median, yet the two intervals overlap:
    the runs' spread allows it, so a rule on the medians, or on the new median against the
    reference's min, would be wrong. At auto the new max equals the reference's min: they
    touch, which is an overlap too."""
    from benchmarks.guard import compare

    reference = guard_run(
        {
            "T=0 K=4": (2.40, 2.20, 2.60),
            "T=0 K=8": (2.40, 2.20, 2.60),
            "T=0 K=auto": (2.00, 1.90, 2.10),
        }
    )
    new = guard_run(
        {
            "T=0 K=4": (1.60, 1.50, 1.70),
            "T=0 K=8": (2.10, 1.90, 2.25),
            "T=0 K=auto": (1.88, 1.85, 1.90),
            "T=0 K=2": (1.00, 0.50, 1.50),
        }
    )
    lines = {line["setting"]: line for line in compare(reference, new)}
    assert {name: line["fell"] for name, line in lines.items()} == {
        "T=0 K=4": True,
        "T=0 K=8": False,
        "T=0 K=auto": False,
        "T=0 K=2": False,  # no reference: nothing to fall from
    }
    assert lines["T=0 K=2"]["reference"] is None
    assert not any(line["fell"] for line in compare(None, new))


def test_the_guard_keeps_its_reference_unless_told(tmp_path, monkeypatch) -> None:
    """A run that fell exits 1 and leaves the reference as it was; --update writes the run as
    the new reference (and its table) and exits 0; with no reference the first run becomes it."""
    import json

    from benchmarks import guard

    path = tmp_path / "guard.json"

    def kept_min() -> float:
        return json.loads(path.read_text())["settings"]["T=0 K=4"]["speedup"]["min"]

    monkeypatch.setattr(guard, "measure", lambda pairs: guard_run({"T=0 K=4": (2.4, 2.2, 2.6)}))
    assert guard.main(["--reference", str(path)]) == 0
    assert kept_min() == 2.2
    assert "| 0 | 4 | 2.40x (2.20-2.60) | 6 |" in path.with_suffix(".md").read_text()
    monkeypatch.setattr(guard, "measure", lambda pairs: guard_run({"T=0 K=4": (1.6, 1.5, 1.7)}))
    assert guard.main(["--reference", str(path)]) == 1
    assert kept_min() == 2.2
    assert guard.main(["--reference", str(path), "--update"]) == 0
    assert kept_min() == 1.5


@pytest.mark.usefixtures("one_thread")
def test_the_guard_measures_through_the_harness_rotations(monkeypatch) -> None:
    """measure() on a tiny eager pair: a setting per (T, K) of SETTINGS, each with one speedup
    per rotation over the K = 0 run of the same rotation."""
    import minispec.api
    import minispec.commands.prompts
    from benchmarks import guard
    from minispec.decode import SpeculativeDecoder
    from model.tokenizer import VOCAB_SIZE

    target = random_gpt(VOCAB_SIZE, 0, scale=1.5, max_seq_len=32)
    decoder = SpeculativeDecoder(target, perturbed_copy(target, 1, 0.15), compile=False)
    monkeypatch.setattr(minispec.api, "load_decoder", lambda **kwargs: decoder)
    monkeypatch.setattr(minispec.commands.prompts, "held_out_prompts", lambda n: ["ab"])
    monkeypatch.setattr(guard, "MAX_NEW_TOKENS", 3)
    report = guard.measure(2)
    assert list(report["settings"]) == [guard.setting_name(t, k) for t, k in guard.SETTINGS]
    for row in report["settings"].values():
        s = row["speedup"]
        assert row["pairs"] == 2 and 0 < s["min"] <= s["median"] <= s["max"]
    assert guard.is_reference(report)
