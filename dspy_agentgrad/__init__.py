"""dspy-agentgrad: the AgentGrad prompt optimizer for multi-module DSPy programs."""

from .config import AUTO_ROUNDS, auto_budget
from .hints import default_hint
from .local_lm import local_lm  # cheap: llama_cpp is imported on first call only
from .metric import MetricError
from .results import AgentGradResult, AttributionRecord, AttributionReport, CandidateRecord, RoundRecord
from .store import RunMismatch
from .teleprompter import AgentGrad

__all__ = [
    "AUTO_ROUNDS",
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
