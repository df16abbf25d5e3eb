"""minispec: exact speculative decoding in plain PyTorch, compiled by torch.compile.

    import minispec
    out = minispec.generate(["def fib(n):"], num_speculative_tokens=4, temperature=0)
    print(out.texts[0], out.stats.summary())

Names are imported lazily, so `python -m minispec train` does not load the decoder and sampler.
"""

from importlib import import_module

_EXPORTS = {
    "generate": "minispec.api",
    "load_decoder": "minispec.api",
    "GenerateResult": "minispec.api",
    "SpeculativeDecoder": "minispec.decode",
    "GenerationOutput": "minispec.decode",
    "SamplingParams": "minispec.params",
    "SpeculativeConfig": "minispec.params",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'minispec' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
