"""Where each emitted token came from, the labels of GenerationOutput.origins (and of the CLI's
colours): an accepted draft, the corrective token after a rejection, the bonus token after a
round whose drafts were all accepted, or the target alone in a round without drafts (K = 0).

No torch here: the command line reads these labels before it loads the decoder. Which label a
token gets is RowResult.origins' (minispec/state.py), from the round's snapshot.
"""

ACCEPTED, CORRECTIVE, BONUS, TARGET = "accepted", "corrective", "bonus", "target"
