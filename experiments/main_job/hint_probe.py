"""Can the local LM be helped by a hint, and does the way the hint arrives matter?

Run:  python -m experiments.main_job.hint_probe [--model smollm2-135m] [--n 12] [--seed 0]

AgentGrad attributes a failure to a predictor when a hint given to that
predictor alone raises the example's score to the fix threshold (the maximum
score unless ``fix_threshold`` is set). This probe runs the unoptimized demo
program on ``n`` train examples and reruns every failure through the optimizer's
own code path (:class:`dspy_agentgrad.program.runner.ProgramRunner`: the earlier
predictor's outputs replayed, the hint delivered exactly as AgentGrad delivers
it) for each

* hint delivery: ``input_field`` (an extra input ``hint_``, the default) or
  ``instruction`` (appended to the instruction);
* hint text: ``task`` (the demo's ``hint``: the gold answer for ``answer`` when
  its evidence holds it, the gold evidence sentence for ``locate``), ``gold``
  (the gold answer for ``answer`` whatever its evidence holds: some of these
  fixes are label leaks that AgentGrad would reject), ``shape`` (the length and
  kind of a right answer, no gold words; ``answer`` only) and ``default`` (the
  library's ``default_hint``: every label plus the feedback; ``answer`` only);
* hinted predictor: ``answer`` or ``locate``.

Per condition it counts failures *fixed* (score 1.0), *improved* (score above
the unhinted run) and *at 0.5 or more* (what ``fix_threshold=0.5`` would
attribute), and the mean score. Writes ``hint_probe_<model>.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dspy

from dspy_agentgrad.demo.task import demo_lm, hint, load_demo_data, make_program, metric
from dspy_agentgrad.program.hint_delivery import HINT_DELIVERIES
from dspy_agentgrad.program.hints import default_hint
from dspy_agentgrad.program.metric import Metric
from dspy_agentgrad.program.runner import ProgramRunner
from dspy_agentgrad.program.runs import Outcome

HERE = Path(__file__).resolve().parent


def shape_hint(example: dspy.Example, pred_name: str, prediction, feedback) -> str | None:
    """The demo's first hint for ``answer``: the shape of a right answer, not its words."""
    if pred_name != "answer":
        return None
    n = len(example.answer.split())
    return (
        f"Reply with only the {n} word{'s' if n > 1 else ''} of the evidence that answer the question "
        "(a name, place, job, year, organization or instrument), with no other words and no sentence."
    )


def gold_answer_hint(example: dspy.Example, pred_name: str, prediction, feedback) -> str | None:
    """The gold answer for ``answer`` whatever its evidence holds (a fix may then be a label leak)."""
    if pred_name != "answer":
        return None
    return f"The correct answer is {example.answer!r}. Reply with exactly {example.answer!r} and nothing else."


def default_answer_hint(example: dspy.Example, pred_name: str, prediction, feedback) -> str | None:
    """The library's default hint (every label and the feedback), for ``answer`` only (to bound the cost)."""
    return default_hint(example, pred_name, prediction, feedback) if pred_name == "answer" else None


# "task" is the demo's hint as the job uses it (dspy_agentgrad.demo.task.hint).
HINTS = {"task": hint, "gold": gold_answer_hint, "shape": shape_hint, "default": default_answer_hint}
# Hinting ``answer`` alone (one LM call per rerun) is the cheap, direct test of whether the model uses a hint.


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--str-chars", type=int, default=None, help="grammar bound for str fields (demo default)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    parser.add_argument("--hints", default=",".join(HINTS), help="comma-separated hint kinds to try")
    parser.add_argument("--targets", default="answer,locate", help="comma-separated predictors to hint")
    parser.add_argument("--tag", default="", help="suffix of the output file name")
    args = parser.parse_args()
    train, _, _ = load_demo_data(seed=args.seed)
    settings = {"model": args.model, "cache": False, "n_threads": args.threads}
    if args.str_chars:
        from dspy_agentgrad.embedded_lm import OutputLimits

        settings["limits"] = OutputLimits(str_chars=args.str_chars)
    lm = demo_lm(**settings)
    program = make_program()
    instructions = {name: p.signature.instructions for name, p in program.named_predictors()}
    runners = {d: ProgramRunner(program, Metric(metric), lm, hint_delivery=d) for d in HINT_DELIVERIES}
    rows: dict[str, list[tuple[float, float]]] = {}
    start = time.perf_counter()
    baseline: list[float] = []
    for ex in train[: args.n]:
        base: Outcome = runners["input_field"].run(ex, instructions)
        baseline.append(base.score)
        if base.score >= 1.0:
            continue
        prediction = dspy.Prediction(**base.outputs)
        for delivery, runner in runners.items():
            for kind in args.hints.split(","):
                for position, step in enumerate(base.steps):
                    if step.name not in args.targets.split(","):
                        continue
                    text = HINTS[kind](ex, step.name, prediction, base.feedback)
                    if not text:
                        continue
                    hinted = runner.run(
                        ex, instructions, hint_target=step.name, hint=text, replay=base.steps, replay_until=position
                    )
                    rows.setdefault(f"{delivery}/{kind}/{step.name}", []).append((base.score, hinted.score))
        print(f"{base.score:.2f} {ex.question}", flush=True)
    failures = sum(s < 1.0 for s in baseline)
    out = {
        "model": lm.model,
        "command": f"python -m experiments.main_job.hint_probe --model {args.model} --n {args.n} --seed {args.seed}"
        + (f" --str-chars {args.str_chars}" if args.str_chars else "")
        + f" --threads {args.threads} --hints {args.hints} --targets {args.targets}",
        "task_str_chars": lm.engine.limits.str_chars,
        "n": len(baseline),
        "baseline_mean": round(sum(baseline) / len(baseline), 3),
        "baseline_failures": failures,
        "conditions": {
            key: {
                "failures": len(pairs),
                "fixed": sum(after >= 1.0 for _, after in pairs),
                "improved": sum(after > before for before, after in pairs),
                "at_least_0.5": sum(after >= 0.5 and after > before for before, after in pairs),
                "mean_before": round(sum(b for b, _ in pairs) / len(pairs), 3),
                "mean_after": round(sum(a for _, a in pairs) / len(pairs), 3),
            }
            for key, pairs in sorted(rows.items())
        },
        "seconds": round(time.perf_counter() - start, 1),
        "lm_calls": lm.engine.calls,
    }
    (HERE / f"hint_probe_{args.model}{'_' + args.tag if args.tag else ''}.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
