"""Steps 3-4 of a round: a textual gradient per attributed failure, then semantic abstraction.

Gradients of one predictor are grouped by meaning (the aggregator LM, TF-IDF or an embedder;
see :mod:`.clustering`), and a group large enough under the round's minimum cluster size
becomes a :class:`Cluster` with one generalized gradient. Without semantic abstraction
(the ablation), gradients are cut into random minibatches instead.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import dspy

from ..config import AgentGradConfig
from ..program.program_state import ProgramState
from ..program.runs import Outcome
from ..roles.gradient_groups import GradientGroup
from ..roles.proposer import Proposer, StepRole
from ..runtime.parallel import parallel_map
from .clustering import embedding_groups, random_minibatches, tfidf_groups
from .demonstrations import demo_of
from .state import AttributionRecord, AttributionReport, Cluster, Gradient

logger = logging.getLogger("dspy.agentgrad")


class Abstraction:
    """Turns a round's attributions into clusters a rewrite can address (steps 3-4)."""

    def __init__(self, config: AgentGradConfig, proposer: Proposer, signatures: dict[str, str], rng: random.Random):
        self.config = config
        self.proposer = proposer
        self.signatures = signatures
        self.rng = rng  # shared with the engine's batch sampler: one seeded stream for the run

    def gradients(self, report: AttributionReport, instructions: ProgramState, round_index: int) -> list[Gradient]:
        """Step 3: one gradient per attributed failure of a predictor that may be rewritten. With
        ``candidates="demos"`` no rewrite needs one: the text is the pseudo-label itself (no LM call), which
        step 4 groups, and leaking pseudo-labels are left out (they can make no demonstration)."""
        # blamed and reported, never rewritten: no gradient to pay for
        frozen = self.config.proposals.frozen(report.order)
        items = [(name, rec) for name in report.order if name not in frozen for rec in report.attributed.get(name, [])]
        if self.config.proposals.candidates == "demos":
            return [
                Gradient(
                    name,
                    rec,
                    f"{name} should write {self.proposer.fields(rec.corrected)}",
                    round_index,
                    instructions.instruction(name),
                )
                for name, rec in items
                if demo_of(rec) is not None
            ]
        steps = self._steps(report.order)

        def extract(item: tuple[str, AttributionRecord]) -> str | None:
            name, rec = item
            if self.config.abstraction.agent_supervision and rec.corrected:
                role = StepRole(self.signatures.get(name, ""), steps)
                return self.proposer.gradient(
                    role, instructions.instruction(name), rec.inputs, rec.original, rec.corrected
                )
            return self.proposer.system_gradient(
                instructions.instruction(name), dict(rec.example.inputs()), rec.program_outputs, self._expected(rec)
            )

        return self._extracted(extract, items, instructions, round_index)

    def reflections(
        self,
        asked: list[tuple[str, dspy.Example, Outcome]],
        order: list[str],
        instructions: ProgramState,
        round_index: int,
    ) -> list[Gradient]:
        """Step 3 for hard cases (``reflect_hard_cases``): no hint fixed them, so there is no pseudo-label and no
        predictor to blame. Each predictor ``asked`` about a hard case (its failed run) is shown its own call there
        with the expected result, as GEPA's reflection is, and asked what to change; answers of "no change" are
        dropped. Its cluster check runs on the hard cases themselves, so a rewrite must fix them to go on."""
        frozen = self.config.proposals.frozen(order)
        items = [
            (name, AttributionRecord(example, step.inputs, step.outputs, {}, outcome.feedback, outcome.outputs))
            for name, example, outcome in asked
            if name not in frozen and (step := outcome.first_step(name)) is not None
        ]
        steps = self._steps(order)

        def reflect(item: tuple[str, AttributionRecord]) -> str | None:
            name, rec = item
            role = StepRole(self.signatures.get(name, ""), steps)
            return self.proposer.reflection(
                role, instructions.instruction(name), rec.inputs, rec.original, rec.program_outputs, self._expected(rec)
            )

        return self._extracted(reflect, items, instructions, round_index)

    def _steps(self, order: list[str]) -> str:
        """The program's steps in execution order with their fields, as the gradient roles are told."""
        return "\n".join(f"{i + 1}. {name}: {self.signatures.get(name, '')}" for i, name in enumerate(order))

    def _expected(self, rec: AttributionRecord) -> str:
        """The example's labels and the metric's feedback, for roles that see no pseudo-label."""
        expected = self.proposer.fields(dict(rec.example.labels()))
        return expected + f"\nfeedback: {rec.feedback}" if rec.feedback else expected

    def _extracted(
        self,
        extract: Callable[[tuple[str, AttributionRecord]], str | None],
        items: list[tuple[str, AttributionRecord]],
        instructions: ProgramState,
        round_index: int,
    ) -> list[Gradient]:
        """The gradients ``extract`` gives for ``items`` (asked concurrently, kept in item order)."""
        texts = parallel_map(extract, items, self.config.execution.num_threads)
        return [
            Gradient(name, rec, text, round_index, instructions.instruction(name))
            for (name, rec), text in zip(items, texts)
            if text
        ]

    def abstract(
        self, pool: list[Gradient], minimum: int, instructions: ProgramState
    ) -> tuple[list[Cluster], list[Gradient]]:
        """Step 4: clusters that meet ``minimum``, and the gradients that wait for a later round.

        The predictors are abstracted concurrently (their calls are independent); the result is
        assembled in pool order, so it does not depend on the thread count.
        """
        ready: list[Cluster] = []
        waiting: list[Gradient] = []
        by_predictor: dict[str, list[Gradient]] = {}
        for g in pool:
            by_predictor.setdefault(g.predictor, []).append(g)
        if not self.config.abstraction.semantic_abstraction:
            for name, grads in by_predictor.items():
                size = max(self.config.abstraction.cluster_schedule)
                for batch in random_minibatches(len(grads), size, self.rng):
                    text = "\n".join(f"- {grads[i].text}" for i in batch)
                    ready.append(Cluster(name, [grads[i] for i in batch], text))
            return ready, waiting
        names = list(by_predictor)
        grouped = parallel_map(
            lambda name: self._groups(
                instructions.instruction(name), name, [g.text for g in by_predictor[name]], minimum
            ),
            names,
            self.config.execution.num_threads,
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

    def _groups(self, instruction: str, name: str, texts: list[str], minimum: int) -> list[GradientGroup]:
        if self.config.proposals.candidates == "demos":  # pseudo-labels, not advice: grouped by their words, no LM call
            return [GradientGroup(members, texts[members[0]]) for members in tfidf_groups(texts)]
        if self.config.abstraction.clustering == "lm":
            groups = self.proposer.abstract(instruction, texts, minimum)
            if groups is not None:
                return groups
            logger.warning("aggregator failed for %s; grouping its %d gradients with TF-IDF", name, len(texts))
        vectors = self.proposer.embed(texts) if self.config.abstraction.clustering == "embedding" else None
        if self.config.abstraction.clustering == "embedding" and vectors is None:
            logger.warning("embedder failed for %s; grouping its %d gradients with TF-IDF", name, len(texts))
        grouped = tfidf_groups(texts) if vectors is None else embedding_groups(vectors)
        out = []
        for members in grouped:
            if len(members) == 1:
                text = texts[members[0]]
            else:
                text = self.proposer.summarize(instruction, [texts[i] for i in members])
            if text:
                out.append(GradientGroup(members, text))
        return out
