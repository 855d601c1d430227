"""Speculation: doing ahead, in parallel, work the round may ask for, without changing a decision.

The steps only name what they may ask for: the attribution steps the hinted runs of their later levels,
cumulative steps and pruning steps (:class:`InterventionPlan`), the judge whether its round ends with a
validation pass. This layer alone decides what is done ahead: when most of the round's first hinted runs
change nothing, the hinted runs named and the round's candidate checks stacked as if every candidate wins;
and the first rewrite of every predictor at once. Program runs made ahead are not scored: the evaluator
finds them when a step asks for them, and the step scores and pays for the runs it asks for in its own
order, so the metric calls and the decisions are those without speculation under any metric-call budget.
Prompt-LM calls are asked ahead only with no prompt-LM cap, and nothing is done ahead under a task-LM cap or
at one thread (:func:`speculation_helps`): a cap binds in the order the calls are made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import dspy

from ..config import AgentGradConfig
from ..program.evaluation import Evaluator
from ..program.program_state import ProgramState
from ..roles.proposer import Proposer
from ..runtime.budget import Budget
from ..runtime.parallel import parallel_map
from .hinted_calls import InterventionPlan
from .judging.acceptance import Acceptance
from .rewriting import Rewriter
from .state import Cluster, RunState

logger = logging.getLogger("dspy.agentgrad")

#: Share of a round's first hinted runs that must come out unchanged (reused, no metric call) before the round's
#: named hinted runs and candidate checks are run ahead: a hint on a predictor not at fault then usually changes
#: nothing in this program.
SPECULATE_WHEN_REUSED = 0.5

Chain = tuple[dspy.Example, list[ProgramState]]


def speculation_helps(config: AgentGradConfig, budget: Budget) -> bool:
    """Whether the run speculates: with ``speculate`` on, several threads (at one thread nothing runs beside
    anything, and the work done ahead only adds task-LM calls), no task-LM cap (runs made ahead spend task-LM
    calls and tokens the procedure without speculation would not, and a cap binds in the order calls are made) and
    no cap on the task spend (a run made ahead and never used is spend that count never sees)."""
    execution = config.execution
    capped = budget.task_capped or budget.cap_task_spend
    return execution.speculate and execution.num_threads > 1 and not capped


class Speculation:
    """Runs ahead (unscored) the hinted runs the attribution steps name, and prefetches a round's rewrites and
    candidate checks; only work whose checks fit the budget. ``wait_for_start`` waits for the starting program's
    validation pass (the stacked checks run against its scores)."""

    def __init__(
        self,
        config: AgentGradConfig,
        evaluator: Evaluator,
        proposer: Proposer,
        budget: Budget,
        valset: list[dspy.Example],
        state: RunState,
        rewriter: Rewriter,
        acceptance: Acceptance,
        wait_for_start: Callable[[], None],
    ):
        self.config = config
        self.evaluator = evaluator
        self.proposer = proposer
        self.budget = budget
        self.valset = valset
        self.state = state
        self.rewriter = rewriter
        self.acceptance = acceptance
        self.wait_for_start = wait_for_start
        self.speculating = False  # this round's first hinted runs mostly changed nothing (see :meth:`expect`)

    def start_round(self) -> None:
        """Forget the runs made ahead in an earlier round that nothing asked for, and that round's decision."""
        self.drop()
        self.speculating = False

    def drop(self) -> None:
        """Forget the runs made ahead that nothing asked for (their LM usage is counted and journaled)."""
        self.evaluator.ahead.drop()

    def expect(self, plan: InterventionPlan) -> None:
        """Run ``plan``'s hinted runs ahead when this round speculates; a plan with a ``sample`` decides that: with
        reuse on, when at least :data:`SPECULATE_WHEN_REUSED` of the sample came out unchanged."""
        if plan.sample is not None:
            reused = sum(not result.scored for result in plan.sample)
            enabled = self.config.execution.speculate and self.evaluator.reuse
            self.speculating = enabled and bool(plan.sample) and reused >= SPECULATE_WHEN_REUSED * len(plan.sample)
        if self.speculating:
            interventions = plan.interventions()
            if interventions:
                self.evaluator.intervene_ahead(plan.instructions, interventions)

    def before_judging(self, ready: list[Cluster], validates: bool) -> None:
        """What the round's judging will ask, asked ahead: the first rewrites, and when the round speculates and
        its candidates are rewrites alone (the stack is built of rewrites), its candidate checks (``validates``:
        the judge ends the round with a validation pass)."""
        candidates = self.config.proposals.candidates
        if candidates != "demos":
            self.prefetch_rewrites(ready)
        if self.speculating and candidates == "instructions":
            self.wait_for_start()
            self.prefetch_judging(ready, validation=validates)

    def prefetch_rewrites(self, ready: list[Cluster]) -> None:
        """Ask for the first rewrite of every predictor at once.

        Exact: until a predictor's first cluster is judged, neither its instruction nor its rejected
        rewrites change (other predictors' updates do not touch them), so the engine later sends
        the same request and gets the memoized answer. Only clusters whose checks fit the budget,
        only when :meth:`may_ask_ahead`.
        """
        if not self.may_ask_ahead():
            return
        firsts: dict[str, Cluster] = {}
        for cluster in ready:
            firsts.setdefault(cluster.predictor, cluster)
        program = self.state.instructions
        requests = [self.rewriter.request(c) for c in firsts.values() if self.acceptance.affordable(program, c)]
        if len(requests) > 1:
            parallel_map(self.proposer.rewrite, requests, self.config.execution.num_threads)

    def may_ask_ahead(self) -> bool:
        """Prompt-LM calls the sequential procedure may not make are asked only with ``speculate`` on and no
        prompt-LM cap (a rewrite asked ahead could take tokens a call that comes first needs)."""
        return self.config.execution.speculate and not self.budget.prompt_capped

    def prefetch_judging(self, ready: list[Cluster], validation: bool) -> None:
        """Run the round's candidate checks ahead, as if every candidate wins.

        The round's candidates are stacked in the order the engine judges them, each on top
        of the ones before (as acceptance would leave the program; a second cluster of a
        predictor is rewritten from the first one's rewrite, as it would be then). Every
        validation example and each cluster's examples are run under the stack in one parallel
        step, each example's runs in order (:meth:`Evaluator.run_chains_ahead`), unscored. The
        engine then judges each candidate as always, scoring (and paying for) the runs it asks for
        in its own order, with exact early rejection: the decisions and the metric calls do not
        change, under any budget. After a rejection, what was stacked above it is wasted (LM calls,
        no metric call). The stack is cut to the deepest one whose runs are no more than the budget
        left (more could never be scored); one candidate alone is not stacked. Nothing is stacked
        unless :meth:`may_ask_ahead` (the stacked rewrites are prompt-LM calls asked ahead). Without
        ``validation`` (the round's winners wait for the next round's, ``stack_rounds``) only the cluster checks
        are run ahead.
        """
        if not self.may_ask_ahead():
            return
        stack: list[tuple[ProgramState, Cluster]] = []
        program = self.state.instructions
        for cluster in ready:
            if not self.acceptance.affordable(program, cluster):
                break  # the engine would not pay for this rewrite either
            proposal = self.rewriter.rewrite(cluster, program)
            if self.rewriter.unusable(proposal, program.instruction(cluster.predictor), cluster.predictor) is not None:
                continue
            program = program.with_instruction(cluster.predictor, proposal)
            stack.append((program, cluster))
        if len(stack) < 2:
            return  # one candidate: nothing to overlap
        for depth in range(len(stack), 1, -1):
            chains = self._stacked_checks(stack[:depth], validation)
            if self.evaluator.chain_cost(chains) <= self.budget.remaining():
                self.evaluator.run_chains_ahead(chains)
                return
        logger.info("round %d: no stack of candidate checks fits the budget left", self.state.round_index)

    def _stacked_checks(self, stack: list[tuple[ProgramState, Cluster]], validation: bool) -> list[Chain]:
        """Each validation example under every program of the stack (only the top one when the round's
        winners are validated together); each cluster's examples under the programs up to its own
        candidate (its "before" and "after")."""
        before = [self.state.instructions] + [program for program, _ in stack[:-1]]
        validated = [stack[-1][0]] if self.config.judging.validate_together else [program for program, _ in stack]
        chains = [(ex, validated) for ex in self.valset] if validation else []
        for level, (_, cluster) in enumerate(stack):
            chains += [(g.record.example, before[: level + 1] + [stack[level][0]]) for g in cluster.members]
        return chains
