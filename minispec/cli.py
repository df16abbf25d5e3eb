"""`python -m minispec <command>`: the terminal front end (temporary dispatcher, grows with the loop)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command == "train":
        from minispec.train import main as train_main
        return train_main(rest)
    print("usage: python -m minispec {train} ...", file=sys.stderr)
    return 2
