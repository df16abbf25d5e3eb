"""The loss curve of a training run: held-out bits per byte against bytes seen.

Read from the JSON-lines logs that `minispec train` writes beside its state
(runs/<preset>/<role>.log.jsonl). A PNG when matplotlib is installed (`pip install -e .[plot]`),
a text chart otherwise, so that every run leaves a curve a person can read.
"""

from __future__ import annotations

import json
from pathlib import Path

ROLES = ("target", "draft")


def read_points(state_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """(bytes seen, held-out bits/byte) per role, from the records that carry a held-out figure."""
    points: dict[str, list[tuple[int, float]]] = {}
    for role in ROLES:
        path = state_dir / f"{role}.log.jsonl"
        if path.is_file():
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            points[role] = [
                (r["bytes_seen"], r["heldout_bpb"])
                for r in records
                if r.get("heldout_bpb") is not None
            ]
    return {role: pts for role, pts in points.items() if pts}


def text_chart(
    points: dict[str, list[tuple[int, float]]], width: int = 60, height: int = 16
) -> str:
    """A plain-text scatter: rows are bits/byte (high at the top), columns are bytes seen."""
    everything = [p for pts in points.values() for p in pts]
    max_x = max(x for x, _ in everything)
    lo, hi = min(y for _, y in everything), max(y for _, y in everything)
    grid = [[" "] * width for _ in range(height)]
    for role, pts in points.items():
        for x, y in pts:
            col = min(width - 1, round(x / max_x * (width - 1)))
            row = 0 if hi == lo else round((hi - y) / (hi - lo) * (height - 1))
            grid[row][col] = role[0].upper()
    lines = [
        f"{hi - (hi - lo) * i / (height - 1):6.3f} |{''.join(row)}" for i, row in enumerate(grid)
    ]
    lines.append(" " * 7 + "+" + "-" * width)
    lines.append(f"{'':8}0{'bytes seen':^{width - 12}}{max_x / 1e6:.1f}M")
    lines.append("held-out bits/byte; T = target, D = draft")
    return "\n".join(lines)


def write_curve(state_dir: Path, out_dir: Path) -> Path | None:
    """Write out_dir/loss_curve.png (or .txt without matplotlib); None when there is no log."""
    points = read_points(state_dir)
    if not points:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        path = out_dir / "loss_curve.txt"
        path.write_text(text_chart(points) + "\n")
        return path
    fig, ax = plt.subplots(figsize=(6, 4))
    for role, pts in points.items():
        ax.plot([x / 1e6 for x, _ in pts], [y for _, y in pts], marker=".", label=role)
    ax.set_xlabel("bytes seen (millions)")
    ax.set_ylabel("held-out bits per byte")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out_dir / "loss_curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
