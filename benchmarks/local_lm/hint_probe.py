"""Can the local LM be helped on the demo task? Resolve rate of single-predictor hints.

Run:  .venv/bin/python -m benchmarks.local_lm.hint_probe [--model smollm2-135m] [--n 12]

AgentGrad attributes a failure to a predictor only when a hint injected into
that predictor alone makes the example reach the maximum score. This probe runs
the unoptimized demo program on ``n`` train examples and, for every failure,
reruns it with the task's hint appended to one predictor's instructions (as
``Hint: ...``), or with the gold answer as the hint. It writes
``hint_probe_<model>.json`` with baseline and per-mode mean scores and the number
of examples solved (score 1.0).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dspy

from dspy_agentgrad.demo.task import demo_lm, hint, load_demo_data, make_program, metric

HERE = Path(__file__).resolve().parent


def _with_hint(program: dspy.Module, name: str, text: str) -> dspy.Module:
    predictor = getattr(program, name)
    predictor.signature = predictor.signature.with_instructions(predictor.signature.instructions + "\n\nHint: " + text)
    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=12)
    args = parser.parse_args()
    train, _, _ = load_demo_data(seed=0)
    lm = demo_lm(model=args.model, cache=False, n_threads=2)
    modes = {
        "hint_on_answer": lambda ex, pred: ("answer", hint(ex, "answer", pred, None)),
        "hint_on_locate": lambda ex, pred: ("locate", hint(ex, "locate", pred, None)),
        "gold_on_answer": lambda ex, pred: (
            "answer",
            f"The correct answer is {ex.answer!r}. Reply with exactly {ex.answer!r} and nothing else.",
        ),
    }
    scores: dict[str, list[float]] = {"baseline": [], **{m: [] for m in modes}}
    start = time.perf_counter()
    with dspy.context(lm=lm):
        for ex in train[: args.n]:
            pred = make_program()(**ex.inputs())
            base = metric(ex, pred).score
            scores["baseline"].append(base)
            for mode, make in modes.items():
                if base == 1.0:
                    scores[mode].append(1.0)
                    continue
                name, text = make(ex, pred)
                scores[mode].append(metric(ex, _with_hint(make_program(), name, text)(**ex.inputs())).score)
            print(f"{base:.2f} -> " + " ".join(f"{m}={scores[m][-1]:.2f}" for m in modes), flush=True)
    failures = sum(s < 1.0 for s in scores["baseline"])
    out = {
        "model": lm.model,
        "n": len(scores["baseline"]),
        "baseline_failures": failures,
        "modes": {
            m: {
                "mean_score": round(sum(v) / len(v), 3),
                "solved": sum(s == 1.0 for s in v),
                "failures_resolved": sum(s == 1.0 for s in v) - sum(s == 1.0 for s in scores["baseline"]),
            }
            for m, v in scores.items()
        },
        "seconds": round(time.perf_counter() - start, 1),
    }
    (HERE / f"hint_probe_{args.model}.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
