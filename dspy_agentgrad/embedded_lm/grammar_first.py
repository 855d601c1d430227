"""``llama_cpp.Llama`` adapted for greedy constrained decoding: the grammar is checked on the greedy token
first, and the CPU's extra buffer types can be switched off at load."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

#: llama.cpp's llama_token_data, as numpy lays it out
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


#: Highest logits checked against the grammar when the argmax is refused, before the whole vocabulary is: on
#: constrained DSPy calls of the default model, 72% of refused argmaxes had the token taken among the 16 highest
#: (half among the 3 highest), the rest thousands of places down.
TOP_CANDIDATES = 32


def first_allowed(logits: np.ndarray, allowed: Callable[[np.ndarray], np.ndarray], top: int) -> int | None:
    """The index greedy decoding takes once a grammar has masked the vocabulary, looked for among the ``top``
    highest logits only: ``allowed(indices)`` says which of those indices the grammar keeps.

    None when no kept index is among them, or when the best kept one ties with the lowest logit looked at (a
    token left out could tie with it and come first in vocabulary order, which greedy takes): then only masking
    the whole vocabulary can tell.
    """
    size = logits.size
    k = min(top, size)
    if k < 1:
        return None
    idx = np.argpartition(logits, size - k)[size - k :]
    idx = idx[np.lexsort((idx, -logits[idx]))]  # highest first, ties in vocabulary order as greedy takes them
    kept = np.flatnonzero(allowed(idx))
    if not kept.size:
        return None
    best = int(idx[kept[0]])
    if k < size and not logits[best] > logits[idx[-1]]:
        return None
    return best


class _GrammarFirst:
    """A llama.cpp sampler that checks the grammar on the greedy token first.

    llama-cpp-python applies a grammar to every candidate token at every step;
    with Gemma 3's 262k-token vocabulary that made constrained generation ~4x
    slower than free generation. At temperature 0 only the argmax matters, so
    (as llama.cpp's own common sampler does) this checks the argmax alone; when
    the grammar refuses it, the next highest logits (:func:`first_allowed`), and
    the whole vocabulary only when those cannot settle it. Output is identical
    to full masking.
    """

    def __init__(self, vocab: Any, grammar_text: str, root: str = "root"):
        import llama_cpp

        self._lib = llama_cpp
        self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar_text.encode("utf-8"), root.encode("utf-8"))
        if not self.grammar:
            raise ValueError("llama.cpp could not parse the output grammar")

        def apply(_smpl, cur_p):
            # ctypes prints and swallows an exception raised here, and llama.cpp would then accept a token the
            # grammar refuses and abort the process: any failure of the shortcut masks the whole vocabulary
            try:
                self._apply(cur_p)
            except Exception:
                llama_cpp.llama_sampler_apply(self.grammar, cur_p)

        def accept(_smpl, token):
            llama_cpp.llama_sampler_accept(self.grammar, token)

        def reset(_smpl):
            llama_cpp.llama_sampler_reset(self.grammar)

        iface = llama_cpp.llama_sampler_i()
        self._callbacks = (
            llama_cpp.llama_sampler_i_apply(apply),
            llama_cpp.llama_sampler_i_accept(accept),
            llama_cpp.llama_sampler_i_reset(reset),
        )
        iface.apply, iface.accept, iface.reset = self._callbacks
        iface.name = llama_cpp.llama_sampler_i_name(0)
        iface.clone = llama_cpp.llama_sampler_i_clone(0)
        iface.free = llama_cpp.llama_sampler_i_free(0)
        self._iface = iface
        self.sampler = llama_cpp.llama_sampler()
        self.sampler.iface = ctypes.pointer(iface)
        self.sampler.ctx = None

    def _kept(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Which of these tokens the grammar keeps in its current state (it judges each token on its own)."""
        lib = self._lib
        cells = np.empty(ids.size, dtype=_TOKEN_DATA)
        cells["id"], cells["logit"], cells["p"] = ids, logits, 0.0
        batch = lib.llama_token_data_array(
            cells.ctypes.data_as(ctypes.POINTER(lib.llama_token_data)), ids.size, -1, False
        )
        lib.llama_sampler_apply(self.grammar, ctypes.byref(batch))
        return cells["logit"] != -np.inf

    def _apply(self, cur_p: Any) -> None:
        arr = cur_p.contents
        # llama_token_data is {int32 id; float logit; float p}: one row of three 4-byte cells per token
        rows = np.ctypeslib.as_array(ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_int32)), shape=(arr.size, 3))
        ids, logits = rows[:, 0], rows.view(np.float32)[:, 1]
        best = int(np.argmax(logits))
        if self._kept(ids[best : best + 1], logits[best : best + 1])[0]:
            return
        chosen = first_allowed(logits, lambda idx: self._kept(ids[idx], logits[idx]), TOP_CANDIDATES)
        if chosen is None:
            self._lib.llama_sampler_apply(self.grammar, cur_p)
            return
        value = float(logits[chosen])
        logits[:] = -np.inf  # greedy takes the one token left, as after masking the whole vocabulary
        logits[chosen] = value

    def get_sampler(self) -> Any:
        return ctypes.pointer(self.sampler)

    def __del__(self) -> None:
        if getattr(self, "grammar", None):
            self._lib.llama_sampler_free(self.grammar)
            self.grammar = None


