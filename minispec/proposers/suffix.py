"""A suffix index over a corpus, in the spirit of REST and SuffixDecoding: find the longest match
of a row's recent context in the corpus and propose the most frequent continuation.

Structure: a suffix array of the *reversed* corpus, sorted by its first DEPTH bytes (two 8-byte
big-endian keys, np.lexsort). Reversed, the occurrences of the last m context tokens form one
contiguous range, nested inside the range of the last m - 1: every match length is found at once
by np.searchsorted on the sorted keys, and the longest non-empty range wins. Its occurrences are
followed forwards in the corpus, and the continuation is chosen greedily, token by token, as the
most frequent next byte among the occurrences that agree so far (SuffixDecoding's greedy path);
at most SAMPLE evenly spaced occurrences are read, which is an unbiased picture of a large range.

It runs on the host (numpy): the index holds 21 bytes per corpus byte (the corpus, its int32
order and two uint64 keys), which a device need not hold. The caller passes each row's recent
tokens, which the loop already has on the host from the round's one read, so the lookup adds
no device-to-host sync.

Tokens are bytes plus BOS and EOS (256 and 257); in the index they become 255 and 254, bytes that
never occur in UTF-8 text (building refuses a corpus that has them). A request byte 254 or 255
would match a document boundary: a worse proposal, never a wrong output.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minispec.proposers.proposal import Proposal
from minispec.state import LoopState
from model.checkpoint import atomic_write
from model.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID
from sampling import PLACEHOLDER_TOKEN_ID

DEPTH = 16  # bytes of context a match can use: two uint64 keys
SAMPLE = 256  # occurrences read to choose a continuation
SPECIAL = {BOS_TOKEN_ID: 255, EOS_TOKEN_ID: 254}


def to_bytes(tokens: np.ndarray) -> np.ndarray:
    out = tokens.astype(np.int64)
    for token, byte in SPECIAL.items():
        out = np.where(out == token, byte, out)
    return out.astype(np.uint8)


def from_bytes(data: np.ndarray) -> np.ndarray:
    out = data.astype(np.int64)
    for token, byte in SPECIAL.items():
        out = np.where(data == byte, token, out)
    return out


def pack(data: np.ndarray, offset: int) -> np.ndarray:
    """Big-endian uint64 of data[i + offset : i + offset + 8] for every i (zeros past the end),
    so that comparing keys compares bytes in order."""
    padded = np.concatenate([data, np.zeros(offset + 8, np.uint8)])
    key = np.zeros(len(data), np.uint64)
    for j in range(8):
        key = (key << np.uint64(8)) | padded[offset + j : offset + j + len(data)].astype(np.uint64)
    return key


def read_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The corpus and suffix array saved at `path`, checked to be a suffix index's."""
    try:
        with np.load(path, allow_pickle=False) as f:
            corpus, order = f["corpus"], f["order"]
    except FileNotFoundError:
        raise ValueError(f"{path}: no suffix index there") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a suffix index ({exc or type(exc).__name__})") from None
    if not (
        corpus.dtype == np.uint8
        and order.dtype == np.int32
        and corpus.ndim == order.ndim == 1
        and 0 < len(corpus) == len(order)
        and 0 <= order.min()
        and order.max() < len(order)
    ):
        raise ValueError(
            f"{path}: not a suffix index (arrays of {corpus.dtype} {corpus.shape} and "
            f"{order.dtype} {order.shape})"
        )
    return corpus, order


