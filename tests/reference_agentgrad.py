"""A plain reference implementation of the paper's loop, written apart from the package's engine.

Steps 1-5 as ../shared/DESIGN.md states them, sequential, one candidate at a time, every run made anew and scored
(no reuse, no speculation, no early rejection, no stacks, no budget). It shares only the program runner (a run,
with hints on some predictors and recorded calls replayed) and the optimizer's LM roles (gradient, aggregator,
rewrite) with the package; the rules a round follows are written out here again, from the description:

1. failure set: the batch's runs scoring below ``max_score``;
2. sequential intervention in reverse execution order: a failure goes to the latest predictor whose hint (upstream
   calls replayed) makes the run reach ``max_score`` and changes that predictor's output (the first call it
   changed is the pseudo-label); failures no single hint fixes are hard cases, left out;
3. one gradient per attributed failure, from the instruction, inputs, output and pseudo-label;
4. per predictor, the aggregator groups the round's gradients with those still waiting (written against the
   same instruction, at most one schedule cycle old), told the round's minimum size; smaller groups wait;
5. clusters by descending size (ties: later predictor first); each rewrite must beat the current program on its
   cluster's examples, then the best validation score (strictly, both); an accepted one becomes the program.

The rewrite role is shown the generalized gradient and the current instruction only (the paper's inputs): no
cases, no rejected rewrites. Rounds run until ``max_rounds``, or until a round finds no failure on the whole
training set under the program it ends with. Only small worlds are meant: the training set is one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import dspy

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.program.hints import as_hint
from dspy_agentgrad.roles.instruction_proposer import RewriteRequest
from dspy_agentgrad.roles.proposer import StepRole
from dspy_agentgrad.runtime.budget import Budget


@dataclass
class Decision:
    """One candidate: its round, predictor, rewrite (None: the rewrite could not be judged) and verdict."""

    round: int
    predictor: str
    instruction: str | None
    accepted: bool


@dataclass
class Reference:
    """What the reference decided: blame per round (predictor -> examples' inputs), candidates in order, and the
    program and validation score it ends with."""

    blame: list[dict[str, list[str]]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    programs: list[dict[str, str]] = field(default_factory=list)  # the program after each decision
    initial_program: dict[str, str] = field(default_factory=dict)
    best_val_score: float = 0.0


@dataclass
class _Gradient:
    predictor: str
    example: dspy.Example
    text: str
    instruction: str  # the predictor's instruction it was written against
    round: int
    inputs: dict
    original: dict
    corrected: dict


def _changed_call(original, hinted, name: str):
    """The earliest call of ``name`` whose inputs are as in the original run and whose output the hint changed."""
    before = [s for s in original.steps if s.name == name]
    for step in [s for s in hinted.steps if s.name == name]:
        twin = next((b for b in before if b.inputs == step.inputs), None)
        if twin is not None and twin.outputs != step.outputs:
            return twin, step
    return None


def total(outcomes) -> Fraction:
    return sum((Fraction(o.score) for o in outcomes), Fraction(0))


def reference_run(optimizer: AgentGrad, student: dspy.Module, trainset, valset, max_rounds: int) -> Reference:
    """Run the reference loop with ``optimizer``'s program runner, roles, hints and options."""
    config = optimizer.config
    parts = optimizer._parts(student, Budget(), None)
    runner, roles, hint_fn = parts.evaluator.runner, parts.proposer, parts.hint_fn
    top = config.scores.max_score
    program = dict(parts.instructions)
    ref = Reference(initial_program=dict(program))

    def val_scores(instructions):
        return [Fraction(runner.run(ex, instructions).score) for ex in valset]

    best = val_scores(program)
    waiting: list[_Gradient] = []
    for r in range(max_rounds):
        minimum = config.abstraction.cluster_schedule[r % len(config.abstraction.cluster_schedule)]
        start_program = dict(program)
        runs = [runner.run(ex, program) for ex in trainset]
        order = list(dict.fromkeys(step.name for outcome in runs for step in outcome.steps))
        # step 2
        unresolved = [i for i, o in enumerate(runs) if o.score < top]
        failures = len(unresolved)
        attributed: dict[str, list[tuple]] = {name: [] for name in order}
        for name in reversed(order):
            for i in list(unresolved):
                original, example = runs[i], trainset[i]
                names = [s.name for s in original.steps]
                if name not in names:
                    continue
                hint = as_hint(example, hint_fn(example, name, dspy.Prediction(**original.outputs), original.feedback))
                if hint is None:
                    continue
                first = names.index(name)
                replay = [s for s in original.steps if s.name in dict.fromkeys(names[:first])]
                hinted = runner.run(example, program, hints={name: hint.text}, replay=replay)
                pair = _changed_call(original, hinted, name)
                if hinted.score >= top and hinted.score > original.score and pair is not None:
                    attributed[name].append((example, pair[0], pair[1]))
                    unresolved.remove(i)
        ref.blame.append({n: sorted(str(e.inputs().toDict()) for e, _, _ in recs) for n, recs in attributed.items()})
        # step 3
        steps_text = "\n".join(f"{k + 1}. {n}: {parts.signatures.get(n, '')}" for k, n in enumerate(order))
        fresh = []
        for name in order:
            for example, before, after in attributed[name]:
                role = StepRole(parts.signatures.get(name, ""), steps_text)
                text = roles.gradient(role, program[name], after.inputs, before.outputs, after.outputs)
                if text:
                    fresh.append(
                        _Gradient(name, example, text, program[name], r, after.inputs, before.outputs, after.outputs)
                    )
        # step 4
        fresh_keys = {(g.predictor, str(g.example.toDict())) for g in fresh}
        pool = fresh + [
            g
            for g in waiting
            if (g.predictor, str(g.example.toDict())) not in fresh_keys
            and r - g.round < len(config.abstraction.cluster_schedule)
            and g.instruction == program[g.predictor]
        ]
        clusters, waiting = [], []
        for name in dict.fromkeys(g.predictor for g in pool):
            mine = [g for g in pool if g.predictor == name]
            groups = roles.abstract(program[name], [g.text for g in mine], minimum) or []
            for group in groups:
                members = [mine[k] for k in group.members]
                if len(members) < minimum:
                    waiting += members
                else:
                    clusters.append((name, members, group.text or members[0].text))
        rank = {name: k for k, name in enumerate(order)}
        clusters.sort(key=lambda c: (-len(c[1]), -rank.get(c[0], 0)))
        # step 5
        for name, members, text in clusters:
            current = program[name]
            request = RewriteRequest(
                name,
                parts.signatures[name],
                current,
                text,
                [g.text for g in members],
                max_chars=config.proposals.max_instruction_chars,
            )
            proposal = roles.rewrite(request)
            changed = proposal is not None and proposal.strip() != current.strip()
            accepted = False
            if changed and len(proposal) <= config.proposals.max_instruction_chars:
                candidate = {**program, name: proposal}
                examples = [g.example for g in members]
                if total(runner.run(ex, candidate) for ex in examples) > total(
                    runner.run(ex, program) for ex in examples
                ):
                    scores = val_scores(candidate)
                    if sum(scores) > sum(best):
                        program, best, accepted = candidate, scores, True
            ref.decisions.append(Decision(r, name, proposal if changed else None, accepted))
            ref.programs.append(dict(program))
        if failures == 0 and program == start_program:
            break
    ref.best_val_score = float(sum(best) / len(best))
    return ref


def replayed(result) -> dict[str, str]:
    """The program the records describe: the starting one with each accepted rewrite, in the order recorded."""
    program = dict(result.initial_instructions)
    for candidate in result.candidates:
        if candidate.accepted:
            program[candidate.predictor] = candidate.instruction
    return program
