"""Where each emitted token came from, the labels of GenerationOutput.origins (and of the CLI's
colours): an accepted draft, the corrective token after a rejection, the bonus token after a
round whose drafts were all accepted, or the target alone in a round without drafts (K = 0).

No torch here: the command line reads these labels before it loads the decoder.
"""

ACCEPTED, CORRECTIVE, BONUS, TARGET = "accepted", "corrective", "bonus", "target"


def origins_of(count: int, num_accepted: int, num_drafts: int) -> list[str]:
    """Where each of a row's `count` kept tokens came from, in a round that proposed L drafts
    and accepted n of them."""
    if num_drafts == 0:
        return [TARGET] * count
    last = BONUS if num_accepted == num_drafts else CORRECTIVE
    return [ACCEPTED if j < num_accepted else last for j in range(count)]
