"""When the simulated LM was busy during one synthetic run: task and prompt calls in flight over time.

``python -m benchmarks.synthetic.timeline TRACE.json [benchmarks.run options]`` runs ``benchmarks.run`` with every
call of the synthetic LM timed (start, end, task or prompt, the output fields of a prompt call), writes the calls
to TRACE.json and prints, over the whole run: the seconds with a task call in flight, with only prompt calls in
flight, with nothing in flight, and the mean number of task calls in flight. With ``--task-lm synthetic:120,320``
the run waits on the LM, so the shares say where the wall went (what stands between AgentGrad's wall and
0.4x GEPA's).
"""

from __future__ import annotations

import json
import sys
import threading
import time

from benchmarks import run
from benchmarks.synthetic import world


def busy(calls: list[tuple[float, float, str, str]]) -> dict[str, float]:
    """Seconds with a task call in flight, with prompt calls only, with none; mean task calls in flight."""
    events = sorted([(s, 1, kind) for s, _, kind, _ in calls] + [(e, -1, kind) for _, e, kind, _ in calls])
    inflight, last, area = {"task": 0, "prompt": 0}, events[0][0] if events else 0.0, 0.0
    spent = {"task": 0.0, "prompt only": 0.0, "idle": 0.0}
    for t, step, kind in events:
        gap = t - last
        area += inflight["task"] * gap
        spent["task" if inflight["task"] else "prompt only" if inflight["prompt"] else "idle"] += gap
        inflight[kind], last = inflight[kind] + step, t
    total = sum(spent.values())
    return {
        **{k: round(v, 2) for k, v in spent.items()},
        "mean task calls in flight": round(area / total, 2) if total else 0,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    calls: list[tuple[float, float, str, str]] = []
    lock, untimed = threading.Lock(), world.SyntheticWorld.__call__

    def timed(self: world.SyntheticWorld, call):
        task = any(world._TASK_FIELD.fullmatch(f) for f in call.output_fields)
        start = time.perf_counter()
        out = untimed(self, call)
        with lock:
            calls.append((start, time.perf_counter(), "task" if task else "prompt", ",".join(call.output_fields)))
        return out

    world.SyntheticWorld.__call__ = timed
    try:
        code = run.main(args[1:])
    finally:
        world.SyntheticWorld.__call__ = untimed
    with open(args[0], "w") as out:
        json.dump(calls, out)
    print(json.dumps(busy(calls)))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
