"""How the model spells the reply's field headers: the tokens each generation of the main job starts with, against
the tokenizer's own tokens for ``[[ ## <field> ## ]]\\n``.

``python -m experiments.main_job.header_tokens_probe -- --seed 0 --out /tmp/probe`` runs the main job in this
process (the words after ``--`` are the job's own options) and prints how many generations start with the
tokenizer's spelling of their header, and the most common other spellings. Forcing the header without asking
the model would change the tokens of every generation that spells it otherwise.
"""

from __future__ import annotations

import argparse
import collections

import llama_cpp

from dspy_agentgrad.demo.job import main as run_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="*", help="the main job's options, after --")
    args = parser.parse_args()
    generations: list[tuple[llama_cpp.Llama, list[int]]] = []
    generate = llama_cpp.Llama.generate

    def recorded(self, tokens, *rest, **options):
        out: list[int] = []
        generations.append((self, out))
        for token in generate(self, tokens, *rest, **options):
            out.append(int(token))
            yield token

    llama_cpp.Llama.generate = recorded
    run_job(["demo", *args.job])
    spellings: collections.Counter = collections.Counter()
    tokenizer_own = 0
    for llama, out in generations:
        text = llama.detokenize(out).decode("utf-8", "replace")
        header = text[: text.find("\n") + 1] if text.startswith("[[") else ""
        own = llama.tokenize(header.encode(), add_bos=False, special=False) if header else []
        if own and out[: len(own)] == own:
            tokenizer_own += 1
        else:
            spellings[tuple(llama.detokenize([t]).decode("utf-8", "replace") for t in out[:8])] += 1
    print(f"{tokenizer_own} of {len(generations)} generations start with the tokenizer's spelling of their header")
    for spelling, count in spellings.most_common(5):
        print(f"  {count} x {list(spelling)}")


if __name__ == "__main__":
    main()
