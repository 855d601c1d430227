"""Property tests on drawn worlds: the package decides as the plain reference of the paper's loop does, and every
speed mechanism keeps the decisions it claims to keep (docs/guarantees.md says which).

A world is drawn: which predictors are at fault on each training and validation example (one, two, or one the
answerer can also repair), rewrites that overreach (they fix their cluster and break every other example),
how often a hinted predictor follows its hint, whether the LM rewords its outputs whenever its prompt changes,
the sizes of the sets, the rounds, a metric-call budget that may bind, and the thread count. The Hypothesis
profile (tests/conftest.py) sets how many worlds each property draws.
"""

from __future__ import annotations

from fractions import Fraction

import dspy
from hypothesis import example, given
from hypothesis import strategies as st
from reference_agentgrad import reference_run, replayed
from rewording_sim import RewordingWorld, WordingPipeline
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.program.metric import Metric
from dspy_agentgrad.program.runner import ProgramRunner

FAST = dict(progress=False, auto=None)
KINDS = ("extract", "notes", "answer", "either", "extract+notes", "none")
PREDICTORS = ("extract", "notes", "answer")


@st.composite
def worlds(draw, max_train: int = 6):
    train = {k: draw(st.integers(0, 2)) for k in KINDS}
    if not sum(train.values()):
        train["notes"] = 1
    while sum(train.values()) > max_train:
        train[max(train, key=train.get)] -= 1
    val = {k: draw(st.integers(0, 1)) for k in KINDS}
    val["none"] += 1
    return dict(
        train=train,
        val=val,
        overfit=tuple(p for p in PREDICTORS if draw(st.booleans()) and draw(st.booleans())),
        follow=draw(st.sampled_from((1.0, 1.0, 0.7, 0.4))),
        reword=draw(st.booleans()) and draw(st.booleans()),
        rounds=draw(st.sampled_from((1, 2, 2, 3))),
        threads=draw(st.integers(1, 8)),
        seed=draw(st.integers(0, 3)),
        budget_slack=draw(st.one_of(st.none(), st.integers(0, 30))),
    )


def setup(world: dict):
    """The world's LM, program and data (the LM configured)."""
    options = dict(overfit=world["overfit"], hint_follow_rate=world["follow"])
    lm_world = RewordingWorld(**options) if world["reword"] else World(**options)
    dspy.configure(lm=world_lm(lm_world))
    program = WordingPipeline() if world["reword"] else Pipeline()
    return program, make_data(world["train"]), make_data(world["val"], start=100)


def budget(world: dict, train, val) -> int | None:
    """A metric-call cap that may bind: the starting validation pass, the first batch, and some slack."""
    slack = world["budget_slack"]
    return None if slack is None else len(val) + len(train) + slack


def compile_world(world: dict, **options):
    program, train, val = setup(world)
    options = {
        "max_rounds": world["rounds"],
        "max_metric_calls": budget(world, train, val),
        "num_threads": world["threads"],
        "seed": world["seed"],
        **FAST,
        **options,
    }
    return (
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(**options))
        .compile(program, trainset=train, valset=val)
        .detailed_results
    )


def decisions(result) -> list[tuple]:
    return [(c.round, c.predictor, c.instruction, c.accepted) for c in result.candidates]


def verdicts(result) -> list[tuple]:
    """The decisions reached: a candidate the run stopped before judging (its record says so) has none, and one
    judged on a stack that a stop cut short (its record says so) has one that a longer run may not reach."""
    unfinished = ("the run stopped before", "no budget left", "judged on a stack cut short")
    return [
        (c.round, c.predictor, c.instruction, c.accepted)
        for c in result.candidates
        if not any(text in c.reason for text in unfinished)
    ]


def cut_short(result) -> bool:
    """Whether a cap stopped the run, or left a candidate without its verdict (at the last stack's pass)."""
    return "budget" in result.stop_reason or len(verdicts(result)) < len(result.candidates)


def blame(result) -> list[dict[str, list[str]]]:
    rounds: dict[int, dict[str, list[str]]] = {}
    for record in result.blame:
        if record.predictor is not None:
            rounds.setdefault(record.round, {}).setdefault(record.predictor, []).append(str(record.example))
    return [{n: sorted(v) for n, v in rounds.get(r, {}).items()} for r in range(len(result.rounds))]


# ---- the paper preset decides as the reference does ------------------------------------------------------------


@given(worlds())
def test_the_paper_preset_makes_the_reference_implementations_decisions(world):
    program, train, val = setup(world)
    optimizer = AgentGrad(
        feedback_metric,
        seed=world["seed"],
        config=AgentGradConfig.from_options(preset="paper", max_rounds=world["rounds"], **FAST),
    )
    reference = reference_run(optimizer, program, train, val, world["rounds"])
    result = compile_world(world, preset="paper")
    got = decisions(result)
    expected = [(d.round, d.predictor, d.instruction, d.accepted) for d in reference.decisions]
    assert got == expected[: len(got)]  # a budget that binds stops the run part-way: what it decided agrees
    assert blame(result) == [{n: v for n, v in b.items() if v} for b in reference.blame[: len(blame(result))]]
    program_then = reference.programs[len(got) - 1] if got else reference.initial_program
    assert result.final_instructions == program_then == replayed(result)
    if not cut_short(result):
        assert got == expected and result.best_val_score == reference.best_val_score


# ---- speed mechanisms keep the decisions ------------------------------------------------------------------------

