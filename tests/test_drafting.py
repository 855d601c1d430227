"""Drafts for speculative decoding with the embedded LM: what the reply format forces, and what the prompt holds.

A draft is only a proposal (the model checks every drafted token), so these tests pin what is proposed: the
forced text must be exactly what the output grammar admits next, and nothing where the model still chooses."""

from __future__ import annotations

import dspy
import numpy as np
import pytest

from dspy_agentgrad.embedded_lm.drafting import ReplyDraft, copied_continuation, forced_text
from dspy_agentgrad.embedded_lm.grammar import plan_for_messages


class Two(dspy.Signature):
    question: str = dspy.InputField()
    reasoning: str = dspy.OutputField()
    answer: str = dspy.OutputField()


class One(dspy.Signature):
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


def plan(signature, adapter=None):
    adapter = adapter or dspy.ChatAdapter()
    system = adapter.format(signature, demos=[], inputs={"question": "q"})[0]["content"]
    return plan_for_messages(system)


WHOLE = "[[ ## reasoning ## ]]\nBecause [x] is.\nSo 6.\n\n[[ ## answer ## ]]\n42\n\n[[ ## completed ## ]]"


@pytest.mark.parametrize(
    ("reply", "forced"),
    [
        ("[[", " ## reasoning ## ]]\n"),
        ("[[ ## reas", "oning ## ]]\n"),
        ("[[ ## reasoning ## ]]\n", ""),  # the value: the model's choice
        ("[[ ## reasoning ## ]]\nBecause [x", ""),  # a single "[" inside a value forces nothing
        ("[[ ## reasoning ## ]]\nBecause [x] is.\n", ""),  # a newline may still continue the value
        ("[[ ## reasoning ## ]]\nBecause [x] is.\nSo 6.\n\n", "[[ ## answer ## ]]\n"),  # a blank line ends it
        ("[[ ## reasoning ## ]]\nBecause [x] is.\nSo 6.\n\n[[ ## ans", "wer ## ]]\n"),
        ("[[ ## reasoning ## ]]\nBecause [x] is.\nSo 6.\n\n[[ ## answer ## ]]\n42\n\n", "[[ ## completed ## ]]"),
        ("[[ ## reasoning ## ]]\nBecause [x] is.\nSo 6.\n\n[[ ## answer ## ]]\n42\n\n[[ ## com", "pleted ## ]]"),
    ],
)
def test_forced_text_is_what_the_grammar_admits_next(reply, forced):
    p = plan(Two)
    assert p.matches(WHOLE) and WHOLE.startswith(reply)
    assert forced_text(p, reply) == forced
    assert WHOLE.startswith(reply + forced)  # the proposal is the admitted reply's own next text


def test_a_header_the_model_got_wrong_is_not_continued():
    assert forced_text(plan(Two), "[[ ## answr") == ""


def test_json_replies_force_nothing():
    assert forced_text(plan(One, dspy.JSONAdapter()), '{"answer": ') == ""


def test_the_latest_occurrence_of_the_last_tokens_is_continued():
    ids = np.array([5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 4, 5, 0, 6, 7])
    assert copied_continuation(ids).tolist() == [2, 3, 4, 5, 0, 6, 7]  # after the later "6 7", up to the end
    assert copied_continuation(np.array([1, 2, 3, 9])).tolist() == []  # "3 9" and "9" never occurred before


def test_a_single_token_match_is_not_enough():
    assert copied_continuation(np.array([4, 1, 2, 3, 5, 6, 3])).tolist() == []


class _Tokens:
    """A stand-in for llama_cpp.Llama's tokenizer: one token per character."""

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        return list(text)

    def detokenize(self, ids: list[int]) -> bytes:
        return bytes(int(i) for i in ids)


def test_the_draft_finds_where_the_reply_starts_and_forgets_it_for_the_next():
    llama, draft = _Tokens(), ReplyDraft()
    prompt = list(b"Reply as [[ ## answer ## ]] then a short quote.\n")
    draft.begin(llama, plan(One))
    assert not draft.verifying  # the prompt is read without a draft to check
    draft(np.array(prompt + list(b"[")))  # the prompt and the first sampled token: the reply starts there
    assert draft.verifying
    out = draft(np.array(prompt + list(b"[[ ## an")))
    assert bytes(out.tolist()) == b"swer ## ]]\n"  # forced by the format, whatever the prompt says
    out = draft(np.array(prompt + list(b"[[ ## answer ## ]]\nA sho")))
    assert bytes(out.tolist()) == b"rt quote"  # copied from the prompt, COPY_TOKENS at most
    draft.begin(llama, None)
    assert draft.start is None and not draft.verifying


def test_after_a_refused_draft_one_plain_step_is_taken():
    """A draft refused at its first token cost a batch for one token; the next step proposes nothing."""
    llama, draft = _Tokens(), ReplyDraft()
    prompt = list(b"Reply as [[ ## answer ## ]] then a short quote.\n")
    draft.begin(llama, plan(One))
    draft(np.array(prompt + list(b"[")))
    assert len(draft(np.array(prompt + list(b"[[ ## answer ## ]]\nA sho")))) == 8
    refused = prompt + list(b"[[ ## answer ## ]]\nA shoX")  # the model wrote its own token, not "r"
    assert len(draft(np.array(refused))) == 0
    assert bytes(draft(np.array(refused + list(b" then a"))).tolist()) == b" short q"  # and then drafts again
