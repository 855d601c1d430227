"""The training batches a round attributes on: every example once per epoch, in an order the seed fixes."""

from __future__ import annotations

import random


class BatchSampler:
    """Epoch-shuffled training batches, reproducible from the seed."""

    def __init__(self, size: int, batch_size: int, rng: random.Random):
        self.size, self.batch_size, self.rng = size, min(batch_size, size), rng
        self.queue: list[int] = []
        self.visits: dict[int, int] = {}  # how many batches each example was in

    def next(self) -> list[int]:
        """The next training batch: every example once per epoch before any repeats.

        A batch that spans two epochs takes from the new one only examples it does not hold yet; the ones it
        holds stay queued for the next batch (dropping them would skip them for a whole epoch).
        """
        batch: list[int] = []
        while len(batch) < self.batch_size:
            if not self.queue:
                self.queue = list(range(self.size))
                self.rng.shuffle(self.queue)
            index = next(i for i in self.queue if i not in batch)  # exists: a batch is never larger than an epoch
            self.queue.remove(index)
            batch.append(index)
        for index in batch:
            self.visits[index] = self.visits.get(index, 0) + 1
        return batch

    def revisited(self, batch: list[int]) -> set[int]:
        """The positions in ``batch`` (the last :meth:`next`) of examples an earlier batch held too."""
        return {position for position, index in enumerate(batch) if self.visits[index] > 1}
