"""Reading a topic to a count in tests and benchmarks: ``drain``."""

from __future__ import annotations

from roles.events import Consumer, Delivery


def drain(consumer: Consumer, want: int, rounds: int = 60, wait_s: float = 0.3
          ) -> list[Delivery]:
    """Fetches until ``want`` messages are in or ``rounds`` fetches of up to ``wait_s`` each
    have passed: what came."""
    got: list[Delivery] = []
    for _ in range(rounds):
        if len(got) >= want:
            break
        got += consumer.fetch(want - len(got), wait_s)
    return got
