"""One AgentGrad compile on the fake world in its own process, for kill-and-resume tests.

usage: python resume_job.py LOG_DIR OUT_JSON
env: KILL_AT=<what>:<n>  SIGKILL this process at the n-th call of <what> in this process,
         where <what> is "metric" (a scored program run), "task" (a task-LM answer, killed
         once it is paid, before the program sees it) or a prompt-LM role of the world
         ("gradient", "abstract", "rewrite");
     LEDGER=<file>      append a line per metric call (to count calls across processes);
     TASK_LEDGER=<file> append a line per task-LM call (paid: the LM answered);
     KILL_SIGNAL=TERM   end the process with SIGTERM rather than SIGKILL;
     SPECULATE=0        speculate=False;
     THREADS=<n>        num_threads (default 1);
     ALIASES=1          give each example set- and frozenset-valued label fields (their order varies by process).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's dspy_agentgrad, not an installed one

import dspy  # noqa: E402
from world import Pipeline, World, feedback_metric, make_data, world_lm  # noqa: E402

from dspy_agentgrad import AgentGrad  # noqa: E402
from dspy_agentgrad.config import AgentGradConfig

KILL_WHAT, _, KILL_N = os.environ.get("KILL_AT", ":0").partition(":")
seen: Counter[str] = Counter()


def maybe_die(what: str) -> None:
    seen[what] += 1
    if what == KILL_WHAT and seen[what] == int(KILL_N):
        os.kill(os.getpid(), getattr(signal, "SIG" + os.environ.get("KILL_SIGNAL", "KILL")))


class KillableWorld(World):
    def __call__(self, call):
        reply = super().__call__(call)
        if "current_instruction" not in call.inputs:
            if os.environ.get("TASK_LEDGER"):
                with open(os.environ["TASK_LEDGER"], "a") as handle:
                    handle.write("1\n")
            maybe_die("task")
        return reply

    def _role(self, call):
        reply = super()._role(call)
        for role in ("gradient", "abstract", "rewrite"):
            if self.calls[role] != seen[role]:
                maybe_die(role)
        return reply


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
    if os.environ.get("LEDGER"):
        with open(os.environ["LEDGER"], "a") as handle:
            handle.write("1\n")
    maybe_die("metric")
    return feedback_metric(gold, pred, trace)


def with_aliases(examples: list[dspy.Example]) -> list[dspy.Example]:
    return [
        e.copy(
            aliases={e.answer, e.answer.upper(), f"the {e.answer}", f"{e.answer}!"},
            tags=frozenset({"multi", "hop", "aliases", e.question.split()[0]}),
        )
        for e in examples
    ]


def main(log_dir: str, out: str) -> None:
    dspy.configure(lm=world_lm(KillableWorld()))
    train = make_data({"extract": 3, "notes": 2, "answer": 2, "either": 1, "none": 2})
    val = make_data({"extract": 2, "notes": 2, "answer": 1, "none": 2}, start=50)
    if os.environ.get("ALIASES"):
        train, val = with_aliases(train), with_aliases(val)
    optimizer = AgentGrad(
        metric,
        auto=None,
        seed=1,
        log_dir=log_dir,
        num_threads=int(os.environ.get("THREADS", "1")),
        config=AgentGradConfig.from_options(
            max_rounds=3,
            cluster_schedule=(2, 1),
            train_batch_size=6,
            speculate=os.environ.get("SPECULATE", "1") == "1",
            progress=False,
        ),
    )
    result = optimizer.compile(Pipeline(), trainset=train, valset=val).detailed_results
    Path(out).write_text(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
