"""Proposers: the n-gram matcher against a plain loop, its batch and compile behaviour, the
suffix index against a brute-force search, and the registry. (Exactness of decoding with
these proposals is the sampler's and the loop's job; here the question is whether each proposer
proposes what it says it does.)"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from _enumerate import one_thread  # noqa: F401 (a fixture, used by pytestmark)

from minispec.proposers import (
    PROPOSERS,
    DraftModelProposer,
    Held,
    HostProposer,
    NgramProposer,
    ngram_propose,
)
from minispec.proposers.ngram import ngram_match
from minispec.proposers.suffix import DEPTH, SAMPLE, SuffixIndex, SuffixProposer
from minispec.state import LoopState
from model.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, encode
from sampling import PLACEHOLDER_TOKEN_ID

pytestmark = pytest.mark.usefixtures("one_thread")


def batch(
    rows: list[list[int]], width: int = 64, fill: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.full((len(rows), width), fill, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
    return tokens, torch.tensor([len(r) for r in rows])


def reference(row: list[int], k: int, n_min: int, n_max: int) -> tuple[list[int], int]:
    """The rule as a plain loop: for n = n_max..n_min, the most recent earlier occurrence of the
    last n tokens; the copy continues with the period of the match (LZ77-style overlap)."""
    last = len(row) - 1
    for n in range(min(n_max, last), n_min - 1, -1):
        for end in range(last - 1, n - 2, -1):
            if row[end - n + 1 : end + 1] == row[last - n + 1 :]:
                out = list(row)
                for _ in range(k):  # copy one token at a time: the source may be what we just wrote
                    out.append(out[len(out) - (last - end)])
                return out[len(row) :], n
    return [PLACEHOLDER_TOKEN_ID] * k, 0


def test_a_prompt_that_repeats_itself_proposes_the_repeat() -> None:
    text = "    self.assertEqual(x, 1)\n    self.assertEqual(y, 2)\n    self.assert"
    tokens, seq_len = batch([encode(text)], width=128)
    state = LoopState.start(tokens, seq_len.tolist(), [1], [0], 8)
    p = NgramProposer().propose(state, 8, None)
    assert bytes(p.draft_token_ids[0].tolist()) == b"Equal(y,"  # the most recent occurrence
    assert p.num_draft_tokens.tolist() == [8] and p.draft_probs is None
    _, length = ngram_match(tokens, seq_len, 3, 16)
    assert length.tolist() == [16]  # "\n    self.assert" is 16 bytes: capped at n_max


def test_a_short_period_continues_past_the_known_tokens() -> None:
    tokens, seq_len = batch([encode("xyzabcab")])  # "ab" matched 3 back: period 3
    p = ngram_propose(tokens, seq_len, 7, n_min=2, n_max=4)
    assert bytes(p.draft_token_ids[0].tolist()) == b"cabcabc"
    assert ngram_match(tokens, seq_len, n_min=2, n_max=4)[1].tolist() == [2]


def test_no_match_proposes_nothing() -> None:
    tokens, seq_len = batch([encode("abcdefgh"), encode("abcab")])
    p = ngram_propose(tokens, seq_len, 4, n_min=3, n_max=8)  # row 1's "ab" is too short a match
    assert p.num_draft_tokens.tolist() == [0, 0]
    assert ngram_match(tokens, seq_len, n_min=3, n_max=8)[1].tolist() == [0, 0]
    assert (p.draft_token_ids == PLACEHOLDER_TOKEN_ID).all()


def test_only_the_rows_own_tokens_count() -> None:
    """Tokens past seq_len (stale output, padding) and other rows are never matched."""
    row = encode("hello world, hello")
    tokens, seq_len = batch([row, encode(" world, hello world, hello")], width=64)
    tokens[0, len(row) :] = torch.tensor(encode(" there, hello", bos=False) * 4)[: 64 - len(row)]
    p = ngram_propose(tokens, seq_len, 5, n_min=3, n_max=8)
    assert bytes(p.draft_token_ids[0].tolist()) == b" worl"
    alone = ngram_propose(*batch([row], width=32), 5, n_min=3, n_max=8)
    assert torch.equal(alone.draft_token_ids[0], p.draft_token_ids[0])


def random_rows(seed: int, count: int = 200) -> list[list[int]]:
    """Small alphabets make many matches of every length, near the start and the end; ids up
    to 2^40 in a few rows, so that a byte search that ignored token boundaries would err."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        length = int(torch.randint(1, 40, (), generator=gen))
        row = torch.randint(0, 3 + i % 3, (length,), generator=gen)
        rows.append((row * (2**40 + 1 if i % 4 == 3 else 1)).tolist())
    return rows


