"""The main job: AgentGrad optimizes a real two-predictor program with the embedded local LM, offline.

``python -m dspy_agentgrad demo`` builds a seeded fact-extraction task
(``demo_task``: locate the evidence sentence, then answer), scores the
unoptimized program on held-out examples,
runs AgentGrad, scores the optimized program on the same examples, and prints
and writes what changed in which predictor and why.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import dspy

from ..jsonable import to_jsonable
from ..teleprompter import AgentGrad
from ..usage import track
from . import task as demo_task


def evaluate(program: dspy.Module, examples: list[dspy.Example], num_threads: int) -> tuple[float, dict]:
    """Mean metric score (0..1) on ``examples`` and the task-LM usage it took."""
    with track() as usage:
        result = dspy.Evaluate(
            devset=examples,
            metric=lambda e, p, t=None: demo_task.metric(e, p).score,
            num_threads=num_threads,
            display_progress=True,
            provide_traceback=False,
        )(program)
    return result.score / 100.0, usage


def run_demo(
    task_lm: Any,
    prompt_lm: Any,
    *,
    n_train: int,
    n_val: int,
    n_test: int,
    max_metric_calls: int,
    seed: int = 0,
    num_threads: int = 1,
    out: Path = Path("runs/demo"),
) -> dict:
    """Baseline -> AgentGrad -> optimized, on the demo task; returns (and writes) a summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train, val, test = demo_task.load_demo_data(n_train, n_val, n_test, seed)
    started = time.time()
    with dspy.context(lm=task_lm):
        program = demo_task.make_program()
        print(f"\n[1/3] Baseline: the unoptimized program on {len(test)} held-out examples")
        baseline, baseline_usage = evaluate(program, test, num_threads)
        print(
            f"\n[2/3] AgentGrad: {len(train)} train / {len(val)} validation examples, "
            f"budget {max_metric_calls} metric calls"
        )
        optimizer = AgentGrad(
            demo_task.metric,
            prompt_model=prompt_lm,
            task_model=task_lm,
            auto=None,
            max_metric_calls=max_metric_calls,
            hint_fn=demo_task.hint,
            num_threads=num_threads,
            seed=seed,
            log_dir=out / "agentgrad",
            cluster_schedule=(2, 1),
            train_batch_size=max(2, n_train),
        )
        compiled = optimizer.compile(program, trainset=train, valset=val)
        result = compiled.detailed_results
        print(f"\n[3/3] Optimized program on the same {len(test)} held-out examples")
        optimized, optimized_usage = evaluate(compiled, test, num_threads)
    summary = {
        "task": "two-step fact extraction (demo_task): locate -> answer, token F1",
        "task_lm": getattr(task_lm, "model", str(task_lm)),
        "prompt_lm": getattr(prompt_lm, "model", str(prompt_lm)),
        "sizes": {"train": len(train), "val": len(val), "test": len(test)},
        "test_score": {"baseline": baseline, "optimized": optimized, "gain": optimized - baseline},
        "val_score": {"initial": result.initial_val_score, "best": result.best_val_score},
        "rounds": [to_jsonable(vars(r)) for r in result.rounds],
        "accepted": [to_jsonable(vars(c)) for c in result.accepted],
        "rejected": len(result.rejected),
        "metric_calls": result.metric_calls,
        "usage": {"optimizer": result.usage, "baseline_eval": baseline_usage, "optimized_eval": optimized_usage},
        "program_errors": result.program_errors,
        "stop_reason": result.stop_reason,
        "wall_time_s": time.time() - started,
        "final_instructions": result.final_instructions,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(report(summary))
    return summary


def report(summary: dict) -> str:
    test, val = summary["test_score"], summary["val_score"]
    usage = summary["usage"]["optimizer"]
    lines = [
        "",
        "=" * 72,
        f"Held-out score: {test['baseline']:.3f} -> {test['optimized']:.3f} ({test['gain']:+.3f}); "
        f"validation {val['initial']:.3f} -> {val['best']:.3f}",
        f"Time: {summary['wall_time_s']:.0f} s; metric calls: {summary['metric_calls']}; "
        f"optimizer LM calls: task {usage['task']['calls']}, prompt {usage['prompt']['calls']}; "
        f"stop: {summary['stop_reason']}",
        "",
        "Who was at fault (failures attributed per predictor, by sequential intervention):",
    ]
    for r in summary["rounds"]:
        lines.append(
            f"  round {r['round']}: {r['failures']}/{r['batch_size']} failed; attributed {r['attributed']}; "
            f"hard cases {r['hard_cases']}; {r['clusters']} clusters; accepted {r['accepted']}/{r['candidates']}"
        )
    lines.append("")
    if not summary["accepted"]:
        lines.append(
            "No rewrite beat the current instructions on both its cluster and validation; the program is unchanged."
        )
    for c in summary["accepted"]:
        lines += [
            f"Accepted for '{c['predictor']}' (round {c['round']}, cluster of {c['cluster_size']}, "
            f"cluster {c['cluster_score_before']:.2f} -> {c['cluster_score_after']:.2f}, "
            f"validation {c['val_score']:.3f})",
            f"  why:  {c['gradient']}",
            f"  new:  {c['instruction']}",
        ]
    lines.append("=" * 72)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dspy_agentgrad", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run AgentGrad on the two-step fact-extraction demo task")
    demo.add_argument("--lm", default="local", help="'local' (embedded GGUF model, default) or a litellm model name")
    demo.add_argument("--prompt-lm", default=None, help="LM for the optimizer's own roles (default: same as --lm)")
    demo.add_argument("--train", type=int, default=6)
    demo.add_argument("--val", type=int, default=6)
    demo.add_argument("--test", type=int, default=10)
    demo.add_argument("--max-metric-calls", type=int, default=60)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--threads", type=int, default=1)
    demo.add_argument("--out", type=Path, default=Path("runs/demo"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    task_lm = demo_task.demo_lm() if args.lm == "local" else dspy.LM(args.lm)
    prompt_name = args.prompt_lm or args.lm
    prompt_lm = (
        task_lm if prompt_name == args.lm else (demo_task.demo_lm() if prompt_name == "local" else dspy.LM(prompt_name))
    )
    run_demo(
        task_lm,
        prompt_lm,
        n_train=args.train,
        n_val=args.val,
        n_test=args.test,
        max_metric_calls=args.max_metric_calls,
        seed=args.seed,
        num_threads=args.threads,
        out=args.out,
    )
