"""What the grammar costs per generated token: constrained calls of the default model, llama.cpp's decode timed
apart from the rest, and how often the grammar refuses the model's top token.

``python -m experiments.main_job.sampler_probe --top 32`` times the sampler as it ships; ``--top 0`` looks at no
logit beyond the refused one, so every refusal masks the whole vocabulary (the sampler before).
"""

from __future__ import annotations

import argparse
import time

import dspy
import llama_cpp._internals as internals

from dspy_agentgrad.embedded_lm import grammar_first, local_lm, threads

PASSAGE = "Anna Berg lives in Oslo. Her neighbour Jonas Kim is a nurse who plays the clarinet."
QUESTIONS = ["Who plays the clarinet?", "Where does Anna live?", "What is Jonas's job?", "Who is Anna's neighbour?"]


class Reading(dspy.Signature):
    """Answer the question from the passage with reasoning."""

    passage: str = dspy.InputField()
    question: str = dspy.InputField()
    notes: str = dspy.OutputField()
    answer: str = dspy.OutputField()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=grammar_first.TOP_CANDIDATES, help="logits looked at first")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    grammar_first.TOP_CANDIDATES = args.top
    threads.GOVERNOR.choose = lambda: args.threads
    seen = {"decodes": 0, "decode_s": 0.0, "prompt_s": 0.0, "tokens": 0, "refused": 0}
    decode, first_allowed = internals.LlamaContext.decode, grammar_first.first_allowed

    def timed(self, batch):
        start = time.perf_counter()
        try:
            return decode(self, batch)
        finally:
            key = "decode_s" if batch.batch.n_tokens == 1 else "prompt_s"
            seen[key] += time.perf_counter() - start
            seen["decodes"] += batch.batch.n_tokens == 1

    def counted(*a, **k):
        seen["refused"] += 1
        return first_allowed(*a, **k)

    internals.LlamaContext.decode, grammar_first.first_allowed = timed, counted
    predict = dspy.Predict(Reading)
    with dspy.context(lm=local_lm(cache=False)):
        predict(passage=PASSAGE, question="Who lives in Oslo?")  # loads the model and fills the prefix cache
        seen.update(decodes=0, decode_s=0.0, prompt_s=0.0, refused=0)
        started = time.perf_counter()
        for question in QUESTIONS * 3:
            predict(passage=PASSAGE, question=question)
        wall = time.perf_counter() - started
    rest = wall - seen["decode_s"] - seen["prompt_s"]
    print(
        f"top {args.top}: {wall:.2f} s for 12 calls; {seen['decodes']} generated tokens, "
        f"{1000 * seen['decode_s'] / seen['decodes']:.2f} ms each in llama.cpp; prompts {seen['prompt_s']:.2f} s; "
        f"the rest {1000 * rest / seen['decodes']:.2f} ms a generated token; "
        f"top token refused by the grammar {seen['refused']} times"
    )


if __name__ == "__main__":
    main()
