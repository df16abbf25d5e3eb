"""Byte-level tokenizer: token i < 256 is the byte i; two special ids follow.

Bytes need no training, cover every language (Korean is just 3 bytes per syllable) and make the
vocabulary tiny, so the output head costs almost nothing on a CPU.
"""

from __future__ import annotations

BOS_TOKEN_ID = 256  # starts every document during training and every prompt at decode time
EOS_TOKEN_ID = 257  # ends every training document; generation stops when a row emits it
VOCAB_SIZE = 258
# A parallel drafter's "token not known yet" (PARD's mask token): the byte 0xFF, which UTF-8
# text never contains, so it sits inside the shared vocabulary without standing for any text.
MASK_TOKEN_ID = 0xFF


def encode(text: str, *, bos: bool = True) -> list[int]:
    """UTF-8 bytes of `text`, optionally preceded by BOS."""
    ids = list(text.encode("utf-8"))
    return [BOS_TOKEN_ID, *ids] if bos else ids


def decode(ids: list[int]) -> str:
    """Inverse of encode. Special ids are dropped; invalid UTF-8 becomes U+FFFD, never an error."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def describe() -> dict[str, int | str]:
    """What a checkpoint records about the tokenizer: a mismatched pair is caught at load time."""
    return {"kind": "bytes", "vocab_size": VOCAB_SIZE, "bos": BOS_TOKEN_ID, "eos": EOS_TOKEN_ID}
