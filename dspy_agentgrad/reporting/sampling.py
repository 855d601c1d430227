"""The sample ``AgentGrad.estimate`` pays for: one round in small, measured.

It runs and attributes a few training examples (steps 1-2), then tries one rewrite per
blamed predictor (steps 3-5 without validation): the gradients of its failures, their
clusters, a rewrite of its largest cluster, and that rewrite run on every sampled failure
blamed on the predictor. How often a rewrite wins on its cluster and how much of its
predictor's failures it fixes decide how many rounds a run has, and neither can be told
from runs and hinted runs alone.
"""

from __future__ import annotations

import time

import dspy

from ..config import AgentGradConfig
from ..core.engine import RoundEngine
from ..core.state import AttributionReport, Cluster, exact_total
from .estimate import SampleStats


def measure_sample(config: AgentGradConfig, engine: RoundEngine, sample: list[dspy.Example]) -> SampleStats:
    """Pay for ``sample``'s round in small on ``engine`` (a fresh one, over the sample) and say what it measured."""
    budget, evaluator = engine.budget, engine.evaluator
    started = time.time()
    attribution = engine.attribute(sample)
    seconds = time.time() - started
    report = attribution.report
    failures = sum(o.score < config.max_score for o in attribution.outcomes)
    runs, reused = budget.metric_calls, evaluator.reused
    unfixed = runs + reused - len(sample) - sum(report.counts().values())  # hinted runs that fixed nothing
    stats = SampleStats(
        runs=runs,
        failure_rate=failures / len(sample),
        task_usage=dict(evaluator.ledger.to_dict()["task"]),
        seconds=seconds,
        hints_per_failure=(runs - len(sample)) / failures if failures else None,
        blame={name: n / failures for name, n in report.counts().items()} if failures else None,
        reuse_rate=min(1.0, reused / unfixed) if unfixed > 0 else 0.0,
        examples=len(sample),
    )
    if config.candidates == "instructions" and any(report.attributed.values()):
        _try_rewrites(config, engine, report, stats)
    stats.paid_metric_calls = budget.metric_calls
    stats.paid_prompt_calls = evaluator.ledger.to_dict()["prompt"]["calls"]
    return stats


def _try_rewrites(config: AgentGradConfig, engine: RoundEngine, report: AttributionReport, stats: SampleStats) -> None:
    """One rewrite per blamed predictor, made for its largest cluster of the sample's gradients (at the
    minimum cluster size of 1: the sample is small) and run on all of the predictor's sampled failures."""
    program, budget, evaluator = engine.state.instructions, engine.budget, engine.evaluator
    clusters, _ = engine.abstraction.abstract(engine.abstraction.gradients(report, program, 0), 1, program)
    largest: dict[str, Cluster] = {}
    for cluster in sorted(clusters, key=lambda c: -len(c.members)):
        largest.setdefault(cluster.predictor, cluster)
    wins = fixed = blamed_of_winners = paid = ran = 0
    for name, cluster in largest.items():
        proposal = engine.rewriter.rewrite(cluster, program)
        if engine.rewriter.unusable(proposal, program[name]) is not None:
            continue  # a candidate the run could not judge: no win
        in_cluster = {id(g.record) for g in cluster.members}
        members = [g.record.example for g in cluster.members]
        blamed = members + [r.example for r in report.attributed[name] if id(r) not in in_cluster]
        start = budget.metric_calls
        after = evaluator.evaluate(program.with_instruction(name, proposal), blamed, "minibatch")
        paid, ran = paid + budget.metric_calls - start, ran + len(blamed)
        before = evaluator.evaluate(program, members, "minibatch")  # the attribution's runs: no metric call
        if exact_total(after[: len(members)]) > exact_total(before):  # the run's cluster check
            wins += 1
            fixed += sum(o.score >= config.max_score for o in after)
            blamed_of_winners += len(blamed)
    stats.rewrites, stats.rewrite_wins = len(largest), wins
    stats.fix_share = fixed / blamed_of_winners if blamed_of_winners else None
    stats.check_paid = paid / ran if ran else None
