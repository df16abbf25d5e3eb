"""The benchmarks and the comparisons with other engines: tools that measure the library.

They live beside the library, not in it: nothing in minispec/, model/ or sampling/ imports them,
and they are not installed with the package. Run them from the repository root (`make bench`,
`python -m benchmarks`, `make vllm-check`); they write into results/. The one-off studies behind
docs/vllm.md and docs/algorithm.md are in experiments/.
"""
