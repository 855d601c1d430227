"""Prompt-LM cost from token counts, priced with litellm's bundled model price table.

Only used when a cost cap is set. The price table is read from the copy that
ships with litellm (no network fetch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def price_function(lm: Any) -> Callable[[dict], float]:
    """A function usage -> USD for ``lm``; raises ValueError when litellm has no price for it."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    model = getattr(lm, "model", None)

    def price(usage: dict) -> float:
        prompt, completion = litellm.cost_per_token(
            model=model,
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
        )
        return float(prompt + completion)

    try:
        price({"prompt_tokens": 1, "completion_tokens": 1})
    except Exception as exc:
        raise ValueError(
            f"max_prompt_cost needs a price for the prompt model {model!r}, and litellm has none "
            f"({type(exc).__name__}); cap tokens with max_prompt_tokens instead"
        ) from None
    return price