@pytest.mark.parametrize("n_min,n_max", [(1, 1), (2, 5), (3, 16)])
def test_matches_the_plain_loop_on_random_rows(n_min: int, n_max: int) -> None:
    rows = random_rows(n_max)
    tokens, seq_len = batch(rows, width=48, fill=1)
    p = ngram_propose(tokens, seq_len, 6, n_min, n_max)
    _, length = ngram_match(tokens, seq_len, n_min, n_max)
    for i, row in enumerate(rows):
        drafts, n = reference(row, 6, n_min, n_max)
        assert (p.draft_token_ids[i].tolist(), length[i].item()) == (drafts, n), row
        assert p.num_draft_tokens[i].item() == (6 if n else 0)


def test_compiled_equals_eager_and_compiles_once_per_shape() -> None:
    torch._dynamo.reset()
    counts = {"graphs": 0}

    def counting_backend(graph_module, example_inputs):
        counts["graphs"] += 1
        return graph_module.forward

    compiled = torch.compile(ngram_propose, fullgraph=True, dynamic=False, backend=counting_backend)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # same shapes, new values: one graph
        tokens = torch.randint(0, 4, (5, 40), generator=gen)
        seq_len = torch.randint(1, 41, (5,), generator=gen)
        got, want = compiled(tokens, seq_len, 4, 2, 6), ngram_propose(tokens, seq_len, 4, 2, 6)
        assert all(torch.equal(a, b) for a, b in zip(got, want) if a is not None)
    assert counts["graphs"] == 1
    inductor = torch.compile(ngram_propose, fullgraph=True, dynamic=False)
    got = inductor(tokens, seq_len, 4, 2, 6)
    assert all(torch.equal(a, b) for a, b in zip(got, want) if a is not None)


def test_bad_settings_are_one_line_errors() -> None:
    for n_min, n_max in [(0, 4), (5, 4), (2.0, 4)]:
        with pytest.raises(ValueError, match="n_min <= n_max"):
            NgramProposer(n_min, n_max)


# ---------------------------------------------------------------------------------------------
# The suffix index


def brute_force(corpus: list[int], context: list[int], k: int) -> tuple[int, list[int]]:
    """Longest suffix of the context (up to DEPTH) found in the corpus, then the greedy path:
    at each step the most frequent next token (the smallest among equals) among the
    occurrences that agree so far. Past the corpus end the last token repeats, as in the index."""
    for m in range(min(DEPTH, len(context)), 0, -1):
        ends = [e for e in range(m - 1, len(corpus)) if corpus[e - m + 1 : e + 1] == context[-m:]]
        if ends:
            break
    else:
        return 0, []
    follow = [[corpus[min(e + 1 + j, len(corpus) - 1)] for j in range(k)] for e in ends]
    path = []
    for j in range(k):
        counts = Counter(f[j] for f in follow)
        best = max(sorted(counts), key=lambda v: counts[v])
        path.append(best)
        follow = [f for f in follow if f[j] == best]
    return m, path


