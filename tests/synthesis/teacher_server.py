"""An OpenAI-compatible chat server whose replies come from the programmatic expert (for endpoint-teacher tests).

Episodes are recognised by their user query text; a reply is cached per (episode, conversation length), so a
request retried after a server error or a client timeout gets the same answer and the expert never skips a step.
"""
from __future__ import annotations

import threading

from components.agent.types import TurnRequest
from components.travel.expert import ExpertConfig, ExpertPolicy

from agent.fake_openai import FakeOpenAI


class ExpertChatServer(FakeOpenAI):
    """`fail(n)` -> (status, delay_s) injects failures by arrival number; a 200 with a delay simulates slowness."""

    def __init__(self, queries, fail=lambda n: (200, 0.0)):
        self.by_text = {q.query: q for q in queries}
        self.policy = ExpertPolicy(ExpertConfig())
        self.replies: dict[tuple[int, int], str] = {}
        self.first_turns: list[int] = []  # idx of every episode whose first turn was asked for
        self.fail = fail
        self._expert_lock = threading.Lock()
        super().__init__(self._answer)

    def _answer(self, body: dict, number: int) -> tuple[int, str, float]:
        status, delay = self.fail(number)
        if status != 200:
            return status, "injected failure", delay
        messages = body["messages"]
        query = self.by_text[messages[1]["content"]]
        key = (query.idx, len(messages))
        with self._expert_lock:
            if key not in self.replies:
                if len(messages) == 2:
                    self.first_turns.append(query.idx)
                request = TurnRequest(messages=messages, episode_id=str(query.idx), meta={"query": query})
                self.replies[key] = self.policy.next_turn(request)
        return 200, self.replies[key], delay
