"""Wiring between the decoder, the models it runs and the Hugging Face folders they come from.

- After a decode, a plain full forward `target(tokens)` ignores the cache the decoder left.
- The decoder stops at the target's own EOS id: generation_config.json's, else config.json's,
  the first of a list; none means max_new_tokens only.
- `decode --target DIR --draft DIR` with a folder's own (non-byte) tokenizer encodes the
  prompt and decodes the output with it, streamed text equal to the --json text.
- `minispec.generate` validates a request once: each SamplingParams and the SpeculativeConfig
  in SpeculativeDecoder's check, not again in the API.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
import torch
from _enumerate import one_thread, random_gpt  # noqa: F401 (one_thread: a fixture)

import minispec
from minispec.api import load_decoder
from minispec.commands.cli import main
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from model.head import FeatureHead
from model.hf import export_folder

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 259  # the bytes, one merge ("ab" = 256), then BOS 257 and EOS 258
BOS, EOS = 257, 258
PROMPT = [1, 5, 6, 7]


def test_full_forward_after_generate_ignores_the_cache() -> None:
    target, draft = random_gpt(64, seed=0, max_seq_len=32), random_gpt(64, seed=1, max_seq_len=32)
    fresh = copy.deepcopy(target)
    params = [SamplingParams(temperature=1.0, seed=i, max_new_tokens=6) for i in range(2)]
    SpeculativeDecoder(target, draft, compile=False).generate(
        [PROMPT, PROMPT[:2]], params, SpeculativeConfig(3)
    )
    assert target.blocks[0].attn.kv_cache is not None  # the decoder keeps it for its next call
    tokens = torch.randint(64, (3, 20), generator=torch.Generator().manual_seed(0))  # B != 2
    with torch.no_grad():
        torch.testing.assert_close(target(tokens), fresh(tokens), rtol=0, atol=0)


def test_the_api_validates_a_request_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted: one SamplingParams.validate per request and one SpeculativeConfig.validate per
    call (the API validating them too, as well as the decoder, would count two of each)."""
    calls: list[str] = []
    for cls in (SamplingParams, SpeculativeConfig):
        validate = cls.validate

        def counted(self, _validate=validate, _name=cls.__name__) -> None:
            calls.append(_name)
            _validate(self)

        monkeypatch.setattr(cls, "validate", counted)
    target, draft = random_gpt(VOCAB, seed=0, max_seq_len=32), random_gpt(VOCAB, seed=1)
    decoder = SpeculativeDecoder(target, draft, compile=False)
    minispec.generate(["ab", "cd"], num_speculative_tokens=2, max_new_tokens=3, decoder=decoder)
    assert sorted(calls) == ["SamplingParams", "SamplingParams", "SpeculativeConfig"]


def greedy(decoder: SpeculativeDecoder, n: int = 12) -> list[int]:
    params = [SamplingParams(temperature=0.0, max_new_tokens=n)]
    return decoder.generate([PROMPT], params, SpeculativeConfig(2)).token_ids[0]


def folder_with_eos(path: Path, model, config_eos, generation_eos=None) -> Path:
    """`model` exported as a folder whose config.json (and, unless None, generation_config.json)
    give these eos_token_ids."""
    export_folder(model, path, with_tokenizer=False)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": config_eos}))
    generation = path / "generation_config.json"
    if generation_eos is None:
        generation.unlink()
    else:
        generation.write_text(json.dumps({"eos_token_id": generation_eos}))
    return path


def test_decoder_stops_at_the_targets_eos(tmp_path: Path) -> None:
    model = random_gpt(64, seed=2, max_seq_len=32)
    free = greedy(SpeculativeDecoder(model, model, compile=False, eos_token_id=None))
    assert len(free) == 12
    stop = free[4]
    end = free.index(stop) + 1  # the first time the target emits it
    cases = {
        "config": (stop, None, False),
        "list": ([stop, 1], None, True),
        "generation config first": (63 - stop, [stop, 1], True),
    }
    for name, (config_eos, generation_eos, several) in cases.items():
        folder = folder_with_eos(tmp_path / name, model, config_eos, generation_eos)
        with (
            pytest.warns(UserWarning, match="stops only at the first")
            if several
            else contextlib.nullcontext()
        ):
            decoder = load_decoder(folder, folder, compile=False)
        assert decoder.eos_token_id == stop, name
        assert greedy(decoder) == free[:end], name
    none = folder_with_eos(tmp_path / "none", model, None)
    assert greedy(load_decoder(none, none, compile=False)) == free
    bad = folder_with_eos(tmp_path / "bad", model, 64)
    with pytest.raises(ValueError, match="eos_token_id 64 is outside the vocabulary"):
        load_decoder(bad, bad, compile=False)


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose tokenizer.json is not the byte one: bytes plus the merge "ab" = 256."""
    tokenizers = pytest.importorskip("tokenizers")
    from model.hf_tokenizer import byte_to_char

    table = byte_to_char()
    tok = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab={**{c: b for b, c in table.items()}, "ab": 256}, merges=[("a", "b")]
        )
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens(
        [tokenizers.AddedToken("<s>", special=True), tokenizers.AddedToken("</s>", special=True)]
    )
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS)]
    )
    folder = folder_with_eos(
        tmp_path_factory.mktemp("bpe") / "pair", random_gpt(VOCAB, seed=3, max_seq_len=64), EOS
    )
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_cli_decodes_with_the_folders_tokenizer(
    bpe_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    from model.hf_tokenizer import load_tokenizer

    tok = load_tokenizer(bpe_folder)
    prompt = "ab, naïve"
    argv = [
        "decode",
        "--target",
        str(bpe_folder),
        "--draft",
        str(bpe_folder),
        "--prompt",
        prompt,
        "--no-compile",
        "-k",
        "2",
        "--temperature",
        "1",
        "--seed",
        "3",
        "--max-new-tokens",
        "24",
    ]
    assert main([*argv, "--json"]) == 0
    request = json.loads(capsys.readouterr().out)["requests"][0]
    ids = request["token_ids"]
    assert request["text"] == tok.decode(ids)
    assert main(argv) == 0  # streamed: the same text, re-decoded as tokens arrive
    assert capsys.readouterr().out == prompt + request["text"] + "\n"
    # The prompt went through the folder's tokenizer ("ab" is one token there, two bytes in
    # minispec's): the API given that tokenizer decodes the same tokens.
    decoder = load_decoder(str(bpe_folder), str(bpe_folder), "cpu", False)
    out = minispec.generate(
        [prompt],
        decoder=decoder,
        tokenizer=tok,
        temperature=1.0,
        seed=3,
        max_new_tokens=24,
        num_speculative_tokens=2,
    )
    assert out.token_ids[0] == ids and tok.encode(prompt)[:2] == [BOS, 256]


def test_the_shipped_head_is_read_when_first_asked_for() -> None:
    """load_decoder leaves the shipped head on disk until a call, or a benchmark through
    feature_head(), asks for it; a decoder given none has none."""
    decoder = load_decoder(compile=False)
    assert decoder.head is None
    assert isinstance(decoder.feature_head(), FeatureHead)
    assert decoder.feature_head() is decoder.head  # read once
    target = decoder.target
    assert SpeculativeDecoder(target, decoder.draft, compile=False).feature_head() is None
