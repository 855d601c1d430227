"""TextGrad's engine interface over a ``dspy.LM``.

Every TextGrad call (backward feedback, TGD updates) goes through the runner's prompt LM, so it is
metered under the prompt role, cached like the other optimizers' calls, and a fake LM works in tests.
"""

from __future__ import annotations

import logging
import os

from benchmarks.common import MissingExtra, cache_dir

MISSING = (
    "TextGrad is not installed: pip install 'dspy-agentgrad[textgrad]' (or pip install textgrad==0.1.8) "
    "to run the textgrad optimizer"
)


def import_textgrad():
    """``textgrad``, with its import-time log file sent to the cache folder instead of ``./logs``."""
    os.environ.setdefault("TEXTGRAD_LOG_DIR", str(cache_dir() / "textgrad_logs"))
    try:
        import textgrad
    except ImportError as exc:
        raise MissingExtra(MISSING) from exc
    # textgrad sets its logger to INFO at import and logs every prompt: its own log file keeps them,
    # the console does not repeat them
    logging.getLogger("textgrad").propagate = False
    return textgrad


tg = import_textgrad()


class DSPyEngine(tg.EngineLM):
    """A TextGrad engine that answers with a ``dspy.LM`` (one system + one user message per call)."""

    def __init__(self, lm):
        self.lm = lm
        self.model_string = str(getattr(lm, "model", "dspy-lm"))

    def generate(self, prompt: str, system_prompt: str | None = None, **kwargs) -> str:
        messages = [
            {"role": "system", "content": system_prompt or self.system_prompt},
            {"role": "user", "content": str(prompt)},
        ]
        out = self.lm(messages=messages)[0]
        if isinstance(out, dict):  # some LMs return {"text": ...}
            out = out.get("text", "")
        return str(out or "")

    def __call__(self, prompt: str, **kwargs) -> str:
        return self.generate(prompt, **kwargs)
