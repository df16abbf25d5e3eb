"""The model card's "reads as Python" figure: the parser decides, not the look of the text."""

from __future__ import annotations

from minispec.commands.samples import parsed_fraction


def test_valid_code_parses_whole_and_the_cut_off_last_line_is_not_counted() -> None:
    assert parsed_fraction("def f(x):\n    return x + 1\n") == 1.0
    assert parsed_fraction("def f(x):\n    return x + 1\nclass A(obj") == 1.0


def test_python_lookalikes_score_low() -> None:
    # The shipped pair's old output: looks like Python, but the first line is already invalid.
    assert (
        parsed_fraction(
            "def _document_names:\n_lock__ = __platformat_hcsmd_toop():\n    if stri_optiontime:\n"
        )
        == 0
    )
    # Brackets that never close: only the lines before them count.
    assert parsed_fraction("import os\nx = (1,\ny = 2\nz = 3\n") == 0.25


def test_an_unfinished_block_at_the_end_costs_only_its_lines() -> None:
    text = "import os\n\n\ndef f(a, b):\n    if a:\n"
    assert parsed_fraction(text) == 3 / 5
