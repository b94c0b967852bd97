"""A real 429: a server admitting one compression at a time, asked for four at once."""

from __future__ import annotations

import random
import tempfile
import threading
from pathlib import Path

import pytest

import scd_client
from conftest import TASK, start_server, stop


@pytest.fixture(scope="module")
def one_slot_server():
    with tempfile.TemporaryDirectory(prefix="scd-py-client-busy-") as d:
        s = start_server(Path(d), "--max-concurrent-compress", "1")
        try:
            yield s
        finally:
            stop(s)


def test_a_full_server_answers_busy_with_its_hint(one_slot_server):
    rng = random.Random(7)
    words = "charge pool database connection exhausted retry order receipt table checkout payment".split()
    # large enough that one compression holds the slot while the others arrive
    contexts = [
        [{"name": f"f{j}", "content": " ".join(rng.choice(words) for _ in range(120))} for j in range(20)]
        for _ in range(4)
    ]
    barrier = threading.Barrier(len(contexts))
    results: list[object] = []

    def call(ctx):
        c = scd_client.Client(one_slot_server.url, retries=0)
        barrier.wait()
        try:
            results.append(c.compress(TASK, ctx, budget=100))
        except scd_client.ScdError as e:
            results.append(e)

    threads = [threading.Thread(target=call, args=(ctx,)) for ctx in contexts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    busy = [r for r in results if isinstance(r, scd_client.Busy)]
    done = [r for r in results if isinstance(r, scd_client.Compressed)]
    assert busy and done, results
    assert len(busy) + len(done) == len(contexts), results
    for e in busy:
        assert e.status == 429 and e.type == "rate_limit_error"
        assert e.retry_after_s is not None and e.retry_after_s > 0
