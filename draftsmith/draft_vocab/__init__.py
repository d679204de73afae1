"""The draft vocabulary, in one place: which Vd of the target's V tokens a drafter's head
proposes (EAGLE-3's convention, which DFlash's optional one and P-EAGLE follow).

Convention (../shared/REFERENCE.md section 1): `used` = the chosen target ids sorted ascending;
`d2t[i] = used[i] - i` (int64, size Vd), so draft id d maps to target id `d + d2t[d]`; `t2d` is a
bool mask of size V, true on the chosen ids.

    vocab.py      the `DraftVocab` value and choosing the Vd most frequent ids from counts
    counting.py   counting them (the data's tokens, the target's own choices in the cache) and
                  the data pipeline's step that counts, chooses and saves `draft_vocab.safetensors`
    file.py       saving, loading, and reading it back checked against the target
    drafter.py    the drafter side: the buffers mixin the kinds share, installing the data's
                  vocabulary before training, and the error when the data has none

It sits below `models/` (whose drafters use the mixin), so it imports neither data/ nor train/;
the data pipeline and training call it. The contract a drafter offers is
`models/contracts.py`'s `DraftVocabModule`.
"""
