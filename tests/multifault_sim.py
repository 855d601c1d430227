"""Simulated multi-fault world: how many failures single and cumulative hints explain, round by round.

The 3-predictor world of tests/world.py with imperfect hints (a hinted faulty predictor follows
its hint on ``--follow`` of (example, predictor) pairs) and examples that need two fixes. Run:

    PYTHONPATH=$PWD python tests/multifault_sim.py [--follow 0.8] [--seeds 3] [--delivery input_field]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import dspy

sys.path.insert(0, str(Path(__file__).parent))
from world import Pipeline, World, feedback_metric, make_data, world_lm  # noqa: E402

from dspy_agentgrad import AgentGrad  # noqa: E402

TRAIN = {"extract": 6, "notes": 6, "answer": 4, "extract+notes": 5, "notes+answer": 4, "extract+answer": 3, "none": 12}
VAL = {"extract": 3, "notes": 3, "answer": 2, "extract+notes": 3, "notes+answer": 2, "extract+answer": 2, "none": 5}


def simulate(cumulative: bool, follow: float, seed: int, delivery: str = "input_field", rounds: int = 4):
    world = World(hint_follow_rate=follow)
    dspy.configure(lm=world_lm(world))
    optimizer = AgentGrad(
        feedback_metric,
        auto=None,
        max_rounds=rounds,
        seed=seed,
        cumulative_hints=cumulative,
        hint_delivery=delivery,
        train_batch_size=16,
        cluster_schedule=(2, 1),
        retry_backoff_s=0,
        progress=False,
    )
    compiled = optimizer.compile(Pipeline(), trainset=make_data(TRAIN), valset=make_data(VAL, start=500))
    return compiled.detailed_results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--follow", type=float, default=0.8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--delivery", default="input_field")
    args = parser.parse_args()
    print(f"hint follow rate {args.follow}, delivery {args.delivery}")
    print("| cumulative | seed | round | failures | explained single | explained cumulative | hard | val after |")
    print("|---|---|---|---|---|---|---|---|")
    totals = {}
    for cumulative in (False, True):
        failures = single = both = calls = 0
        finals, first_round = [], []
        for seed in range(args.seeds):
            result = simulate(cumulative, args.follow, seed, args.delivery)
            for r in result.rounds:
                print(
                    f"| {cumulative} | {seed} | {r.round} | {r.failures} | {r.explained_single} | "
                    f"{r.explained_cumulative} | {r.hard_cases} | {r.best_val_score:.3f} |"
                )
                failures += r.failures
                single += r.explained_single
                both += r.explained_single + r.explained_cumulative
            finals.append(result.best_val_score)
            first_round.append(result.rounds[0].best_val_score)
            calls += result.metric_calls
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        totals[cumulative] = (single / failures, both / failures, mean(first_round), mean(finals), calls / args.seeds)
    print()
    print(
        "| cumulative | failures explained by single hints | explained in all | val after round 0 | final val | "
        "metric calls |"
    )
    print("|---|---|---|---|---|---|")
    for cumulative, (single, both, first, final, calls) in totals.items():
        print(f"| {cumulative} | {single:.2f} | {both:.2f} | {first:.3f} | {final:.3f} | {calls:.0f} |")


if __name__ == "__main__":
    main()