@dataclass(slots=True)
class SuffixIndex:
    corpus: np.ndarray  # uint8, the corpus in index bytes, padded at the end
    order: np.ndarray  # int32 suffix array of the reversed corpus
    keys: tuple[np.ndarray, np.ndarray]  # the sorted keys, bytes 0-7 and 8-15 of each suffix
    min_match: int = 4  # shorter matches propose nothing

    def __post_init__(self) -> None:
        if not (isinstance(self.min_match, int) and 1 <= self.min_match <= DEPTH):
            raise ValueError(f"min_match must be an int in [1, {DEPTH}], got {self.min_match!r}")

    @classmethod
    def build(cls, tokens: np.ndarray | torch.Tensor, min_match: int = 4) -> "SuffixIndex":
        data = np.asarray(tokens, dtype=np.int64)
        if data.ndim != 1 or not len(data):
            raise ValueError(
                f"corpus must be a non-empty 1-d token sequence, got shape {data.shape}"
            )
        if ((data >= 254) & (data < 256)).any():
            raise ValueError("corpus has bytes 254 or 255, which the index uses for BOS and EOS")
        # A document boundary first: a match can then never run on into the keys' zero padding.
        corpus = to_bytes(np.concatenate([[EOS_TOKEN_ID], data]))
        reversed_corpus = corpus[::-1].copy()
        first, second = pack(reversed_corpus, 0), pack(reversed_corpus, 8)
        order = np.lexsort((second, first)).astype(np.int32)
        return cls(corpus, order, (first[order], second[order]), min_match)

    def save(self, path: str | Path) -> None:
        """Atomically, like a checkpoint: an interrupted build leaves no half-written index for
        the next run to trip over."""
        buffer = io.BytesIO()
        np.savez(buffer, corpus=self.corpus, order=self.order)
        atomic_write(Path(path), buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path, min_match: int = 4) -> "SuffixIndex":
        """The index saved at `path`; ValueError naming the file when it is not one (cut
        short, empty, another program's .npz), never a wrong index."""
        corpus, order = read_arrays(Path(path))
        reversed_corpus = corpus[::-1].copy()
        keys = (pack(reversed_corpus, 0)[order], pack(reversed_corpus, 8)[order])
        return cls(corpus, order, keys, min_match)

    def longest_match(self, context: np.ndarray) -> tuple[int, int, int]:
        """(length, lo, hi): the most context tokens (up to DEPTH, last token first) that occur in
        the corpus, and the range of sorted suffixes where they do."""
        pattern = to_bytes(context[::-1][:DEPTH])
        lo, hi, length = 0, len(self.order), 0
        for word, key in enumerate(self.keys):
            part = pattern[8 * word : 8 * word + 8]
            if not len(part):
                break
            # prefix m of this word, m = 1..len(part): every key in [low_m, high_m] starts so
            shifts = np.uint64(8) * (7 - np.arange(8, dtype=np.uint64))
            value = np.cumsum(part.astype(np.uint64) << shifts[: len(part)], dtype=np.uint64)
            free = np.uint64(2) ** (shifts[: len(part)]) - np.uint64(1)  # the bytes left open
            found = key[lo:hi]
            starts = lo + np.searchsorted(found, value, "left")
            ends = lo + np.searchsorted(found, value | free, "right")
            hit = np.flatnonzero(ends > starts)
            if not len(hit):
                break
            m = hit[-1]  # ranges nest, so the hits are a prefix: take the longest
            lo, hi, length = int(starts[m]), int(ends[m]), 8 * word + m + 1
            if m < 7:
                break
        return length, lo, hi

    def continuation(self, lo: int, hi: int, k: int) -> np.ndarray:
        """The greedy most frequent k-token path after the occurrences in [lo, hi)."""
        count = min(hi - lo, SAMPLE)
        picks = self.order[lo + np.arange(count) * (hi - lo) // count]  # evenly spaced
        # reversed suffix i ends (forwards) at corpus[n - 1 - i]; what follows starts at n - i
        start = len(self.corpus) - picks.astype(np.int64)
        follow = self.corpus[np.minimum(start[:, None] + np.arange(k), len(self.corpus) - 1)]
        alive = np.ones(len(picks), bool)
        out = np.empty(k, np.uint8)
        for j in range(k):
            out[j] = np.bincount(follow[alive, j], minlength=256).argmax()
            alive &= follow[:, j] == out[j]
        return from_bytes(out)

    def propose_rows(self, contexts: list[np.ndarray], k: int) -> Proposal:
        """contexts: each row's recent tokens (DEPTH are enough), oldest first."""
        ids = np.full((len(contexts), k), PLACEHOLDER_TOKEN_ID, np.int64)
        num = np.zeros(len(contexts), np.int64)
        for b, context in enumerate(contexts):
            length, lo, hi = self.longest_match(np.asarray(context))
            if length >= self.min_match:
                ids[b], num[b] = self.continuation(lo, hi, k), k
        return Proposal(torch.from_numpy(ids), torch.from_numpy(num))


class SuffixProposer:
    """The suffix index as a proposer, looked up on the host (a HostProposer): the loop puts
    each round's lookup in the state, where `propose` reads it inside the round."""

    def __init__(self, index: SuffixIndex) -> None:
        self.index = index

    def propose(self, state: LoopState, num_speculative_tokens: int, *args) -> Proposal:
        return state.proposer_state

    def host_propose(self, histories: list[list[int]], k: int) -> Proposal:
        """histories: each row's tokens so far (prompt and output); a Proposal on the host."""
        return self.index.propose_rows([np.asarray(h[-DEPTH:]) for h in histories], k)
