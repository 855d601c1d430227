"""The grammar-first sampler's shortcut when the grammar refuses the argmax: looking among the highest logits
takes the token that masking the whole vocabulary and then taking the argmax would take, or says it cannot tell."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dspy_agentgrad.embedded_lm.grammar_first import first_allowed


def greedy_after_full_mask(logits: np.ndarray, kept: np.ndarray) -> int | None:
    """What llama.cpp does: every refused token set to -inf, then the first index of the highest logit."""
    if not kept.any():
        return None
    return int(np.argmax(np.where(kept, logits, -np.inf)))


@st.composite
def vocabularies(draw):
    size = draw(st.integers(1, 300))
    # few distinct values, so ties are common, at the boundary of the top too
    values = draw(st.lists(st.integers(-6, 6), min_size=size, max_size=size))
    kept = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    return np.array(values, dtype=np.float32), np.array(kept), draw(st.integers(0, 40))


@given(vocabularies())
def test_the_token_found_among_the_top_is_the_one_full_masking_takes(vocab):
    logits, kept, top = vocab
    asked = []

    def allowed(indices: np.ndarray) -> np.ndarray:
        asked.append(len(indices))
        return kept[indices]

    found = first_allowed(logits, allowed, top)
    assert asked == ([min(top, logits.size)] if top else [])  # one question to the grammar, about the top only
    if not top:
        assert found is None  # nothing looked at: only the whole vocabulary can tell
    if found is not None:
        assert found == greedy_after_full_mask(logits, kept)


def test_it_says_it_cannot_tell_when_a_token_left_out_could_come_first():
    logits = np.array([1.0, 5.0, 1.0, 4.0], dtype=np.float32)
    kept = np.array([True, False, True, False])
    # top 3 holds 5, 4 and one of the two 1s: the best kept token ties with the lowest logit looked at
    assert first_allowed(logits, lambda i: kept[i], 3) is None
    assert first_allowed(logits, lambda i: kept[i], 4) == 0
    assert first_allowed(logits, lambda i: np.zeros(len(i), dtype=bool), 4) is None


def test_a_kept_token_clearly_among_the_top_is_found_without_the_whole_vocabulary():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=49_152).astype(np.float32)
    order = np.argsort(-logits)
    kept = np.zeros(logits.size, dtype=bool)
    kept[order[3]] = kept[order[40_000]] = True  # the argmax refused; the 4th best and a far one kept
    assert first_allowed(logits, lambda i: kept[i], 32) == order[3]
