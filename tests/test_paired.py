"""A paired change on held-out examples: when it is within noise."""

from __future__ import annotations

import pytest

from dspy_agentgrad.reporting.paired import PairedChange


def test_a_change_on_one_example_of_many_is_within_noise_and_a_steady_one_is_not():
    before = [0.2] * 24
    one_jump = PairedChange.of(before, [1.0] + [0.2] * 23)
    assert (one_jump.wins, one_jump.losses, one_jump.ties) == (1, 0, 23)
    assert one_jump.gain == pytest.approx(0.8 / 24) and one_jump.within_noise()
    steady = PairedChange.of(before, [0.3] * 24)
    assert steady.gain == pytest.approx(0.1) and steady.wins == 24 and not steady.within_noise()
    mixed = PairedChange.of([0.0, 1.0, 0.5, 0.5], [1.0, 0.0, 0.5, 0.6])
    assert (mixed.wins, mixed.losses, mixed.ties) == (2, 1, 1) and mixed.within_noise()
    unchanged = PairedChange.of(before, before)
    assert unchanged.gain == 0 and not unchanged.within_noise()
    with pytest.raises(ValueError, match="same examples"):
        PairedChange.of([0.1, 0.2], [0.3])
