"""The benchmarks and the comparisons with other engines: tools that measure the library.

They live beside the library, not in it: nothing in minispec/, model/ or sampling/ imports them,
and they are not installed with the package. Run them from the repository root (the Makefile's
bench targets); they write into results/. harness.py is the one benchmark of decoding speed;
the guard, the GPU check and the vLLM part time through its decoding.py, steps.py and timing.py.
"""
