"""The realism knobs of the synthetic world: how its simulated LMs misbehave the way real LMs do.

Every knob is off in :data:`EXACT` (the world as it was: a deterministic task LM, a prompt LM that writes
the exact fix for every symptom it is shown, rules that never fade). Each knob applies the same rule to
every optimizer's calls: the world never knows which optimizer is asking, so a knob can only favour a
*procedure* (e.g. one that checks before it believes), never a name. ``docs/zoo.md`` says, knob by knob,
the real-LM behaviour it models and why it is neutral.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: A slip (a right step that goes wrong) per unit of temperature, and a lucky guess (a wrong step that comes
#: out right) per unit of temperature: at temperature 1, 6% of right steps slip and 20% of wrong steps are right.
SLIP_PER_T = 0.06
LUCKY_PER_T = 0.20
#: The share of examples a wrong rule breaks (no symptom: the step refuses what it should pass).
WRONG_RULE_BREAK_RATE = 0.15
#: The share of an interacting defect's examples on which its fix exposes the partner defect downstream.
INTERACT_EXPOSE_RATE = 0.5
#: Words of instruction a step follows at full strength; fading starts past it.
FADE_FREE_WORDS = 20


#: The knobs of :class:`Realism` (every field but the seed), each a number between 0 and 1.
KNOBS = ("temperature", "recall", "wrong_rule", "fade", "interact", "paraphrase")


@dataclass(frozen=True)
class Realism:
    """How the simulated task and prompt LMs misbehave (all zero / one: they do not).

    temperature: the task LM samples: fresh randomness per call (right steps slip, wrong steps are sometimes
        right, hints are followed at ``hint_rate`` per call, wording differs on every call).
    recall: the share of the symptoms it is shown that a prompt-LM call acts on (each drawn per call).
    wrong_rule: the chance that an instruction-writing call also adds a rule of its own invention, which
        breaks ``WRONG_RULE_BREAK_RATE`` of the step's examples.
    fade: how fast rules lose force as an instruction grows: a rule works with probability
        ``1 / (1 + fade * extra_words / FADE_FREE_WORDS)``.
    interact: the share of defects (not on the last step) whose fix exposes a partner defect on the next step.
    paraphrase: the chance that an instruction-writing call rewords the instruction it returns (its rules kept,
        its length unchanged), whether or not it adds a rule: an LM asked to improve an instruction seldom hands
        it back word for word, even when it has nothing to add.
    seed: the seed of the world's random draws (sampling, recall, wrong rules).
    """

    temperature: float = 0.0
    recall: float = 1.0
    wrong_rule: float = 0.0
    fade: float = 0.0
    interact: float = 0.0
    paraphrase: float = 0.0
    seed: int = 0

    def __post_init__(self):
        for name in KNOBS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number between 0 and 1; got {value!r}")

    @property
    def slip(self) -> float:
        return SLIP_PER_T * self.temperature

    @property
    def lucky(self) -> float:
        return LUCKY_PER_T * self.temperature

    def as_dict(self) -> dict:
        return asdict(self)


EXACT = Realism()
