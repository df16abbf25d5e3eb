"""A package's weights go onto huge pages (minispec/compilation/huge_pages.py): memory mapped
inside new_memory_on_huge_pages is backed by 2 MB pages afterwards, and memory mapped outside
it is not. Checked in /proc/self/smaps, where the kernel reports each mapping's huge pages, on
a tensor the size of a package's weights (malloc maps it on its own, as the loader's copy)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from minispec.compilation import huge_pages

SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
if not SETTING.exists() or "[madvise]" not in SETTING.read_text():
    # "never": nothing can be asked; "always": the power check below cannot tell.
    pytest.skip("transparent huge pages are not on 'madvise' here", allow_module_level=True)


def huge_bytes_at(address: int) -> int:
    """AnonHugePages of the mapping that holds `address`, in bytes."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


def weights_sized_tensor() -> torch.Tensor:
    return torch.ones(48 << 18)  # 48 MB of float32, about the shipped target's weights


def test_memory_mapped_inside_is_on_huge_pages() -> None:
    with huge_pages.new_memory_on_huge_pages():
        weights = weights_sized_tensor()
    assert huge_bytes_at(weights.data_ptr()) >= 16 * huge_pages.HUGE_PAGE
    assert weights.sum().item() == weights.numel()  # moved, not changed


def test_memory_mapped_outside_is_not() -> None:
    """The power check: without the advice this machine maps small pages."""
    weights = weights_sized_tensor()
    assert huge_bytes_at(weights.data_ptr()) == 0
