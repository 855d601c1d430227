"""The optimizer's LM calls: gradient extraction, gradient abstraction, instruction rewriting.

Each call is retried on transient errors and, if it keeps failing (or fails to parse), skipped:
the caller gets ``None`` and the failure is counted. Results are memoized like program
runs, so a resumed run does not pay for them again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import dspy

from ..program.awaiting import resolved
from ..runtime.budget import Budget, BudgetExhausted, Reservation, worst_case_usage
from ..runtime.jsonable import digest, to_jsonable
from ..runtime.paid_work import PaidWork
from ..runtime.parallel import current_batch
from ..runtime.prompt_gate import GATE_SETTING, PromptGate, install
from ..runtime.redaction import Redactor
from ..runtime.retries import FirstRunsFailed, RetryPolicy, error_kind, is_transient, retried_by_the_lm, setup_fix
from ..runtime.store import Memo
from ..runtime.usage import UsageLedger, empty_usage, track
from .gradient_groups import GradientGroup, normalize_clusters
from .instruction_proposer import InstructionProposer, RewriteRequest, checked_instruction
from .signatures import (
    AbstractGradients,
    ExtractGradient,
    ExtractSystemGradient,
    ReflectOnFailure,
    RewriteInstruction,
    SummarizeGradients,
)

logger = logging.getLogger("dspy.agentgrad")

MAX_FIELD_CHARS = 12000


def format_fields(values: dict[str, Any], max_chars: int = MAX_FIELD_CHARS) -> str:
    """``name: value`` lines, each value cut to ``max_chars`` to keep prompts bounded."""
    lines = []
    for name, value in values.items():
        text = value if isinstance(value, str) else str(to_jsonable(value))
        if len(text) > max_chars:
            text = text[:max_chars] + " [...]"
        lines.append(f"{name}: {text}")
    return "\n".join(lines)


@dataclass
class StepRole:
    """What the prompt LM is told about a step's place in the program."""

    signature: str  # this step's fields
    program_steps: str  # every step in execution order, with its fields


def numbered(texts: list[str]) -> str:
    """Texts numbered from 0, as the aggregator role refers to them."""
    return "\n".join(f"[{i}] {t}" for i, t in enumerate(texts))


def is_no_change(text: str) -> bool:
    """Whether a reflection says the step needs no change (its answer begins "No change")."""
    return " ".join(text.lower().split()).strip("\"'*. ").startswith("no change")


