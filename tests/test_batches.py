"""Training batches: every example once per epoch, whatever the sizes and the seed."""

from __future__ import annotations

import random

import pytest

from dspy_agentgrad.core.batches import BatchSampler
from dspy_agentgrad.core.clustering import random_minibatches


def test_random_minibatches_cover_every_index_once():
    batches = random_minibatches(7, 3, random.Random(0))
    assert [len(b) for b in batches] == [3, 3, 1] and sorted(sum(batches, [])) == list(range(7))


@pytest.mark.parametrize("size, batch_size", [(5, 2), (7, 3), (6, 4), (3, 3), (9, 8), (4, 6)])
def test_batch_sampler_visits_every_example_once_per_epoch_on_many_seeds(size, batch_size):
    # Counted after every batch, no example is ever drawn twice more than another (an example skipped at an
    # epoch's turn would lag by two), and a batch never holds an example twice.
    for seed in range(60):
        sampler, counts = BatchSampler(size, batch_size, random.Random(seed)), [0] * size
        for _ in range(3 * size):
            batch = sampler.next()
            assert len(batch) == len(set(batch)) == min(size, batch_size)
            for index in batch:
                counts[index] += 1
            assert max(counts) - min(counts) <= 1, (seed, counts)
