"""The AgentGrad round engine.

One round: failure set -> sequential intervention in reverse execution order ->
gradient per attributed failure -> semantic abstraction under the cyclic
minimum-cluster-size schedule -> updates in descending cluster size with
two-stage acceptance. The engine owns the loop and its stop rules and reports
each step as a typed event (:mod:`dspy_agentgrad.callbacks`). Steps 1-2 are the
:class:`~dspy_agentgrad.attribution.Attributor`'s. It makes no LM call itself:
program runs go through the :class:`Evaluator`, LM roles through the :class:`Proposer`.
"""

from __future__ import annotations

import contextvars
import logging
import random
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

import dspy

from .attribution import Attributor, HintFn
from .budget import BudgetExhausted
from .callbacks import (
    AttributionDone,
    CandidateJudged,
    CandidateProposed,
    Dispatcher,
    RoundEnd,
    RoundStart,
    RunEnd,
    RunStart,
    ValidationScored,
)
from .clustering import GradientGroup, embedding_groups, min_cluster_size, random_minibatches, tfidf_groups
from .config import AgentGradConfig
from .demonstrations import added_demos, demo_of
from .evaluation import Evaluator, cannot_clear, exact_total
from .instruction_proposer import RewriteRequest
from .jsonable import example_key
from .parallel import in_background, parallel_map, shared_threads
from .program_state import ProgramState
from .proposer import Proposer, StepRole
from .results import AttributionRecord, AttributionReport, CandidateRecord, RoundRecord
from .tracing import Outcome

logger = logging.getLogger("dspy_agentgrad")

#: Cases of the cluster (original vs corrected output) and rejected rewrites the rewrite role sees.
REWRITE_EXAMPLES = 3
REJECTED_SHOWN = 5


@dataclass
class Gradient:
    """A sample-level textual gradient for one predictor, from one attributed failure."""

    predictor: str
    record: AttributionRecord
    text: str
    round: int


@dataclass
class Cluster:
    """Gradients of one predictor that ask for one correction, with the generalized gradient."""

    predictor: str
    members: list[Gradient]
    text: str


class BatchSampler:
    """Epoch-shuffled training batches, reproducible from the seed."""

    def __init__(self, size: int, batch_size: int, rng: random.Random):
        self.size, self.batch_size, self.rng = size, min(batch_size, size), rng
        self.queue: list[int] = []

    def next(self) -> list[int]:
        batch: list[int] = []
        while len(batch) < self.batch_size:
            if not self.queue:
                self.queue = list(range(self.size))
                self.rng.shuffle(self.queue)
            index = self.queue.pop(0)
            if index not in batch:
                batch.append(index)
        return batch


