"""The hook that replaces AgentGrad's rewrite role: ``AgentGrad(..., instruction_proposer=fn)``.

AgentGrad decides *what* to change (which predictor, from which cluster of
failures); the proposer decides *how* the new instruction reads. A custom
proposer gets the same inputs as the built-in rewrite role, plus the individual
gradients behind the generalized one, and returns the new instruction (or
``None`` to propose nothing). Its result is journaled in ``log_dir`` like the
built-in role's, so a resumed run does not call it again for the same request,
and the LM calls it makes through DSPy are counted as prompt-LM usage and reserved against the prompt-LM caps
before each is sent (:mod:`..runtime.prompt_gate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class RewriteRequest:
    """What the rewrite step knows when it asks for a new instruction."""

    predictor: str
    step_signature: str  # "inputs: a, b; outputs: c"
    current_instruction: str
    generalized_gradient: str  # the cluster's correction in general terms
    gradients: list[str] = field(default_factory=list)  # the sample-level gradients in the cluster
    examples: list[tuple[dict, dict, dict]] = field(default_factory=list)  # (inputs, original, corrected)
    rejected: list[str] = field(default_factory=list)  # rewrites of this step already rejected
    max_chars: int = 4000  # the longest instruction that will be accepted


@runtime_checkable
class InstructionProposer(Protocol):
    """Your own rewrite step: a callable from a :class:`RewriteRequest` to the new instruction (None: no rewrite)."""

    def __call__(self, request: RewriteRequest) -> str | None: ...


def checked_instruction(value: object) -> str | None:
    """The proposer's reply as an instruction; a reply of another type is the proposer's bug."""
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"instruction_proposer must return a str or None; got {type(value).__name__}")
