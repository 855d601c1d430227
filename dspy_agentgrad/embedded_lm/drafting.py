"""Draft tokens for llama.cpp's speculative decoding: text the reply is bound to write, checked by the model.

Generating one token costs a full pass over the weights; checking several proposed tokens in one batch costs
little more. llama-cpp-python verifies a draft greedily: the model samples at each drafted position and the
draft is kept only up to the first token the model would not have written, so the reply is the one plain
decoding writes. (One caveat, shared with llama.cpp's prompt-prefix reuse: a batch may round differently from
one-token steps, which could flip a near-tie.) Two sources of drafts pay off here:

* the format: DSPy's chat adapter replies are ``[[ ## field ## ]]`` headers around values, and the headers are
  forced by the output grammar (:mod:`.grammar`) once their first characters are written;
* the prompt: small models copy. The demo's ``locate`` step quotes a sentence of its passage and ``answer``
  copies a span of it; a run that repeats itself copies its own reply. When the last few tokens occurred
  before, what followed them then is proposed (prompt-lookup decoding).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..program.prompt_text import CHAT_MARK
from .grammar import OutputPlan

# Tokens proposed from the prompt at once, and the n-gram lengths tried (longest first): a 1-token match is
# too often chance (" the"), and a rejected draft costs a batch.
COPY_TOKENS = 8
COPY_NGRAMS = (3, 2)


def forced_text(plan: OutputPlan, reply: str) -> str:
    """The text the chat grammar forces right after ``reply`` ("" where the model still has a choice).

    A header is forced once its "[[" is written, or once a blank line ends a value (a value never holds one).
    """
    if plan.format != "chat":
        return ""
    headers = [f"[[ ## {spec.name} ## ]]\n" for spec in plan.fields] + [CHAT_MARK]
    opened = reply.rfind("[[")
    done = reply.count("]]\n")
    if opened >= 0 and not reply.endswith("]]\n") and reply.find("]]", opened) < 0:
        header = headers[min(done, len(headers) - 1)]
        partial = reply[opened:]
        return header[len(partial) :] if header.startswith(partial) else ""
    if not reply:
        return headers[0]
    if reply.endswith("\n\n") and 0 < done < len(headers):
        return headers[done]
    return ""


def copied_continuation(ids: np.ndarray) -> np.ndarray:
    """What followed the latest earlier occurrence of the last few tokens (empty when they did not occur)."""
    for n in COPY_NGRAMS:
        if len(ids) <= n:
            continue
        tail = ids[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
        found = np.flatnonzero((windows == tail).all(axis=1))
        if found.size:
            after = int(found[-1]) + n
            return ids[after : after + COPY_TOKENS]
    return ids[:0]


class ReplyDraft:
    """llama-cpp-python's draft model for one llama.cpp context, told about each reply before it starts.

    ``verifying`` is read by the context (:func:`.grammar_first.llama_class`): logits for every position of a batch
    are needed only while a draft is checked, not while the prompt is read.
    """

    def __init__(self) -> None:
        self.plan: OutputPlan | None = None
        self.llama: Any = None
        self.start: int | None = None
        self.verifying = False
        self._last: tuple[int, int] = (0, 0)  # (input length, tokens proposed) of the last draft

    def begin(self, llama: Any, plan: OutputPlan | None) -> None:
        """A new reply starts on ``llama`` (a ``llama_cpp.Llama``) under ``plan``: forget the last one."""
        self.llama, self.plan, self.start, self.verifying, self._last = llama, plan, None, False, (0, 0)

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        if self.start is None:  # first call of a reply: the prompt and the first sampled token
            self.start = len(input_ids) - 1
        self.verifying = True
        asked_at, proposed = self._last
        # A draft the model refused at its first token cost a batch for one token: take one plain step after it.
        refused = proposed and len(input_ids) == asked_at + 1
        draft = input_ids[:0] if refused else self._propose(input_ids)
        self._last = (len(input_ids), len(draft))
        return draft.astype(np.intc)

    def _propose(self, input_ids: np.ndarray) -> np.ndarray:
        if self.plan is not None and self.llama is not None:
            reply = self.llama.detokenize(list(input_ids[self.start :])).decode("utf-8", errors="ignore")
            forced = forced_text(self.plan, reply)
            if forced:
                return np.asarray(self.llama.tokenize(forced.encode(), add_bos=False, special=False), dtype=np.intc)
        return copied_continuation(input_ids)
