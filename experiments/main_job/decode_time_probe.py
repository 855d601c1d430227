"""Where the main job's time goes: llama.cpp's decode calls timed, prompt batches apart from generated tokens.

``python -m experiments.main_job.decode_time_probe --threads 2 -- --seed 0 --out /tmp/probe`` runs the main job
in this process (the words after ``--`` are the job's own options) with llama.cpp's thread count fixed, and
prints the decode calls, tokens and seconds of each kind.
"""

from __future__ import annotations

import argparse
import collections
import time

import llama_cpp._internals as internals

from dspy_agentgrad.demo.job import main as run_job
from dspy_agentgrad.embedded_lm import threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: chosen per call)")
    parser.add_argument("job", nargs="*", help="the main job's options, after --")
    args = parser.parse_args()
    if args.threads is not None:
        threads.GOVERNOR.choose = lambda: args.threads
    stats: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])
    decode = internals.LlamaContext.decode

    def timed(self, batch):
        tokens = batch.batch.n_tokens
        start = time.perf_counter()
        try:
            return decode(self, batch)
        finally:
            row = stats["generated tokens" if tokens == 1 else "prompts"]
            row[0], row[1], row[2] = row[0] + 1, row[1] + tokens, row[2] + time.perf_counter() - start

    internals.LlamaContext.decode = timed
    started = time.perf_counter()
    run_job(["demo", *args.job])
    for kind, (calls, tokens, seconds) in stats.items():
        print(f"{kind}: {calls} decode calls, {tokens} tokens, {seconds:.1f} s")
    print(f"wall: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