def test_suffix_index_matches_brute_force_on_random_corpora() -> None:
    gen = torch.Generator().manual_seed(3)
    for trial in range(6):
        alphabet = 2 + trial
        corpus = torch.randint(0, alphabet, (300,), generator=gen).tolist()
        index = SuffixIndex.build(np.array(corpus), min_match=1)
        for _ in range(40):
            context = torch.randint(0, alphabet, (20,), generator=gen).tolist()
            m, path = brute_force(corpus, context, 5)
            length, lo, hi = index.longest_match(np.array(context))
            assert length == m and hi - lo == sum(
                corpus[e - m + 1 : e + 1] == context[-m:] for e in range(m - 1, len(corpus))
            )
            if hi - lo <= SAMPLE:  # every occurrence read: exactly the most frequent path
                assert index.continuation(lo, hi, 5).tolist() == path


def test_suffix_index_proposes_per_row_with_document_boundaries() -> None:
    docs = [
        "import os\nimport sys\n",
        "import os\nimport re\n",
        "import os\nimport sys\n",
        "pass\n",
    ]
    corpus = [t for d in docs for t in [*encode(d), EOS_TOKEN_ID]]
    index = SuffixIndex.build(torch.tensor(corpus, dtype=torch.int16))
    rows = [encode("import os\nimp"), encode("zzzz"), encode("x = 1\nimport sys\n")]
    p = SuffixProposer(index).host_propose(rows, 6)
    assert bytes(p.draft_token_ids[0].tolist()) == b"ort sy"  # sys (twice) beats re (once)
    assert p.draft_token_ids[1].tolist() == [PLACEHOLDER_TOKEN_ID] * 6  # no match of >= 4 tokens
    assert p.draft_token_ids[2].tolist() == [EOS_TOKEN_ID, BOS_TOKEN_ID, *encode("impo", bos=False)]
    # Row 0 matched from its BOS on (14 tokens); row 2 "\nimport sys\n" (12), followed by
    # EOS BOS and then "import" and "pass" once each: the tie goes to the smaller byte.
    assert p.num_draft_tokens.tolist() == [6, 0, 6]
    assert [index.longest_match(np.asarray(row[-DEPTH:]))[0] for row in rows] == [14, 0, 12]
    assert p.draft_probs is None


def test_suffix_index_survives_save_and_load(tmp_path) -> None:
    index = SuffixIndex.build(np.array(encode("abcabdabcabe" * 5)))
    index.save(tmp_path / "index.npz")
    loaded = SuffixIndex.load(tmp_path / "index.npz")
    assert np.array_equal(loaded.order, index.order)
    assert all(np.array_equal(a, b) for a, b in zip(loaded.keys, index.keys))


def test_suffix_index_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="254 or 255"):
        SuffixIndex.build(np.array([1, 2, 255]))
    with pytest.raises(ValueError, match="non-empty"):
        SuffixIndex.build(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="min_match"):
        SuffixIndex.build(np.array([1, 2, 3]), min_match=0)


def test_the_registry_builds_each_proposer_from_what_the_decoder_holds() -> None:
    """Each name builds its proposer from what the decoder holds, and says which part it needs;
    the suffix proposer is the one that proposes on the host."""
    index, draft, target, head = SuffixIndex.build(np.array(encode("abcabc"))), *[object()] * 3
    held = Held(target, draft, index, head)
    built = {name: entry.build(held) for name, entry in PROPOSERS.items()}
    assert (
        isinstance(built["draft_model"], DraftModelProposer) and built["draft_model"].model is draft
    )
    assert isinstance(built["ngram"], NgramProposer) and isinstance(built["suffix"], SuffixProposer)
    assert built["suffix"].index is index
    assert built["feature_head"].head is head and built["feature_head"].target is target
    assert [n for n, p in built.items() if isinstance(p, HostProposer)] == ["suffix"]
    assert {n: e.needs for n, e in PROPOSERS.items()} == {
        "draft_model": "draft",
        "feature_head": "head",
        "head_tree": "head",
        "ngram": None,
        "parallel": "draft",
        "parallel_tree": "draft",
        "suffix": "suffix_index",
        "tree": "draft",
    }
    assert all(built[name].model is draft for name in ("parallel", "parallel_tree"))
