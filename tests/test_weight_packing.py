"""The ahead-of-time packages pack their weights for at least PACK_ROWS_AT_LEAST rows: oneDNN's
layout for one row makes the 1-token step slower than the 5-token verify (docs/benchmarks.md).
The hook sits inside Inductor's freezing pass, so these tests compile a real graph: a torch
whose freezing no longer calls the hook fails them instead of silently packing for one row."""

from __future__ import annotations

import pytest
import torch

from minispec.compilation import packages

mkldnn_fusion = pytest.importorskip("torch._inductor.fx_passes.mkldnn_fusion")
if not torch.backends.mkldnn.is_available():
    pytest.skip("no oneDNN: Inductor packs no weights", allow_module_level=True)


def rows_packed_for(monkeypatch: pytest.MonkeyPatch, least: int | None) -> list[int]:
    """The row counts Inductor's freezing packs a 1-row linear's weight for, with the rows
    raised to `least` (None: as Inductor chooses)."""
    seen: list[int] = []
    pack = mkldnn_fusion.CpuMkldnnDeviceOp.pack_linear_weight

    def recording(self, graph, is_lp_weight, transpose_weight_node, batch_size):
        seen.append(batch_size)
        return pack(self, graph, is_lp_weight, transpose_weight_node, batch_size)

    monkeypatch.setattr(mkldnn_fusion.CpuMkldnnDeviceOp, "pack_linear_weight", recording)
    linear = torch.nn.Linear(64, 96, bias=False).eval()
    x = torch.randn(1, 64)
    # Freezing is read outside torch.compile's `options`: patched around the call instead.
    with torch.no_grad(), torch._inductor.config.patch(freezing=True, fx_graph_cache=False):
        if least is None:
            out = torch.compile(linear)(x)
        else:
            with packages.packed_for_rows(least):
                out = torch.compile(linear)(x)
        torch.testing.assert_close(out, linear(x))  # packed for more rows, still exact
    torch._dynamo.reset()
    return seen


def test_a_one_row_linear_is_packed_for_more_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rows_packed_for(monkeypatch, packages.PACK_ROWS_AT_LEAST) == [
        packages.PACK_ROWS_AT_LEAST
    ]
    # The hook is Inductor's again once the package is built.
    assert mkldnn_fusion.CpuMkldnnDeviceOp.pack_linear_weight.__name__ == "recording"


def test_without_the_floor_inductor_packs_for_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The power check: the floor is what changes the rows, not Inductor's own choice."""
    assert rows_packed_for(monkeypatch, None) == [1]