def llama_class() -> type:
    """``llama_cpp.Llama`` with the grammar-first sampler for greedy constrained decoding, and a
    ``use_extra_bufts`` keyword that llama-cpp-python does not offer (see :mod:`.cpu`)."""
    from llama_cpp import Llama, _internals
    from llama_cpp import llama_cpp as lib

    class FastGrammarLlama(Llama):
        def __init__(self, *args: Any, use_extra_bufts: bool = True, **kwargs: Any):
            self._use_extra_bufts = use_extra_bufts
            logits_all = bool(kwargs.pop("logits_all", False))
            # With a draft model llama-cpp-python keeps a row of logits per context position and asks llama.cpp
            # for the logits of every position of every batch, the prompt's too; here only while a draft is
            # checked (see _logits_all below).
            super().__init__(*args, logits_all=logits_all or kwargs.get("draft_model") is not None, **kwargs)
            self._all_logits = logits_all

        @property
        def _logits_all(self) -> bool:
            draft = self.__dict__.get("draft_model")
            return self.__dict__.get("_all_logits", False) or bool(getattr(draft, "verifying", False))

        @_logits_all.setter
        def _logits_all(self, value: bool) -> None:
            self._all_logits = value

        # Llama.__init__ builds its llama_model_params from llama.cpp's defaults, sets the fields it has
        # keywords for, and loads the model with them; this setter sees the struct as it is created.
        @property
        def model_params(self) -> Any:
            return self._model_params

        @model_params.setter
        def model_params(self, params: Any) -> None:
            params.use_extra_bufts = self._use_extra_bufts
            self._model_params = params

        def eval(self, tokens: Any) -> None:
            # ``pacing`` (set by the engine) wraps every decode call, prompt batches and generated tokens alike
            pacing = self.__dict__.get("pacing")
            if pacing is None:
                return super().eval(tokens)
            with pacing(self):
                return super().eval(tokens)

        def _init_sampler(self, *args: Any, **kwargs: Any):
            grammar = kwargs.get("grammar")
            if grammar is None or kwargs.get("temp", 0.8) != 0.0 or kwargs.get("logits_processor") is not None:
                return super()._init_sampler(*args, **kwargs)
            try:
                return self._grammar_first_sampler(grammar, kwargs)
            except (AttributeError, TypeError):  # other llama-cpp-python internals: full masking
                return super()._init_sampler(*args, **kwargs)

        def _grammar_first_sampler(self, grammar: Any, kwargs: dict[str, Any]):
            sampler = _internals.LlamaSampler()
            sampler.add_penalties(
                n_vocab=self._n_vocab,
                penalty_last_n=self.last_n_tokens_size,
                penalty_repeat=kwargs.get("repeat_penalty", 1.0),
                penalty_freq=kwargs.get("frequency_penalty", 0.0),
                penalty_present=kwargs.get("presence_penalty", 0.0),
            )
            custom = _GrammarFirst(self._model.vocab, grammar._grammar, grammar._root)
            lib.llama_sampler_chain_add(sampler.sampler, custom.get_sampler())
            # llama-cpp-python removes custom samplers from the chain before freeing it
            sampler.custom_samplers.append((lib.llama_sampler_chain_n(sampler.sampler) - 1, custom))
            sampler.add_greedy()
            return sampler

    return FastGrammarLlama
