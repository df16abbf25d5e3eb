"""A loaded package's weights on 2 MB pages: one page-table entry where 512 small pages would be.

Each AOTInductor package carries its own copy of the weights (freezing bakes them in), which
its loader copies into memory it mallocs: small pages, wherever the allocator finds them. On
this project's 2-core VM where those pages land moves a round's speed by up to 18 %: six loads
of the same K = 4 round, timed in turns in one process, take 5.6 to 6.7 ms a round. Each method
of the benchmark runs its own package, so on small pages each row draws its own factor and two
runs of `make bench` disagree by as much. On huge pages the same six loads take 5.1 to 5.3 ms.

Linux only, and only where transparent huge pages are not switched off ("madvise" is the usual
setting, which is why the memory must ask): elsewhere nothing happens.
"""

from __future__ import annotations

import ctypes
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # back this range with huge pages from now on (khugepaged, in time)
MADV_COLLAPSE = 25  # and collapse what is already there, now (Linux 6.1)


def anonymous_regions() -> set[tuple[int, int]]:
    """(start, end) of the process's anonymous mappings of a huge page or more (none off
    Linux). An anonymous line of /proc/self/maps has no sixth field, the file or [name]."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    regions = set()
    for line in lines:
        fields = line.split()
        if len(fields) == 5:
            start, end = (int(address, 16) for address in fields[0].split("-"))
            if end - start >= HUGE_PAGE:
                regions.add((start, end))
    return regions


@contextmanager
def new_memory_on_huge_pages() -> Iterator[None]:
    """The anonymous memory the body maps (a package's weights, which malloc maps on their own
    being over its threshold) moved onto huge pages: asked for, then collapsed in place. A
    region that merged with an older neighbour is moved whole, which is harmless."""
    if not sys.platform.startswith("linux"):
        yield
        return
    before = anonymous_regions()
    yield
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for start, end in anonymous_regions() - before:
        # Advice the kernel cannot take (THP "never", an old kernel) fails and changes nothing.
        madvise(start, end - start, MADV_HUGEPAGE)
        madvise(start, end - start, MADV_COLLAPSE)
