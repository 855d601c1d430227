"""The demo task AgentGrad optimizes with the embedded local LM: two-step fact extraction.

Each example is a short generated passage about a person (name, city, job,
employer, start year, instrument; plus one distractor sentence about a
neighbour) and a question about that person; the answer
is a span of the passage ("Hamburg", "1998", "Omar Haddad"). The program has two
predictors: ``locate`` quotes the sentence that answers the question, ``answer``
reads only that evidence and writes the short answer. A wrong final answer can
come from either step, so attribution across predictors matters.

Why this task: a 135M instruct model copies text well but answers verbosely
("Lena Fischer lives in Hamburg and works..."), so its token-F1 starts well
above 0 and well below 1, and a sharper instruction ("only the words that
answer, no sentence") helps it: room for prompt optimization. (IFEval-style
constrained writing was tried first and dropped: under DSPy's prompt format the
local models answer with the prompt itself or with the ``{response}``
placeholder, so the baseline measured only how often an echo satisfied a
constraint.)

The data is generated from a seed: no file, no network, no licence question;
any split size.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from typing import Any

import dspy

__all__ = ["load_demo_data", "make_program", "metric", "hint", "demo_hint", "f1", "demo_lm"]

_FIRST = [
    "Lena",
    "Omar",
    "Sofia",
    "Kenji",
    "Amara",
    "Lucas",
    "Priya",
    "Mateo",
    "Ingrid",
    "Tariq",
    "Chloe",
    "Diego",
    "Hana",
    "Felix",
    "Zara",
    "Ivan",
    "Nadia",
    "Oscar",
    "Maya",
    "Tomas",
    "Leila",
    "Jonas",
    "Aiko",
    "Marco",
    "Elif",
    "Hugo",
    "Rosa",
    "Samir",
    "Greta",
    "Pablo",
]
_LAST = [
    "Fischer",
    "Haddad",
    "Rossi",
    "Tanaka",
    "Okafor",
    "Martin",
    "Sharma",
    "Lopez",
    "Berg",
    "Aziz",
    "Dubois",
    "Ramirez",
    "Kim",
    "Wagner",
    "Khan",
    "Petrov",
    "Nowak",
    "Larsen",
    "Silva",
    "Novak",
    "Moreau",
    "Schmidt",
    "Sato",
    "Bianchi",
    "Yilmaz",
    "Laurent",
    "Costa",
    "Mansour",
    "Lind",
    "Vega",
]
_CITIES = [
    "Hamburg",
    "Lisbon",
    "Osaka",
    "Nairobi",
    "Lyon",
    "Toronto",
    "Krakow",
    "Valencia",
    "Oslo",
    "Cairo",
    "Porto",
    "Seoul",
    "Dublin",
    "Bogota",
    "Perth",
    "Tallinn",
    "Geneva",
    "Quito",
    "Hanoi",
    "Turin",
]
_JOBS = [
    "marine biologist",
    "pilot",
    "baker",
    "architect",
    "nurse",
    "geologist",
    "librarian",
    "chemist",
    "carpenter",
    "journalist",
    "pharmacist",
    "engineer",
    "teacher",
    "photographer",
    "veterinarian",
]
_ORGS = [
    "Northwind Labs",
    "Bluefield Hospital",
    "Atlas Airways",
    "Greenleaf Press",
    "Harbor Bank",
    "Summit Foods",
    "Orion Museum",
    "Cedar School",
    "Polar Institute",
    "Redstone Studio",
]
_INSTRUMENTS = ["cello", "violin", "piano", "flute", "drums", "guitar", "trumpet", "harp", "clarinet", "accordion"]


def _person(rng: random.Random, taken: set[str]) -> dict[str, Any]:
    while True:
        name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        if name.split()[0] not in taken:
            taken.add(name.split()[0])
            break
    return {
        "name": name,
        "first": name.split()[0],
        "city": rng.choice(_CITIES),
        "job": rng.choice(_JOBS),
        "org": rng.choice(_ORGS),
        "year": str(rng.randint(1971, 2019)),
        "instrument": rng.choice(_INSTRUMENTS),
    }


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _example(rng: random.Random) -> dspy.Example:
    """One passage (a person's three facts, shuffled, plus one sentence about a neighbour) and a question."""
    taken: set[str] = set()
    p, other = _person(rng, taken), _person(rng, taken)
    while other["job"] == p["job"]:
        other["job"] = rng.choice(_JOBS)
    sentences = [
        f"{p['name']} is {_article(p['job'])} {p['job']} who lives in {p['city']}.",
        f"{p['first']} joined {p['org']} in {p['year']}.",
        f"In the evenings, {p['first']} plays the {p['instrument']}.",
        f"{p['first']}'s neighbour {other['name']} is {_article(other['job'])} {other['job']}.",
    ]
    rng.shuffle(sentences)
    passage = " ".join(sentences)
    kind = rng.choice(["city", "job", "year", "instrument", "org", "who"])
    question, answer = {
        "city": (f"In which city does {p['first']} live?", p["city"]),
        "job": (f"What is {p['first']}'s job?", p["job"]),
        "year": (f"In which year did {p['first']} join {p['org']}?", p["year"]),
        "instrument": (f"Which instrument does {p['first']} play?", p["instrument"]),
        "org": (f"Which organization did {p['first']} join?", p["org"]),
        "who": (f"Who works as {_article(p['job'])} {p['job']}?", p["name"]),
    }[kind]
    evidence = next(s for s in sentences if answer in s and "neighbour" not in s)
    return dspy.Example(passage=passage, question=question, answer=answer, evidence=evidence, kind=kind).with_inputs(
        "passage", "question"
    )


def load_demo_data(
    n_train: int = 30, n_val: int = 30, n_test: int = 60, seed: int = 0
) -> tuple[list[dspy.Example], list[dspy.Example], list[dspy.Example]]:
    """Seeded, disjoint train/val/test lists of ``dspy.Example(passage, question)``.

    Labels: ``answer`` (a span of the passage), ``evidence`` (the sentence that
    contains it), ``kind`` (city, job, year, instrument, org, who).
    """
    rng = random.Random(seed)
    seen: set[tuple[str, str]] = set()
    examples: list[dspy.Example] = []
    while len(examples) < n_train + n_val + n_test:
        ex = _example(rng)
        key = (ex.passage, ex.question)
        if key not in seen:
            seen.add(key)
            examples.append(ex)
    return examples[:n_train], examples[n_train : n_train + n_val], examples[n_train + n_val :]


# ---------------------------------------------------------------- program


class Locate(dspy.Signature):
    """Find the sentence of the passage that answers the question."""

    passage: str = dspy.InputField()
    question: str = dspy.InputField()
    evidence: str = dspy.OutputField(desc="a sentence from the passage")


class Answer(dspy.Signature):
    """Answer the question from the evidence."""

    evidence: str = dspy.InputField()
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class LocateThenAnswer(dspy.Module):
    """``locate`` quotes the evidence; ``answer`` sees only that evidence and the question."""

    def __init__(self) -> None:
        super().__init__()
        self.locate = dspy.Predict(Locate)
        self.answer = dspy.Predict(Answer)

    def forward(self, passage: str, question: str) -> dspy.Prediction:
        evidence = self.locate(passage=passage, question=question).evidence
        answer = self.answer(evidence=evidence, question=question).answer
        return dspy.Prediction(evidence=evidence, answer=answer)


def make_program() -> dspy.Module:
    """A fresh, unoptimized locate-then-answer program."""
    return LocateThenAnswer()


# Grammar bound of str fields, in characters. Measured (experiments/main_job/demo_job.md): at 80
# characters (a gold sentence is at most 55) the model's habit of copying the passage start was cut
# mid-sentence, partial credit fell (0.135 -> 0.067 on 6 examples) and no failure of the job's
# training batch could be attributed; completion tokens fell only 15%. 300 leaves the optimizer's
# own roles (gradients, rewritten instructions) room for a few sentences too.
TASK_STR_CHARS = 300


def demo_lm(**settings: Any) -> dspy.LM:
    """The local LM as the demo uses it (program steps and optimizer roles): str fields capped."""
    from ..embedded_lm import OutputLimits, local_lm

    settings.setdefault("limits", OutputLimits(str_chars=TASK_STR_CHARS))
    return local_lm(**settings)


# ---------------------------------------------------------------- metric and hint


def _normalize(text: str) -> list[str]:
    text = "".join(ch for ch in str(text).lower() if ch not in set(string.punctuation))
    return [w for w in text.split() if w not in ("a", "an", "the")]


def f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 (lowercase, no punctuation or articles)."""
    pred, ref = _normalize(prediction), _normalize(gold)
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return float(pred == ref)
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def shows_answer(example: dspy.Example, evidence: str) -> bool:
    """Whether ``evidence`` holds the gold answer (then the answer step had what it needed)."""
    return re.search(re.escape(example.answer.lower()), str(evidence or "").lower()) is not None


def metric(
    example: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None, pred_trace: Any = None
) -> dspy.Prediction:
    """Token F1 of the final answer against the gold span, with feedback on both steps.

    Accepts DSPy's ``metric(example, pred, trace)`` and GEPA's per-predictor
    form; the score is always the system-level F1 in [0, 1].
    """
    answer = str(getattr(pred, "answer", "") or "")
    score = f1(answer, example.answer)
    if score == 1.0:
        return dspy.Prediction(score=1.0, feedback="Correct: the answer is exactly the right words.")
    parts = [
        f"The answer {answer[:120]!r} should be {example.answer!r}: only the words that answer the "
        "question, copied from the passage, not a sentence."
    ]
    evidence = getattr(pred, "evidence", None)
    if evidence is not None and not shows_answer(example, evidence):
        parts.append(
            f"The evidence {str(evidence)[:160]!r} does not contain the answer; the right sentence "
            f"is {example.evidence!r}."
        )
    return dspy.Prediction(score=round(score, 4), feedback=" ".join(parts))


def expected_output(example: dspy.Example, pred_name: str, prediction: Any) -> str | None:
    """What ``pred_name`` should have written on this example (None when already correct).

    ``locate``: the gold evidence sentence; ``answer``: the gold answer, but only when the evidence
    ``answer`` received contains it: with wrong evidence the answer step is not at fault, and the failure
    moves on to ``locate``. (AgentGrad's leak check would reject such a copied answer too, except for years:
    labels of digits only are too short to check.)
    """
    if f1(str(getattr(prediction, "answer", "") or ""), example.answer) == 1.0:
        return None
    if pred_name == "locate":
        return example.evidence
    if not shows_answer(example, getattr(prediction, "evidence", "")):
        return None
    return example.answer


def hint(example: dspy.Example, pred_name: str, prediction: Any, feedback: str | None) -> str | None:
    """:func:`expected_output` as advice, for a hint delivered as an input field or in the instruction."""
    value = expected_output(example, pred_name, prediction)
    if value is None:
        return None
    if pred_name == "locate":
        return f"The sentence that answers the question is: {value!r}. Copy exactly this sentence."
    return f"The correct answer is {value!r}. Reply with exactly {value!r} and nothing else."


def demo_hint(example: dspy.Example, pred_name: str, prediction: Any, feedback: str | None) -> str | None:
    """:func:`expected_output` itself, for a hint shown as a worked example of the call (``hint_delivery="demo"``):
    the step is shown its own inputs with this output. SmolLM2-135M copies a demonstration far more often than it
    follows a hint's advice (experiments/main_job/demo_job.md, section 7)."""
    return expected_output(example, pred_name, prediction)
