"""Rule-based fake LM engines for tests and dry runs: deterministic, no network, no model."""

from .fake_lm import FakeCall, FaultyEngine, RuleEngine, fake_lm, parse_call

__all__ = ["FakeCall", "FaultyEngine", "RuleEngine", "fake_lm", "parse_call"]