class RoundEngine:
    def __init__(
        self,
        config: AgentGradConfig,
        evaluator: Evaluator,
        proposer: Proposer,
        hint_fn: HintFn,
        signatures: dict[str, str],
        instructions: dict[str, str],
        trainset: list[dspy.Example],
        valset: list[dspy.Example],
        emit: Dispatcher | None = None,
    ):
        self.config = config
        self.evaluator = evaluator
        self.proposer = proposer
        self.signatures = signatures
        self.instructions = ProgramState.of(instructions)  # the current program: instructions and added demos
        self.trainset = trainset
        self.valset = valset
        self.emit = emit or Dispatcher()
        self.attributor = Attributor(config, evaluator, hint_fn)
        self.rng = random.Random(config.seed)
        self.sampler = BatchSampler(len(trainset), config.train_batch_size, self.rng)
        self.max_score = config.max_score
        self.best_val_score: float | None = None
        self.best_val_scores: list[float] = []  # per validation example, of the best program so far
        self.best_val_total = Fraction(0)  # exact, for acceptance decisions
        self.initial_val_score: float | None = None
        self.rounds: list[RoundRecord] = []
        self.candidates: list[CandidateRecord] = []
        self.val_history: list[tuple[int, float]] = []
        self.waiting: list[Gradient] = []
        self.round_index = 0
        self.stop_reason = "not started"
        self.interrupted = False
        self._validation: Future | None = None  # the starting program's validation pass, while it runs

    # ---- steps 1-2 -------------------------------------------------------------------------
    def attribute(
        self, examples: list[dspy.Example], phase: str = "evaluate"
    ) -> tuple[AttributionReport, list[Outcome]]:
        """Failure set and sequential intervention for the current program (see :class:`Attributor`)."""
        return self.attributor.attribute(self.instructions, examples, self.round_index, phase)

    # ---- step 3 ------------------------------------------------------------------------------
    def gradients(self, report: AttributionReport) -> list[Gradient]:
        """One gradient per attributed failure of a predictor that may change. With ``candidates="demos"`` no
        rewrite needs one: the text is the pseudo-label itself (no LM call), which clustering groups, and
        leaking pseudo-labels are left out (they can make no demonstration)."""
        frozen = self.config.frozen(report.order)  # blamed and reported, never rewritten: no gradient to pay for
        items = [(name, rec) for name in report.order if name not in frozen for rec in report.attributed.get(name, [])]
        if self.config.candidates == "demos":
            return [
                Gradient(name, rec, f"{name} should write {self.proposer.fields(rec.corrected)}", self.round_index)
                for name, rec in items
                if demo_of(rec) is not None
            ]
        steps = "\n".join(f"{i + 1}. {name}: {self.signatures.get(name, '')}" for i, name in enumerate(report.order))

        def extract(item: tuple[str, AttributionRecord]) -> str | None:
            name, rec = item
            if self.config.agent_supervision and rec.corrected:
                role = StepRole(self.signatures.get(name, ""), steps)
                return self.proposer.gradient(role, self.instructions[name], rec.inputs, rec.original, rec.corrected)
            expected = self.proposer.fields(dict(rec.example.labels()))
            if rec.feedback:
                expected += f"\nfeedback: {rec.feedback}"
            return self.proposer.system_gradient(
                self.instructions[name], dict(rec.example.inputs()), rec.program_outputs, expected
            )

        texts = parallel_map(extract, items, self.config.num_threads)
        return [Gradient(name, rec, text, self.round_index) for (name, rec), text in zip(items, texts) if text]

    # ---- step 4 ------------------------------------------------------------------------------
    def abstract(self, pool: list[Gradient], minimum: int) -> tuple[list[Cluster], list[Gradient]]:
        """Clusters that meet ``minimum``, and the gradients that wait for a later round.

        The predictors are abstracted concurrently (their calls are independent); the result is
        assembled in pool order, so it does not depend on the thread count.
        """
        ready: list[Cluster] = []
        waiting: list[Gradient] = []
        by_predictor: dict[str, list[Gradient]] = {}
        for g in pool:
            by_predictor.setdefault(g.predictor, []).append(g)
        if not self.config.semantic_abstraction:
            for name, grads in by_predictor.items():
                size = max(self.config.cluster_schedule)
                for batch in random_minibatches(len(grads), size, self.rng):
                    text = "\n".join(f"- {grads[i].text}" for i in batch)
                    ready.append(Cluster(name, [grads[i] for i in batch], text))
            return ready, waiting
        names = list(by_predictor)
        grouped = parallel_map(
            lambda name: self._groups(name, [g.text for g in by_predictor[name]], minimum),
            names,
            self.config.num_threads,
        )
        for name, groups in zip(names, grouped):
            grads = by_predictor[name]
            for group in groups:
                members = [grads[i] for i in group.members]
                if len(members) < minimum:  # the aggregator was asked to reach the minimum; this is the safety net
                    waiting.extend(members)
                else:
                    ready.append(Cluster(name, members, group.text or grads[group.members[0]].text))
        return ready, waiting

    def _groups(self, name: str, texts: list[str], minimum: int) -> list[GradientGroup]:
        if self.config.candidates == "demos":  # pseudo-labels, not advice: grouped by their words, no LM call
            return [GradientGroup(members, texts[members[0]]) for members in tfidf_groups(texts)]
        if self.config.clustering == "lm":
            groups = self.proposer.abstract(self.instructions[name], texts, minimum)
            if groups is not None:
                return groups
            logger.warning("aggregator failed for %s; grouping its %d gradients with TF-IDF", name, len(texts))
        vectors = self.proposer.embed(texts) if self.config.clustering == "embedding" else None
        if self.config.clustering == "embedding" and vectors is None:
            logger.warning("embedder failed for %s; grouping its %d gradients with TF-IDF", name, len(texts))
        grouped = tfidf_groups(texts) if vectors is None else embedding_groups(vectors)
        out = []
        for members in grouped:
            if len(members) == 1:
                text = texts[members[0]]
            else:
                text = self.proposer.summarize(self.instructions[name], [texts[i] for i in members])
            if text:
                out.append(GradientGroup(members, text))
        return out

    # ---- step 5 ------------------------------------------------------------------------------
    def rewrite_request(self, cluster: Cluster, program: ProgramState | None = None) -> RewriteRequest:
        """What the rewrite role sees for ``cluster``: feedback, a few cases, this step's rejected rewrites.
        ``program``: the instructions to rewrite from (the current ones by default)."""
        name = cluster.predictor
        shown = [
            (g.record.inputs, g.record.original, g.record.corrected)
            for g in cluster.members[:REWRITE_EXAMPLES]
            if g.record.corrected
        ]
        rejected = [c.instruction for c in self.candidates if c.predictor == name and not c.accepted and c.instruction]
        return RewriteRequest(
            predictor=name,
            step_signature=self.signatures[name],
            current_instruction=(program or self.instructions)[name],
            generalized_gradient=cluster.text,
            gradients=[g.text for g in cluster.members],
            examples=shown,
            rejected=rejected[-REJECTED_SHOWN:],
            max_chars=self.config.max_instruction_chars,
        )

    def prefetch_rewrites(self, ready: list[Cluster]) -> None:
        """Ask for the first rewrite of every predictor at once.

        Exact: until a predictor's first cluster is judged, neither its instruction nor its rejected
        rewrites change (other predictors' updates do not touch them), so :meth:`update` later sends
        the same request and gets the memoized answer. Only clusters whose checks fit the budget.
        """
        firsts: dict[str, Cluster] = {}
        for cluster in ready:
            firsts.setdefault(cluster.predictor, cluster)
        remaining = self.evaluator.budget.remaining()
        requests = [
            self.rewrite_request(c) for c in firsts.values() if self._check_cost(self.instructions, c) <= remaining
        ]
        if len(requests) > 1:
            parallel_map(self.proposer.rewrite, requests, self.config.num_threads)

    def prefetch_judging(self, ready: list[Cluster]) -> None:
        """While speculating, run the round's candidate checks ahead, as if every candidate wins.

        The round's candidates are stacked in the order :meth:`update` judges them, each on top
        of the ones before (as acceptance would leave the program; a second cluster of a
        predictor is rewritten from the first one's rewrite, as it would be then). Every
        validation example and each cluster's examples are run under the stack in one parallel
        step, each example's runs in order (:meth:`Evaluator.evaluate_chains`). :meth:`update`
        then judges each candidate as always and finds its runs and rewrite done; after a
        rejection, what was stacked above it is wasted and the next checks are paid as usual.
        The decisions do not change. The stack is cut to the deepest one whose runs all fit in the
        budget left (they are charged before they start; runs that take an earlier score are given
        back when they end); one candidate alone is not stacked.
        """
        self.finish_validation()
        stack: list[tuple[ProgramState, Cluster]] = []
        program = self.instructions
        for cluster in ready:
            if self._check_cost(program, cluster) > self.evaluator.budget.remaining():
                break  # update() would not pay for this rewrite either
            proposal = self.proposer.rewrite(self.rewrite_request(cluster, program))
            current = program[cluster.predictor]
            if (
                proposal is None
                or proposal.strip() == current.strip()
                or len(proposal) > self.config.max_instruction_chars
            ):
                continue
            program = program.with_instruction(cluster.predictor, proposal)
            stack.append((program, cluster))
        if len(stack) < 2:
            return  # one candidate: nothing to overlap
        # the deepest stack whose runs, all charged before they start, fit the budget left
        for depth in range(len(stack), 1, -1):
            chains = self._stacked_checks(stack[:depth])
            if self.evaluator.chain_cost(chains) <= self.evaluator.budget.remaining():
                self.evaluator.evaluate_chains(chains, "validate")
                return
        logger.info("round %d: no stack of candidate checks fits the budget left", self.round_index)

    def _check_cost(self, program: ProgramState, cluster: Cluster) -> int:
        """The most metric calls judging a candidate for ``cluster`` on ``program`` can take: the cluster's
        runs under ``program`` not paid yet, its runs under the candidate, and one validation pass."""
        examples = [g.record.example for g in cluster.members]
        return self.evaluator.cost(program, examples) + len(examples) + len(self.valset)

    def _stacked_checks(self, stack: list[tuple[ProgramState, Cluster]]) -> list[tuple[dspy.Example, list]]:
        """Each validation example under every program of the stack; each cluster's examples under the
        programs up to its own candidate (its "before" and "after")."""
        before = [self.instructions] + [program for program, _ in stack[:-1]]
        chains = [(ex, [program for program, _ in stack]) for ex in self.valset]
        for level, (_, cluster) in enumerate(stack):
            chains += [(g.record.example, before[: level + 1] + [stack[level][0]]) for g in cluster.members]
        return chains

    def update(self, cluster: Cluster, minimum: int) -> CandidateRecord:
        """Rewrite for one cluster, then two-stage acceptance with exact early rejection.

        The candidate must beat the current program on its cluster, then on validation
        (``val_acceptance``: strictly, or at least equal). Either check stops as soon as the
        candidate can no longer win (:meth:`Evaluator.race`); validation scores the examples the
        current program does worst on first, where a losing candidate shows it soonest.
        """
        self.finish_validation()
        name = cluster.predictor
        current = self.instructions[name]
        record = CandidateRecord(self.round_index, name, len(cluster.members), minimum, cluster.text, current, None)
        self._check_budget(cluster)  # before paying for the rewrite
        proposal = self.proposer.rewrite(self.rewrite_request(cluster))
        if proposal is None or proposal.strip() == current.strip():
            record.reason = "rewrite failed" if proposal is None else "rewrite unchanged"
            return record
        record.instruction = proposal
        if len(proposal) > self.config.max_instruction_chars:
            record.reason = f"rewrite longer than max_instruction_chars={self.config.max_instruction_chars}"
            return record
        self.emit(
            "on_candidate_proposed",
            CandidateProposed(self.round_index, name, len(cluster.members), cluster.text, proposal),
        )
        self._try(record, self.instructions.with_instruction(name, proposal), cluster)
        return record

    def update_demos(self, cluster: Cluster, minimum: int) -> CandidateRecord:
        """Demonstrations from the cluster's pseudo-labels (no LM call), judged like a rewrite."""
        self.finish_validation()
        name = cluster.predictor
        current = self.instructions[name]
        record = CandidateRecord(
            self.round_index, name, len(cluster.members), minimum, cluster.text, current, None, kind="demos"
        )
        demos = added_demos(
            self.instructions.demos_of(name), [g.record for g in cluster.members], self.config.max_demos
        )
        if demos is None:
            record.reason = "no new demonstration (each pseudo-label leaks or is shown already)"
            return record
        self._check_budget(cluster)
        record.demos = demos
        shown = f"{len(demos)} demonstration(s): " + "; ".join(self.proposer.fields(d) for d in demos)
        self.emit(
            "on_candidate_proposed",
            CandidateProposed(self.round_index, name, len(cluster.members), cluster.text, shown),
        )
        self._try(record, self.instructions.with_demos(name, demos), cluster)
        return record

    def _check_budget(self, cluster: Cluster) -> None:
        needed = self._check_cost(self.instructions, cluster)
        if needed > self.evaluator.budget.remaining():
            raise BudgetExhausted(f"the next candidate check needs up to {needed} metric calls")

    def _try(self, record: CandidateRecord, candidate: ProgramState, cluster: Cluster) -> None:
        """Two-stage acceptance of ``candidate``; the current program becomes it when it wins."""
        start = self.evaluator.budget.metric_calls
        self._judge(record, candidate, [g.record.example for g in cluster.members])
        record.metric_calls = self.evaluator.budget.metric_calls - start
        if record.accepted:
            self.instructions = candidate
            self.val_history.append((self.evaluator.budget.metric_calls, self.best_val_score))

    def _judge(self, record: CandidateRecord, candidate: ProgramState, examples: list[dspy.Example]) -> None:
        chunk, top = self.config.eval_chunk_size, self.max_score
        if len(examples) <= chunk:  # one batch for both sides of the cluster check
            before_out, after_out = self.evaluator.evaluate_many(
                [(self.instructions, examples), (candidate, examples)], "minibatch"
            )
            before, after = exact_total(before_out), exact_total(after_out)
        else:
            before = exact_total(self.evaluator.evaluate(self.instructions, examples, "minibatch"))
            after = self.evaluator.race(
                candidate, examples, "minibatch", before, strict=True, max_score=top, chunk_size=chunk
            ).total
        record.cluster_score_before = float(before / len(examples))
        record.cluster_score_after = None if after is None else float(after / len(examples))
        if after is None or after <= before:
            record.reason = "no gain on its cluster"
            return
        order = sorted(range(len(self.valset)), key=lambda i: (self.best_val_scores[i], i))
        strict = self.config.val_acceptance == "strict"
        race = self.evaluator.race(
            candidate,
            [self.valset[i] for i in order],
            "validate",
            self.best_val_total,
            strict=strict,
            max_score=top,
            chunk_size=chunk,
        )
        if race.stopped_early:
            record.reason = f"no gain on validation (stopped after {race.scored}/{len(self.valset)}: cannot win)"
            return
        record.val_score = float(race.total / len(self.valset))
        self.emit(
            "on_validation_scored",
            ValidationScored(
                self.round_index,
                record.val_score,
                max(record.val_score, self.best_val_score),
                self.evaluator.budget.metric_calls,
                record,
            ),
        )
        if cannot_clear(race.total, self.best_val_total, strict):
            record.reason = "no gain on validation"
            return
        record.accepted, record.reason = (
            True,
            "gain on cluster and validation"
            if race.total > self.best_val_total
            else "gain on cluster, equal on validation",
        )
        self._set_best(self.evaluator.evaluate(candidate, self.valset, "validate"))  # all cached: free

    def _record(self, round_record: RoundRecord, candidate: CandidateRecord) -> None:
        self.candidates.append(candidate)
        round_record.candidates += 1
        round_record.accepted += candidate.accepted
        logger.info(
            "round %d: %s %s update for %s (cluster of %d): %s; cluster %s -> %s, val %s (best %.4f)",
            candidate.round,
            "ACCEPTED" if candidate.accepted else "rejected",
            candidate.kind,
            candidate.predictor,
            candidate.cluster_size,
            candidate.reason,
            candidate.cluster_score_before,
            candidate.cluster_score_after,
            candidate.val_score,
            self.best_val_score,
        )
        judged = CandidateJudged(candidate, self.best_val_score, self.evaluator.budget.metric_calls)
        self.emit("on_candidate_accepted" if candidate.accepted else "on_candidate_rejected", judged)

    def _set_best(self, outcomes: list[Outcome]) -> None:
        self.best_val_scores = [o.score for o in outcomes]
        self.best_val_total = exact_total(outcomes)
        self.best_val_score = float(self.best_val_total / len(outcomes)) if outcomes else 0.0

    # ---- the loop -----------------------------------------------------------------------------
    def run(self, max_rounds: int | None, resumed: bool = False) -> str:
        """Validate the starting program, then run rounds until a stop rule holds; returns the reason.

        Stops: ``max_rounds``; no failure left when the batch is the whole training set; a budget
        cap (the step that would exceed it is not started); as many rounds in a row without a metric
        call as the cluster schedule is long (nothing new was run or scored: nothing left to learn); Ctrl-C.

        The starting program's validation pass is needed first by the first candidate's check, so
        with several threads it runs beside the first round's attribution and proposals (sharing
        ``num_threads``), when the training and validation examples are distinct.
        """
        sizes, cap = (len(self.trainset), len(self.valset)), self.evaluator.budget.max_metric_calls
        self.emit("on_run_start", RunStart(list(self.instructions), *sizes, cap, max_rounds, resumed))
        with ThreadPoolExecutor(max_workers=1) as background, shared_threads(self.config.num_threads):
            try:
                self._start_validation(background)
                idle_rounds = 0
                while max_rounds is None or self.round_index < max_rounds:
                    spent = self.evaluator.budget.metric_calls
                    record = self.run_round()
                    if record.failures == 0 and record.batch_size == len(self.trainset):
                        self.stop_reason = "no failures left on the training set"
                        break
                    idle_rounds = idle_rounds + 1 if self.evaluator.budget.metric_calls == spent else 0
                    if idle_rounds >= len(self.config.cluster_schedule):
                        self.stop_reason = f"stalled: {idle_rounds} rounds without a metric call"
                        break
                else:
                    self.stop_reason = f"max_rounds={max_rounds} reached"
                self.finish_validation()
            except BudgetExhausted as stop:
                self.stop_reason = f"budget exhausted ({stop})"
            except KeyboardInterrupt:
                self.interrupted, self.stop_reason = True, "interrupted (KeyboardInterrupt)"
            finally:
                self._settle_validation()
        self.emit(
            "on_run_end",
            RunEnd(
                self.stop_reason,
                self.interrupted,
                self.initial_val_score,
                self.best_val_score,
                self.evaluator.budget.metric_calls,
                self.round_index,
            ),
        )
        return self.stop_reason

    def _start_validation(self, background: ThreadPoolExecutor) -> None:
        instructions = self.instructions

        def validate() -> list[Outcome]:
            with in_background():
                return self.evaluator.evaluate(instructions, self.valset, "validate")

        train_keys = {example_key(ex) for ex in self.trainset}
        overlap = (
            self.config.num_threads > 1
            and self.evaluator.cost(instructions, self.valset) <= self.evaluator.budget.remaining()
            and not any(example_key(ex) in train_keys for ex in self.valset)
        )
        if overlap:
            self._validation = background.submit(contextvars.copy_context().run, validate)
        else:
            self._record_validation(validate())

    def finish_validation(self) -> None:
        """Wait for the starting program's validation pass when it runs beside the round (raising what it
        raised), and record it."""
        if self._validation is None:
            return
        outcomes, self._validation = self._validation.result(), None
        self._record_validation(outcomes)

    def _record_validation(self, outcomes: list[Outcome]) -> None:
        self._set_best(outcomes)
        self.initial_val_score = self.best_val_score
        self.val_history.append((len(self.valset), self.best_val_score))
        logger.info("initial validation score %.4f on %d examples", self.best_val_score, len(self.valset))
        self.emit(
            "on_validation_scored", ValidationScored(None, self.best_val_score, self.best_val_score, len(self.valset))
        )

    def _settle_validation(self) -> None:
        """On the way out: record the validation pass if it was paid; a failure of it was already reported."""
        if self._validation is None:
            return
        try:
            self.finish_validation()
        except Exception as error:  # the run is stopping for another reason, told in stop_reason
            logger.info("the starting program's validation pass did not finish: %s", error)
            self._validation = None

    def run_round(self) -> RoundRecord:
        """One round; returns its record (also appended to ``self.rounds``)."""
        r = self.round_index
        minimum = min_cluster_size(self.config.cluster_schedule, r)
        batch = [self.trainset[i] for i in self.sampler.next()]
        self.emit("on_round_start", RoundStart(r, minimum, len(batch), self.evaluator.budget.metric_calls))
        report, outcomes = self.attribute(batch)
        failures = sum(o.score < self.max_score for o in outcomes)
        self.emit("on_attribution", AttributionDone(r, report, failures, self.evaluator.budget.metric_calls))
        fresh = self.gradients(report)
        fresh_keys = {(g.predictor, example_key(g.record.example)) for g in fresh}
        carried = [
            g
            for g in self.waiting
            if (g.predictor, example_key(g.record.example)) not in fresh_keys
            and r - g.round < len(self.config.cluster_schedule)
        ]
        ready, self.waiting = self.abstract(fresh + carried, minimum)
        reverse_rank = {name: -i for i, name in enumerate(report.order)}
        ready.sort(key=lambda c: (-len(c.members), reverse_rank.get(c.predictor, 0)))
        record = RoundRecord(
            r,
            minimum,
            len(batch),
            failures,
            report.counts(),
            len(report.hard_cases),
            report.leaked,
            len(fresh),
            len(ready),
            len(self.waiting),
            explained_single=report.explained_single,
            explained_cumulative=report.explained_cumulative,
        )
        self.rounds.append(record)
        logger.info(
            "round %d: %d/%d failures, attributed %s, %d hard, %d gradients -> %d clusters (min size %d), %d waiting",
            r,
            failures,
            len(batch),
            report.counts(),
            len(report.hard_cases),
            len(fresh),
            len(ready),
            minimum,
            len(self.waiting),
        )
        kinds = self.config.candidates
        if kinds != "demos":
            self.prefetch_rewrites(ready)
        if self.attributor.speculating and kinds == "instructions":  # the stack holds rewrites only
            self.prefetch_judging(ready)
        proposals = {
            "instructions": [self.update],
            "demos": [self.update_demos],
            "both": [self.update_demos, self.update],
        }
        for cluster in ready:
            for propose in proposals[kinds]:  # with both, the rewrite builds on the demonstrations if they were kept
                self._record(record, propose(cluster, minimum))
        record.best_val_score = self.best_val_score
        record.metric_calls = self.evaluator.budget.metric_calls
        self.round_index += 1
        self.emit("on_round_end", RoundEnd(record))
        return record
