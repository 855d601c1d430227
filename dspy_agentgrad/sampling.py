"""The sample ``AgentGrad.estimate`` pays for: one round in small, measured.

It runs and attributes a few training examples (steps 1-2), then tries one rewrite per
blamed predictor (steps 3-5 without validation): the gradients of its failures, their
clusters, a rewrite of its largest cluster made on top of the earlier winners, and that
rewrite run on every sampled failure blamed on the predictor, then the winners on held-out
training examples. How often a rewrite wins on its cluster and how much of its predictor's
failures it fixes, on the failures it was written from and on others, decide how many rounds
a run has, and none of it can be told from runs and hinted runs alone.
"""

from __future__ import annotations

import time

import dspy

from .config import AgentGradConfig
from .core.attribution import Attribution
from .core.engine import RoundEngine
from .core.round_rules import judging_order
from .core.state import CandidateRecord, Cluster, exact_total
from .program.evaluation import Evaluator
from .program.program_state import ProgramState
from .reporting.projection import SampleStats


def measure_sample(
    config: AgentGradConfig, engine: RoundEngine, sample: list[dspy.Example], held_out: list[dspy.Example] = ()
) -> SampleStats:
    """Pay for ``sample``'s round in small on ``engine`` (a fresh one, over the sample) and say what it measured;
    ``held_out`` (other training examples) tells how much of what the rewrites fixed carries over to new ones."""
    budget, evaluator = engine.budget, engine.evaluator
    started = time.time()
    attribution = engine.attribute(sample)
    seconds = time.time() - started
    report = attribution.report
    stats = SampleStats.of_attribution(
        len(sample),
        attribution.failures,
        report.counts(),
        budget.metric_calls,
        evaluator.reused,
        budget.task_spend,
        task_usage=dict(evaluator.ledger.to_dict()["task"]),
        seconds=seconds,
        examples=len(sample),
    )
    if config.proposals.candidates == "instructions" and any(report.attributed.values()):
        _try_rewrites(config, engine, attribution, sample, list(held_out), stats)
    stats.paid_metric_calls = budget.metric_calls
    stats.paid_prompt_calls = evaluator.ledger.to_dict()["prompt"]["calls"]
    return stats


def _try_rewrites(
    config: AgentGradConfig,
    engine: RoundEngine,
    attribution: Attribution,
    sample: list[dspy.Example],
    held_out: list[dspy.Example],
    stats: SampleStats,
) -> None:
    """One rewrite per blamed predictor, made for its largest cluster of the sample's gradients (at the minimum
    cluster size of 1: the sample is small), in the round's order and on top of the earlier winners as the
    round makes them (a failure blamed on two predictors passes only once both are rewritten). Each is run
    on all of its predictor's sampled failures; a winner's failure counts as fixed when it passes under that
    winner or under the stack of all winners (a later winner that breaks it is validation's to reject).
    The stack of winners then runs on the sample's failures and on ``held_out``: the share of the held-out
    failures it fixes, over the share of the sampled ones, is how much of a rewrite's fix carries over to
    failures it was not written from (defects the sample did not show, or hid behind an earlier step's)."""
    report, start_program = attribution.report, engine.state.instructions
    program, budget, evaluator = start_program, engine.budget, engine.evaluator
    clusters, _ = engine.abstraction.abstract(engine.abstraction.gradients(report, program, 0), 1, program)
    largest: dict[str, Cluster] = {}
    for cluster in judging_order(clusters, report.order):
        largest.setdefault(cluster.predictor, cluster)
    winners: list[tuple[list[dspy.Example], list[bool]]] = []  # each winner's blamed failures, and which it fixed
    paid = ran = repeats = 0
    for name, cluster in largest.items():
        record, candidate = engine.sources.rewrites.propose(cluster, 1, program)
        if candidate is None:
            continue  # a candidate the run could not judge: no win
        in_cluster = {id(g.record) for g in cluster.members}
        members = [g.record.example for g in cluster.members]
        blamed = members + [r.example for r in report.attributed[name] if id(r) not in in_cluster]
        start = budget.metric_calls
        after = evaluator.evaluate(candidate, blamed, "minibatch")
        paid, ran = paid + budget.metric_calls - start, ran + len(blamed)
        before = evaluator.evaluate(program, members, "minibatch")  # paid already, by the attribution or a check
        if exact_total(after[: len(members)]) > exact_total(before):  # the run's cluster check
            winners.append((blamed, [o.score >= config.scores.max_score for o in after]))
            program = candidate
        else:
            repeats += _proposed_again(engine, cluster, program, record)
    stats.rewrites, stats.rewrite_wins = len(largest), len(winners)
    losers = len(largest) - len(winners)
    stats.repeat_share = repeats / losers if losers else None
    stats.check_paid = paid / ran if ran else None
    if not winners:
        return
    stacked = evaluator.evaluate_many([(program, blamed) for blamed, _ in winners], "minibatch")
    fixed = [
        alone or o.score >= config.scores.max_score
        for (_, fixed_alone), outcomes in zip(winners, stacked)
        for alone, o in zip(fixed_alone, outcomes)
    ]
    stats.fix_share = sum(fixed) / len(fixed)
    failed = [e for e, o in zip(sample, attribution.outcomes) if o.score < config.scores.max_score]
    in_sample = _fixed_share(config, evaluator, start_program, program, failed)
    held = _fixed_share(config, evaluator, start_program, program, held_out) if held_out else None
    if held is not None and in_sample:
        stats.carry_over = min(1.0, held / in_sample)


def _proposed_again(engine: RoundEngine, cluster: Cluster, program: ProgramState, lost: CandidateRecord) -> bool:
    """Whether the rewrite role, shown ``lost``'s rewrite as rejected, proposes it again for the same cluster (a
    run's later rounds then judge it on runs already paid for)."""
    engine.state.candidates.append(lost)  # the sample's own engine: its history, not the run's
    return engine.rewriter.rewrite(cluster, program) == lost.instruction


def _fixed_share(
    config: AgentGradConfig, evaluator: Evaluator, before: ProgramState, after: ProgramState, examples: list
) -> float | None:
    """Share of ``examples``' failures under ``before`` that pass under ``after``; None when none failed."""
    runs = evaluator.evaluate_many([(before, examples), (after, examples)], "minibatch")
    pairs = [(b, a) for b, a in zip(*runs) if b.score < config.scores.max_score]
    return sum(a.score >= config.scores.max_score for _, a in pairs) / len(pairs) if pairs else None
