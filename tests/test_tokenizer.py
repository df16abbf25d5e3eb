"""The byte tokenizer: any text round-trips, invalid UTF-8 never crashes, specials are dropped."""

from __future__ import annotations

import pytest

from model import tokenizer
from model.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, VOCAB_SIZE, decode, encode


@pytest.mark.parametrize(
    "text",
    [
        "",
        "def f(x):\n    return x + 1\n",
        "안녕하세요, 세계",
        "snake 🐍 and family 👨‍👩‍👧",  # 4-byte code points and a ZWJ sequence
        "\x00\x7f mixed ünïcödé",
    ],
)
def test_round_trip(text: str) -> None:
    assert decode(encode(text)) == text
    assert decode(encode(text, bos=False)) == text


def test_ids_are_the_utf8_bytes() -> None:
    assert encode("A") == [BOS_TOKEN_ID, 65]
    assert encode("안", bos=False) == list("안".encode("utf-8")) == [0xEC, 0x95, 0x88]
    assert all(0 <= i < VOCAB_SIZE for i in encode("안녕 🐍"))


@pytest.mark.parametrize(
    "ids, expected",
    [
        ([0xFF, 0xFE], "\ufffd\ufffd"),  # bytes that never occur in UTF-8
        ([0xEC, 0x95], "\ufffd"),  # a Korean syllable cut after 2 of its 3 bytes
        ([104, 0x80, 105], "h\ufffdi"),  # a lone continuation byte between ASCII
        ([0xF0, 0x9F, 0x90], "\ufffd"),  # a truncated emoji
    ],
)
def test_invalid_utf8_decodes_with_replacement(ids: list[int], expected: str) -> None:
    assert decode(ids) == expected


def test_specials_are_dropped_by_decode() -> None:
    ids = [
        BOS_TOKEN_ID,
        *encode("hi", bos=False),
        EOS_TOKEN_ID,
        BOS_TOKEN_ID,
        *encode("안", bos=False),
    ]
    assert decode(ids) == "hi안"
    # A special between the bytes of one character does not break it: decode sees only bytes.
    a, b, c = encode("안", bos=False)
    assert decode([a, EOS_TOKEN_ID, b, c]) == "안"


def test_describe_names_the_specials() -> None:
    assert tokenizer.describe() == {"kind": "bytes", "vocab_size": 258, "bos": 256, "eos": 257}
