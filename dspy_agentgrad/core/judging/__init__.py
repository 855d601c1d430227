"""Step 5's judging: which judge a run uses, picked once from the options.

The paper's judge (:class:`SequentialJudge`) takes one candidate at a time; the stacked judge
(:class:`StackedJudge`, ``validate_together``) validates a stack of rewrites together and falls back to the
paper's judge for what the stack cannot keep. Both decide with :class:`Acceptance` and write every verdict through
:class:`Verdicts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..round_rules import RoundRules
from .protocol import JudgingParts, RoundJudge
from .sequential import SequentialJudge
from .stacked import StackedJudge

if TYPE_CHECKING:  # the sources import the verdict writer from here
    from ..sources import Sources


def judge_for(rules: RoundRules, parts: JudgingParts, sources: Sources) -> RoundJudge:
    """The stacked judge when the rules group rounds in validation windows (``validate_together`` with rewrites as
    the only candidates, windows of ``stack_rounds``), otherwise the paper's judge over every source."""
    one_at_a_time = SequentialJudge(parts, sources.candidates)
    if rules.stack_rounds is not None and sources.rewrites is not None:
        return StackedJudge(one_at_a_time, sources.rewrites, rules)
    return one_at_a_time
