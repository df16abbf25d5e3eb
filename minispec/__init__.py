"""minispec: exact speculative decoding in plain PyTorch, compiled by torch.compile.

    import minispec
    out = minispec.generate(["def fib(n):"], num_speculative_tokens=4, temperature=0)
    print(out.texts[0], out.stats.summary())
"""
from minispec.api import GenerateResult, generate, load_decoder
from minispec.decode import GenerationOutput, SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig

__all__ = ["GenerateResult", "GenerationOutput", "SamplingParams", "SpeculativeConfig", "SpeculativeDecoder",
           "generate", "load_decoder"]
