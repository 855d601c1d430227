"""dspy-agentgrad: the AgentGrad prompt optimizer for multi-module DSPy programs.

``import dspy_agentgrad`` loads the optimizer core only; the embedded LM
(``local_lm``, llama.cpp) is imported on first use.
"""

from __future__ import annotations

from typing import Any

from .config import AUTO_CANDIDATES, auto_budget
from .hints import default_hint
from .metric import MetricError
from .results import AgentGradResult, AttributionRecord, AttributionReport, CandidateRecord, RoundRecord
from .store import RunMismatch
from .teleprompter import AgentGrad

__all__ = [
    "AUTO_CANDIDATES",
    "AgentGrad",
    "AgentGradResult",
    "AttributionRecord",
    "AttributionReport",
    "CandidateRecord",
    "MetricError",
    "RoundRecord",
    "RunMismatch",
    "auto_budget",
    "default_hint",
    "local_lm",
]


def __getattr__(name: str) -> Any:
    if name == "local_lm":  # lazily: the embedded LM is an optional extra
        from .embedded_lm import local_lm

        return local_lm
    raise AttributeError(f"module 'dspy_agentgrad' has no attribute {name!r}")
