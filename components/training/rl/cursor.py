"""The data cursor: which RL queries a step trains on, reproducible from (seed, position) alone.

Each epoch is a fresh permutation of the query indices seeded by (seed, epoch); the cursor's state is the number of
queries consumed so far, so a resumed run continues with exactly the batch the killed run would have drawn next.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


def epoch_order(num_queries: int, seed: int, epoch: int) -> list[int]:
    """The permutation of 0..num_queries-1 used in `epoch`."""
    order = list(range(num_queries))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


@dataclass
class QueryCursor:
    num_queries: int
    seed: int = 0
    position: int = 0  # queries consumed since the start of training

    def next_batch(self, size: int) -> list[int]:
        """The next `size` query indices (wrapping into the next epoch), advancing the cursor."""
        if self.num_queries <= 0:
            raise ValueError("the RL query set is empty")
        batch = []
        for _ in range(size):
            epoch, offset = divmod(self.position, self.num_queries)
            batch.append(epoch_order(self.num_queries, self.seed, epoch)[offset])
            self.position += 1
        return batch

    @property
    def epoch(self) -> float:
        return self.position / self.num_queries

    def state(self) -> dict:
        return {"position": self.position, "num_queries": self.num_queries, "seed": self.seed}

    @classmethod
    def from_state(cls, state: dict, num_queries: int, seed: int) -> "QueryCursor":
        """A cursor at a saved position; refuses a state taken over a different query set."""
        if state and state.get("num_queries") not in (None, num_queries):
            raise ValueError(f"the checkpoint's data cursor covers {state['num_queries']} queries but the query file "
                             f"has {num_queries}: resume with the same --queries, or start a fresh --checkpoints dir")
        return cls(num_queries=num_queries, seed=seed, position=int(state.get("position", 0)) if state else 0)
