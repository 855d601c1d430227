"""Options of an AgentGrad run: the groups composed, the presets, and what a run records of them.

``AgentGrad(config=AgentGradConfig.from_options(max_rounds=3, ...))`` takes the options by their flat names;
``config.<group>.<field>`` is how the run reads them; ``run.json`` and ``result.json`` record them flat.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from .option_groups import (
    AbstractionOptions,
    AttributionOptions,
    BudgetOptions,
    ExecutionOptions,
    JudgingOptions,
    OutputOptions,
    ProposalOptions,
    ScoreOptions,
)
from .program.hints import PLACEBOS
from .roles.proposer import MAX_FIELD_CHARS
from .runtime.jsonable import to_jsonable

#: Examples scored per step of a cluster or validation check; between steps a candidate that can no longer
#: win is dropped (exact early rejection). A constant, not an option: it changes speed, never a decision.
EVAL_CHUNK_SIZE = 16
#: Constants that were options once: recorded under their old names, so a run's identity stays as it was.
RECORDED_CONSTANTS = {"eval_chunk_size": EVAL_CHUNK_SIZE, "max_field_chars": MAX_FIELD_CHARS}


def worst_case_calls(
    rounds: int, n_predictors: int, n_train: int, n_val: int, train_batch_size: int, schedule_length: int = 1
) -> int:
    """The most metric calls ``rounds`` rounds can take, after one initial validation pass. Per round: the
    batch; one hinted run per failure and predictor; 2(N - 1) cumulative and pruning runs per failure and, with
    two predictors or more, a placebo run per placebo wording and predictor but one; and per gradient (at most one per
    failure and predictor, kept waiting for up to ``schedule_length`` rounds) a candidate whose checks run its
    cluster before and after and one validation pass."""
    b = min(train_batch_size, n_train)
    n = n_predictors
    gradients = schedule_length * b * n
    return n_val + rounds * (b * (1 + n + (2 + len(PLACEBOS)) * max(n - 1, 0)) + gradients * (2 + n_val))


#: Options a run may take without them changing its decisions: not in its fingerprint.
UNRECORDED = ("num_threads", "executor", "embedder", *(f.name for f in fields(OutputOptions)))


@dataclass(frozen=True)
class AgentGradConfig:
    """Every option of a run, in groups: each group's docstring says what its fields are for.

    ``preset`` names the preset (:data:`PRESETS`) the config started from. Build one with flat names through
    :meth:`from_options`, change one with :meth:`with_options`.
    """

    budget: BudgetOptions = field(default_factory=BudgetOptions)
    scores: ScoreOptions = field(default_factory=ScoreOptions)
    attribution: AttributionOptions = field(default_factory=AttributionOptions)
    abstraction: AbstractionOptions = field(default_factory=AbstractionOptions)
    judging: JudgingOptions = field(default_factory=JudgingOptions)
    proposals: ProposalOptions = field(default_factory=ProposalOptions)
    execution: ExecutionOptions = field(default_factory=ExecutionOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    preset: str | None = None

    @classmethod
    def from_options(cls, preset: str | None = None, **options: Any) -> AgentGradConfig:
        """The config of ``preset`` (the defaults when None) with the flat-named ``options`` changed (see
        :meth:`with_options`)."""
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)} or None; got {preset!r}")
        return (cls() if preset is None else PRESETS[preset]).with_options(**options)

    def with_options(self, **options: Any) -> AgentGradConfig:
        """This config with the flat-named ``options`` changed, each group checked.

        An unknown name is a TypeError, as a wrong keyword is; ``num_threads=None`` means
        unchanged; ``max_metric_calls`` or ``max_full_evals`` without ``auto`` turns ``auto`` off, as in
        ``dspy.GEPA(max_metric_calls=N)``.
        """
        if "num_threads" in options and options["num_threads"] is None:
            del options["num_threads"]
        if "auto" not in options and any(options.get(n) is not None for n in ("max_metric_calls", "max_full_evals")):
            options["auto"] = None
        changes: dict[str, dict[str, Any]] = {}
        for name, value in options.items():
            if name not in OPTION_GROUP:
                raise TypeError(f"unknown option {name!r}: the options are the fields help(AgentGrad) lists")
            changes.setdefault(OPTION_GROUP[name], {})[name] = value
        return replace(self, **{group: replace(getattr(self, group), **new) for group, new in changes.items()})

    def options(self) -> dict[str, Any]:
        """Every option under its flat name, ``preset`` included."""
        flat: dict[str, Any] = {}
        for group in GROUPS:
            values = getattr(self, group)
            flat.update({f.name: getattr(values, f.name) for f in fields(values)})
        return {**flat, "preset": self.preset}

    def fingerprint(self) -> dict:
        """The options that change decisions (not threads, logging or stats), flat, with the two constants that
        once were options at their values: what ``run.json`` and ``result.json`` record. Every such option is
        recorded; a ``log_dir`` of an earlier version that lacks some is upgraded when it is opened
        (:mod:`.runtime.migration`)."""
        data = {k: v for k, v in self.options().items() if k not in UNRECORDED}
        data.update(RECORDED_CONSTANTS)
        data["cluster_schedule"] = list(self.abstraction.cluster_schedule)
        if self.proposals.optimize_predictors is not None:
            data["optimize_predictors"] = list(self.proposals.optimize_predictors)
        label_fields = self.attribution.label_fields
        data["label_fields"] = None if label_fields is None else list(label_fields)
        if data["objective_guards"] is not None:
            data["objective_guards"] = dict(data["objective_guards"])
        return data


#: The groups of :class:`AgentGradConfig`, and the group of each option.
GROUPS = tuple(f.name for f in fields(AgentGradConfig) if f.name != "preset")
OPTION_GROUP = {f.name: g.name for g in fields(AgentGradConfig) if g.name in GROUPS for f in fields(g.default_factory)}
#: Whole configs by name (an option passed explicitly wins). "paper": the paper's procedure, every run scored,
#: one hint level and one candidate at a time, each candidate validated on its own and kept only on a strict gain,
#: no cumulative hints, no reflections on hard cases, no pruning of kept rewrites, no stop past the budget in task
#: spend, a large-medium-small cyclic minimum cluster size.
PRESETS = {
    "paper": AgentGradConfig(preset="paper").with_options(
        reuse_calls=False,
        speculate=False,
        val_acceptance="strict",
        validate_together=False,
        stack_rounds=1,
        cumulative_hints=False,
        cluster_schedule=(3, 2, 1),
        reflect_hard_cases=False,
        prune_rewrites=False,
        overdraft_rounds=None,
    ),
}


#: Options on by default whose neutral value is off: a run written before the option existed behaved as off.
BEHAVED_BEFORE = {"prune_rewrites": False, "overdraft_rounds": None}


def option_defaults() -> dict:
    """Each option's neutral value, as the fingerprint writes it: an option a ``log_dir`` written before it existed
    does not record is no difference at this value."""
    return to_jsonable({**AgentGradConfig().options(), **BEHAVED_BEFORE, **RECORDED_CONSTANTS})


def options_help() -> str:
    """Every option, group by group, as the groups' docstrings describe them (for ``help(AgentGrad)``)."""
    parts = []
    for group in fields(AgentGradConfig):
        if group.name in GROUPS:
            doc = group.default_factory.__doc__.replace("\n    ", "\n        ")
            parts.append(f"    config.{group.name}: {doc.strip()}")
    return "\n\n".join(parts)
