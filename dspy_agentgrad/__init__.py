"""dspy-agentgrad: the AgentGrad prompt optimizer for multi-module DSPy programs.

``import dspy_agentgrad`` loads the optimizer core only; the embedded LM
(``local_lm``, llama.cpp) is imported on first use.
"""

from __future__ import annotations

from typing import Any

from .config import AgentGradConfig
from .core.events import (
    AgentGradCallback,
    AttributionDone,
    CandidateJudged,
    CandidateProposed,
    RoundEnd,
    RoundStart,
    RunEnd,
    RunStart,
    ValidationScored,
)
from .core.stoppers import RunStatus, ScoreThresholdStopper, TimeoutStopCondition
from .option_groups import AUTO_CANDIDATES, auto_budget
from .program.executor import RayExecutor
from .program.hints import Hint, default_hint
from .program.metric import MetricError
from .program.runner import ProgramBug
from .reporting.estimate import Estimate
from .reporting.report import write_report
from .reporting.results import AgentGradResult, AttributionRecord, AttributionReport, CandidateRecord, RoundRecord
from .roles.instruction_proposer import RewriteRequest
from .runtime.fingerprint import RunMismatch
from .runtime.retries import FirstRunsFailed
from .runtime.run_lock import LogDirBusy
from .teleprompter import AgentGrad

__all__ = [
    "AUTO_CANDIDATES",
    "AgentGrad",
    "AgentGradCallback",
    "AgentGradConfig",
    "AgentGradResult",
    "AttributionDone",
    "AttributionRecord",
    "AttributionReport",
    "CandidateJudged",
    "CandidateProposed",
    "CandidateRecord",
    "Estimate",
    "FirstRunsFailed",
    "Hint",
    "LogDirBusy",
    "MetricError",
    "ProgramBug",
    "RayExecutor",
    "RewriteRequest",
    "RoundEnd",
    "RoundRecord",
    "RoundStart",
    "RunEnd",
    "RunMismatch",
    "RunStart",
    "RunStatus",
    "ScoreThresholdStopper",
    "TimeoutStopCondition",
    "ValidationScored",
    "auto_budget",
    "default_hint",
    "local_lm",
    "write_report",
]


def __getattr__(name: str) -> Any:
    if name == "local_lm":  # lazily: the embedded LM is an optional extra
        from .embedded_lm import local_lm

        return local_lm
    raise AttributeError(f"module 'dspy_agentgrad' has no attribute {name!r}")
