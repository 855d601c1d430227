"""``llama_cpp.Llama`` adapted for greedy constrained decoding: the grammar is checked on the greedy token
first, and the CPU's extra buffer types can be switched off at load."""

from __future__ import annotations

from typing import Any


class _GrammarFirst:
    """A llama.cpp sampler that checks the grammar on the greedy token first.

    llama-cpp-python applies a grammar to every candidate token at every step;
    with Gemma 3's 262k-token vocabulary that made constrained generation ~4x
    slower than free generation. At temperature 0 only the argmax matters, so
    (as llama.cpp's own common sampler does) this checks the argmax alone and
    masks the whole vocabulary only when the argmax is rejected. Output is
    identical to full masking.
    """

    def __init__(self, vocab: Any, grammar_text: str, root: str = "root"):
        import ctypes

        import llama_cpp

        self._lib = llama_cpp
        self._ctypes = ctypes
        self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar_text.encode("utf-8"), root.encode("utf-8"))
        if not self.grammar:
            raise ValueError("llama.cpp could not parse the output grammar")

        def apply(_smpl, cur_p):
            self._apply(cur_p)

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

    def _apply(self, cur_p: Any) -> None:
        import numpy as np

        lib, ctypes = self._lib, self._ctypes
        arr = cur_p.contents
        data = np.ctypeslib.as_array(arr.data, shape=(arr.size,))
        token = int(data["id"][int(np.argmax(data["logit"]))])
        one = (lib.llama_token_data * 1)(lib.llama_token_data(token, 0.0, 0.0))
        probe = lib.llama_token_data_array(one, 1, -1, False)
        lib.llama_sampler_apply(self.grammar, ctypes.byref(probe))
        if one[0].logit == float("-inf"):
            lib.llama_sampler_apply(self.grammar, cur_p)

    def get_sampler(self) -> Any:
        return self._ctypes.pointer(self.sampler)

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
