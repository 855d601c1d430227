"""How far a score change on a few examples can be trusted: the paired difference and its standard error.

Why: a held-out set of a couple of dozen examples moves by more than a typical prompt change's true effect. On the
main job's task, demonstrations that raise 72 held-out examples by .04 show a fall on the job's 24 on some seeds
(experiments/main_job/demo_job.md, sections 8-9). A reader should see that from the printed result, not from a probe.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class PairedChange:
    """Two programs' per-example scores on the same examples, compared example by example."""

    examples: int
    gain: float  # mean(after) - mean(before)
    wins: int  # examples scored higher after
    losses: int  # examples scored lower after
    standard_error: float | None  # of the mean per-example difference; None under 2 examples

    @classmethod
    def of(cls, before: list[float], after: list[float]) -> PairedChange:
        """Compare ``after`` with ``before``; both score the same examples in the same order."""
        if len(before) != len(after):
            raise ValueError(f"paired scores need the same examples: {len(before)} before, {len(after)} after")
        diffs = [a - b for a, b in zip(after, before)]
        n = len(diffs)
        return cls(
            examples=n,
            gain=sum(diffs) / n if n else 0.0,
            wins=sum(d > 0 for d in diffs),
            losses=sum(d < 0 for d in diffs),
            standard_error=statistics.stdev(diffs) / math.sqrt(n) if n >= 2 else None,
        )

    @property
    def ties(self) -> int:
        return self.examples - self.wins - self.losses

    def within_noise(self) -> bool:
        """True when the change is under two standard errors (so these examples cannot tell it from chance);
        False for a clear change, and for no per-example change at all."""
        if self.wins + self.losses == 0 or self.standard_error is None:
            return False
        return abs(self.gain) < 2 * self.standard_error

    def as_dict(self, places: int = 4) -> dict:
        """What a results file keeps: the gain and standard error rounded to ``places``, the counts, the verdict."""
        return {
            "gain": round(self.gain, places),
            "wins": self.wins,
            "losses": self.losses,
            "standard_error": None if self.standard_error is None else round(self.standard_error, places),
            "within_noise": self.within_noise(),
        }
