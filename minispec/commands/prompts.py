"""Prompts cut from the corpus's held-out files (never trained on), for the commands that measure.

- `held_out_prompts`: plain cuts of a file, each starting at a line start: the text a model
  continues in the benchmarks.
- `edit_prompts`: a held-out function, a blank line and its first line again: continuing means
  repeating code the prompt already holds, as an edit does (the lookup proposers' best case,
  and what `minispec copy-score` scores).
"""

from __future__ import annotations

from minispec.commands.corpus import load_corpus
from model import tokenizer
from model.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID


def held_out_prompts(count: int = 6, length: int = 300) -> list[str]:
    """`count` distinct prompts of `length` bytes from the corpus's held-out files, each
    starting at a line start, spread evenly over the held-out split: one file at most once while
    files last (16), then further cuts of them (a batch of 64 rows, each its own text)."""
    ids = load_corpus().held_out.tolist()
    prompts, used_files, used_cuts, step = [], set(), set(), len(ids) // count
    for one_per_file in (True, False):
        for i in range(count * 4):  # a few spare starting points for files too short to cut
            at = (i * step // 4 + (0 if one_per_file else step // 8)) % len(ids)
            file_start = max((j for j in range(at, -1, -1) if ids[j] == BOS_TOKEN_ID), default=0)
            line = next((j + 1 for j in range(at, len(ids) - length) if ids[j] == ord("\n")), None)
            if line is None or line in used_cuts or (one_per_file and file_start in used_files):
                continue
            cut = ids[line : line + length]
            if BOS_TOKEN_ID in cut or EOS_TOKEN_ID in cut:
                continue
            used_files.add(file_start)
            used_cuts.add(line)
            prompts.append(bytes(cut).decode("utf-8", errors="replace"))
            if len(prompts) == count:
                return prompts
    return prompts


def edit_prompts(count: int, max_length: int) -> list[str]:
    """Held-out functions, each followed by a blank line and its own first line again: the
    model is asked to write the function once more. Functions of 3+ lines whose prompt (BOS
    included) is at most max_length tokens."""
    ids = load_corpus().held_out.tolist()
    text = bytes(t for t in ids if t not in (BOS_TOKEN_ID, EOS_TOKEN_ID)).decode("utf-8", "replace")
    prompts, at = [], 0
    while len(prompts) < count:
        at = text.find("\ndef ", at + 1)
        if at < 0:
            break
        end = min(
            (e for e in (text.find("\ndef ", at + 1), text.find("\nclass ", at + 1)) if e > 0),
            default=len(text),
        )
        function = text[at + 1 : end].rstrip()
        prompt = function + "\n\n" + function.split("\n")[0] + "\n"
        if function.count("\n") >= 2 and len(tokenizer.encode(prompt)) <= max_length:
            prompts.append(prompt)
    return prompts
