"""The commands behind `python -m minispec <command>`: tools built on the library, never imported by it.

The library (`import minispec`) is the decode loop and what it needs: params, rng, stats, the
API. Everything here (CLI, training, benchmarks, verification, kernel listing) imports the
library; nothing in the library imports a command.
"""
