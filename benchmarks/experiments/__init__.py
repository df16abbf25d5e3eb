"""One-off measurements behind docs/vllm.md and docs/algorithm.md: each prints a table.

python -m benchmarks.experiments.NAME [flags]   # from the repository root; see each docstring
"""