CAPS = ("metric calls", "task calls", "task tokens", "prompt tokens")


def caps(kind: str, slack: int | None) -> dict:
    """A cap of ``kind`` that binds in some worlds (worst cases: a task call holds its prompt and 4096 tokens)."""
    slack = slack or 0
    return {
        "metric calls": {},
        "task calls": {"max_task_calls": 24 + 4 * slack},
        "task tokens": {"max_task_tokens": 60_000 + 8_000 * slack},
        "prompt tokens": {"max_prompt_tokens": 12_000 + 3_000 * slack},
    }[kind]


def same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # no validation score (nan) on both sides counts as the same


def kinds(counts: dict[str, int]) -> dict[str, int]:
    """Examples per kind, as a drawn world holds them (kinds not named: none)."""
    return {kind: counts.get(kind, 0) for kind in KINDS}


# a budget that ends the round after the first winner's cluster check: without reuse that winner is validated alone
# and loses; with reuse the next winner's check fits too and the two win validation together
CUT_SHORT_WORLD = dict(
    train=kinds({"extract": 1, "either": 2, "extract+notes": 2}),
    val=kinds({"extract+notes": 1, "none": 1}),
    overfit=(),
    follow=1.0,
    reword=False,
    rounds=1,
    threads=1,
    seed=0,
    budget_slack=29,
)


# a budget that ends round 1's cumulative pass: without reuse its failure is left a hard case and the run ends at
# max_rounds with fewer candidates; the stop reason says where the cap bound
CUMULATIVE_CUT_WORLD = dict(
    CUT_SHORT_WORLD,
    train=kinds({"answer": 1, "extract+notes": 1}),
    val=kinds({"answer": 1, "none": 1}),
    rounds=2,
    budget_slack=18,
)


# no cap: round 1's only run takes its score by reuse, so with reuse the run stalls a round earlier than when every
# run is scored (the stall rule counts metric calls); the run without reuse only repeats a rejected rewrite
REUSED_ROUND_WORLD = dict(
    CUT_SHORT_WORLD,
    train=kinds({"notes": 1}),
    val=kinds({"none": 1}),
    rounds=3,
    budget_slack=None,
)


@given(worlds(), st.sampled_from(CAPS), st.integers(1, 3))
@example(CUT_SHORT_WORLD, "metric calls", 1)
@example(CUMULATIVE_CUT_WORLD, "metric calls", 1)
@example(REUSED_ROUND_WORLD, "metric calls", 2)
def test_speed_mechanisms_keep_the_decisions_and_the_records_explain_the_program(world, cap, stack_rounds):
    """One world, four runs: the speed mechanisms (speculation, reuse, validation together with stacks of
    ``stack_rounds`` rounds) at the world's thread count, then each with one mechanism off or one thread."""
    options = dict(stack_rounds=stack_rounds, cluster_schedule=(1,), reflect_hard_cases=False, speculate=True)
    options |= caps(cap, world["budget_slack"])
    base = compile_world(world, **options)
    # speculation and the thread count change nothing at all
    others = [compile_world(world, **{**options, "speculate": False})]
    others += [compile_world({**world, "threads": 1}, **options)] if world["threads"] > 1 else []
    for other in others:
        assert decisions(other) == decisions(base) and other.final_instructions == base.final_instructions
        assert other.metric_calls == base.metric_calls and same(other.best_val_score, base.best_val_score)
        assert blame(other) == blame(base) and other.stop_reason.split(":")[0] == base.stop_reason.split(":")[0]
    # reused runs take no metric call (and replayed calls no task call), so under a binding cap reuse may get
    # further: the decisions of the run that stopped first are the start of the other's
    full = compile_world(world, reuse_calls=False, **options)
    assert_one_starts_the_other(full, base)
    stalled_earlier = "stalled" in base.stop_reason and len(base.rounds) < len(full.rounds)
    if not (cut_short(full) or cut_short(base) or stalled_earlier):
        assert decisions(full) == decisions(base) and full.final_instructions == base.final_instructions
    # the records explain the program, and each kept rewrite gained on its cluster on the program it went into
    # (clusters here are all of a predictor's failures blamed in a round: minimum size 1, one correction per
    # predictor in this world, no reflections), checked again by a fresh runner
    assert base.final_instructions == replayed(base)
    _check_kept_rewrites(world, base)


def assert_one_starts_the_other(a, b) -> None:
    short, long = sorted((verdicts(a), verdicts(b)), key=len)
    assert short == long[: len(short)]


def _check_kept_rewrites(world: dict, result) -> None:
    program, train, val = setup(world)
    runner = ProgramRunner(program, Metric(feedback_metric), max_score=1.0)
    by_inputs = {str(ex.inputs().toDict()): ex for ex in train}
    current = dict(result.initial_instructions)
    for candidate in result.candidates:
        if not candidate.accepted:
            continue
        cluster = [
            by_inputs[str(b.example)]
            for b in result.blame
            if b.round == candidate.round and b.predictor == candidate.predictor
        ]
        after = {**current, candidate.predictor: candidate.instruction}
        assert _total(runner, cluster, after) > _total(runner, cluster, current), candidate
        current = after
    if any(c.accepted for c in result.candidates):
        assert float(_total(runner, val, current) / len(val)) == result.best_val_score


def _total(runner: ProgramRunner, examples, instructions) -> Fraction:
    return sum((Fraction(runner.run(ex, instructions).score) for ex in examples), Fraction(0))
