"""The commands behind `python -m minispec <command>`: tools built on the library.

The library never imports them.

The library (`import minispec`) is the decode loop and what it needs: params, stats, the
API. Everything here (CLI, training, benchmarks, verification, kernel listing) imports the
library; nothing in the library imports a command.
"""