class Proposer:
    """The optimizer's LM roles; each call is paid once (journaled), retried, and metered against the budget."""

    def __init__(
        self,
        prompt_model: Any,
        memo: Memo,
        budget: Budget,
        ledger: UsageLedger,
        retry: RetryPolicy,
        price: Callable[[dict], float] | None = None,
        instruction_proposer: InstructionProposer | None = None,
        embedder: Callable[[list[str]], Any] | None = None,
    ):
        self.prompt_model = prompt_model
        self.instruction_proposer = instruction_proposer
        self.embedder = embedder
        self.price = price
        self.work: PaidWork[dict] = PaidWork(memo, dict, dict)
        self.budget = budget
        self.ledger = ledger
        self.retry = retry
        self.failures: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._answered = False  # a prompt-LM call succeeded in this compile

    def _call(self, role: str, signature: type[dspy.Signature], inputs: dict[str, Any]) -> dict | None:
        key = f"role:{signature.__name__}:{digest(inputs)}"
        bound = worst_case_usage(self.prompt_model, signature, inputs) if self.budget.prompt_capped else None
        return self._settle(role, key, lambda: self._predict(signature, inputs), bound)

    def _predict(self, signature: type[dspy.Signature], inputs: dict[str, Any]) -> dict:
        with dspy.context(lm=self.prompt_model, trace=None):
            prediction = dspy.Predict(signature)(**inputs)
        return to_jsonable(dict(prediction.items()))

    def _settle(
        self,
        role: str,
        key: str,
        produce: Callable[[], dict],
        bound: dict[str, int] | None = None,
        user_code: bool = False,
    ) -> dict | None:
        """Outputs of a journaled, counted, retried call of ``produce``; None when it kept failing.

        ``bound`` is one attempt's worst-case usage: each attempt is reserved against the prompt-LM
        caps before it starts (an attempt that cannot be reserved is not made: the cap stops the run)
        and settled at what it really used. ``user_code``: ``produce`` runs the user's code, whose LM requests
        cannot be bounded in advance; each is reserved as it is sent (:mod:`..runtime.prompt_gate`).
        """
        paid_now: list[bool] = []

        def ask() -> dict:
            paid_now.append(True)
            return self._ask(role, key, produce, bound, user_code)

        record, new = self.work.settle(key, ask)
        usage = record["usage"] if new else empty_usage()
        if new and not paid_now:  # from the journal of an earlier run: admitted and counted as when it was paid
            self._replay_reservations(key, record, bound)
        if new:
            self.ledger.add("prompt", role, usage)
            with self._lock:
                if record["outputs"] is None:
                    self.failures[role] += 1
                for kind in record.get("errors", []):
                    self.failures[f"{role}:{kind}"] += 1
            if record["outputs"] is None:
                logger.warning("the %s role failed (%s); skipping it", role, ", ".join(record.get("errors", [])))
        return record["outputs"]

    def _price(self, usage: dict) -> float:
        return self.price(usage) if self.price else 0.0

    def _ask(
        self, role: str, key: str, produce: Callable[[], dict], bound: dict[str, int] | None, user_code: bool
    ) -> dict:
        """Call ``produce``, retrying transient errors only (see :mod:`retries`); each attempt reserved and
        settled on its own. When a retry cannot be reserved, what was paid is counted and the cap stops the run."""
        usage, errors = empty_usage(), []
        for attempt in range(1, self.retry.attempts + 1):
            try:
                reservation = self._reserve(f"{key}#{attempt}", bound)
            except BudgetExhausted:
                self.ledger.add("prompt", role, usage)
                raise
            used = empty_usage()
            gate = self._gate(f"{key}#{attempt}") if user_code else None
            try:
                with track() as used, dspy.context(**{GATE_SETTING: gate}) if gate else nullcontext():
                    outputs = produce()
                error = None
            except Exception as exc:
                outputs, error = None, exc
            finally:
                tokens = used["prompt_tokens"] + used["completion_tokens"]
                settled = (gate.settled_tokens, gate.settled_cost) if gate else (0, 0.0)
                self.budget.settle(reservation, tokens - settled[0], self._price(used) - settled[1])
            for k in usage:
                usage[k] += used[k]
            if gate is not None and gate.refused is not None:  # the cap stops the run, even if the user's code
                self.ledger.add("prompt", role, usage)  # caught the refusal
                raise gate.refused
            if error is None:
                self._answered = True
                return {"outputs": outputs, "usage": usage, "errors": errors}
            fix = setup_fix(type(error).__name__)
            if fix is not None and not self._answered:  # never answered: the LM cannot be used as configured
                raise FirstRunsFailed(
                    f"the prompt LM failed with {type(error).__name__} on its first call: "
                    f"{Redactor.for_lms([self.prompt_model])(str(error)).strip()}\nTo fix: {fix}"
                ) from None
            errors.append(error_kind(error))
            if retried_by_the_lm(error) or not is_transient(error):  # dspy.LM retried it already, or not worth it
                break
            if attempt < self.retry.attempts:
                self.retry.wait(attempt, error)
        return {"outputs": None, "usage": usage, "errors": errors}

    def _replay_reservations(self, key: str, record: dict, bound: dict[str, int] | None) -> None:
        """Reserve each attempt a journaled call made, as when it was paid, and settle its usage: the caps then
        decide a compile again on this ``log_dir`` as they decided the first time (a call refused then is
        refused again, nothing is paid again)."""
        usage = record["usage"]
        attempts = max(1, len(record.get("errors", [])) + (record["outputs"] is not None))
        for attempt in range(1, attempts + 1):
            reservation = self._reserve(f"{key}#{attempt}", bound)
            last = attempt == attempts
            tokens = usage["prompt_tokens"] + usage["completion_tokens"] if last else 0
            self.budget.settle(reservation, tokens, self._price(usage) if last else 0.0)

    def _gate(self, key: str) -> PromptGate | None:
        """A gate for the LM requests of user code, where a prompt-LM cap is set."""
        if not self.budget.prompt_capped:
            return None
        install()
        return PromptGate(self.budget, key, self._price, current_batch())

    def _reserve(self, key: str, bound: dict[str, int] | None) -> Reservation | None:
        if bound is None:
            return None
        return self.budget.reserve(key, sum(bound.values()), self._price(bound), current_batch())

    def fields(self, values: dict[str, Any]) -> str:
        """Field values as prompt text, each cut to :data:`MAX_FIELD_CHARS`."""
        return format_fields(values)

    def gradient(
        self, role: StepRole, instruction: str, step_inputs: dict, original: dict, corrected: dict
    ) -> str | None:
        """Step 3 with agent supervision: what the predictor should change, from its output and the corrected one."""
        out = self._call(
            "gradient",
            ExtractGradient,
            {
                "program_steps": role.program_steps,
                "step_signature": role.signature,
                "current_instruction": instruction,
                "step_inputs": self.fields(step_inputs),
                "original_output": self.fields(original),
                "corrected_output": self.fields(corrected),
            },
        )
        return (out or {}).get("gradient") or None

    def system_gradient(
        self, instruction: str, program_inputs: dict, program_output: dict, expected: str
    ) -> str | None:
        """Step 3 without a pseudo-label: a gradient from the program's output and the expected one."""
        out = self._call(
            "gradient",
            ExtractSystemGradient,
            {
                "current_instruction": instruction,
                "program_inputs": self.fields(program_inputs),
                "program_output": self.fields(program_output),
                "expected": expected,
            },
        )
        return (out or {}).get("gradient") or None

    def reflection(
        self,
        role: StepRole,
        instruction: str,
        step_inputs: dict,
        step_output: dict,
        program_output: dict,
        expected: str,
    ) -> str | None:
        """Step 3 for a hard case (no hint fixed it): what this predictor should change, judged from its own
        output in the failed run; None when the role finds nothing to change (or failed)."""
        out = self._call(
            "reflect",
            ReflectOnFailure,
            {
                "program_steps": role.program_steps,
                "step_signature": role.signature,
                "current_instruction": instruction,
                "step_inputs": self.fields(step_inputs),
                "step_output": self.fields(step_output),
                "program_output": self.fields(program_output),
                "expected": expected,
            },
        )
        text = ((out or {}).get("gradient") or "").strip()
        return None if not text or is_no_change(text) else text

    def abstract(self, instruction: str, gradients: list[str], minimum: int) -> list[GradientGroup] | None:
        """Groups of gradients with their generalized gradient; None when the call failed. The aggregator
        is told ``minimum``, the fewest members a cluster needs this round, and asked to merge related
        corrections to reach it."""
        out = self._call(
            "abstract",
            AbstractGradients,
            {"current_instruction": instruction, "gradients": numbered(gradients), "min_cluster_size": minimum},
        )
        if out is None:
            return None
        raw = [
            (c.get("members", []), c.get("generalized_gradient", ""))
            for c in out.get("clusters") or []
            if isinstance(c, dict)
        ]
        clusters = normalize_clusters(raw, len(gradients))
        return clusters or None

    def summarize(self, instruction: str, gradients: list[str]) -> str | None:
        """One generalized gradient for a group of gradients (TF-IDF or embedding clustering)."""
        out = self._call(
            "abstract", SummarizeGradients, {"current_instruction": instruction, "gradients": numbered(gradients)}
        )
        return (out or {}).get("generalized_gradient") or None

    def rewrite(self, request: RewriteRequest) -> str | None:
        """A new instruction from the rewrite role, or from the user's ``instruction_proposer``."""
        if self.instruction_proposer is not None:
            out = self._settle(
                "rewrite",
                f"role:instruction_proposer:{digest(asdict(request))}",
                lambda: {"new_instruction": checked_instruction(resolved(self.instruction_proposer(request)))},
                user_code=True,
            )
        else:
            shown = [
                f"Case {i + 1}\ninputs:\n{self.fields(inputs)}\noriginal output:\n{self.fields(original)}\n"
                f"corrected output:\n{self.fields(corrected)}"
                for i, (inputs, original, corrected) in enumerate(request.examples)
            ]
            out = self._call(
                "rewrite",
                RewriteInstruction,
                {
                    "step_signature": request.step_signature,
                    "current_instruction": request.current_instruction,
                    "feedback": request.generalized_gradient,
                    "examples": "\n\n".join(shown) or "(none)",
                    "rejected_rewrites": numbered(request.rejected) or "(none)",
                    "max_instruction_chars": request.max_chars,
                },
            )
        text = ((out or {}).get("new_instruction") or "").strip()
        return text or None

    def embed(self, texts: list[str]) -> list[list[float]] | None:
        """One embedding vector per text from ``embedder``; None when it kept failing."""

        def vectors() -> dict:
            rows = [[float(x) for x in row] for row in self.embedder(list(texts))]
            if len(rows) != len(texts):
                raise ValueError(f"the embedder returned {len(rows)} vectors for {len(texts)} texts")
            return {"vectors": rows}

        out = self._settle("embed", f"embed:{digest(list(texts))}", vectors)
        return (out or {}).get("vectors")
