"""Schedules on a real 3-node cluster: workers racing to publish the same ticks publish each
exactly once, through a leader kill; and a delayed message reaches an idle worker on time."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from rqlite_queue import Lease, Transport, Worker
from rqlite_queue.testing import Cluster

EVERY = 0.5


def test_racing_workers_publish_each_tick_once_through_a_leader_kill(
    rqlite_cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = rqlite_cluster_factory(3)
    queue = f"sch_{uuid.uuid4().hex[:8]}"
    admin = Transport.from_url(cluster.url, queue=queue)
    made = admin.schedule("beat", "ticks", "tick", every=EVERY, catch_up=True)
    handled: list[float] = []
    lock = threading.Lock()

    def handle(lease: Lease) -> None:
        with lock:
            handled.append(time.time())

    workers = [
        Worker(Transport.from_url(cluster.url, queue=queue), handle, poll_interval=0.02)
        for _ in range(3)
    ]
    threads = [threading.Thread(target=w.run, kwargs={"handle_signals": False}) for w in workers]
    for thread in threads:
        thread.start()
    time.sleep(5)
    leader = cluster.leader()
    leader.kill()
    time.sleep(1.5)
    leader.restart()
    time.sleep(6)
    for worker in workers:
        worker.stop()
    for thread in threads:
        thread.join(30)
    [last] = admin.schedules()
    stats = admin.stats()
    published = len(handled) + stats.depth + stats.dead
    # Each tick moved the schedule on by EVERY and published one message: from the first
    # tick to the last, none was lost to the leader kill, none published twice by racers.
    ticks = round((last.next_at - made.next_at) / EVERY)
    assert published == ticks == sum(w.stats.ticks for w in workers)
    assert ticks >= 20
    assert sum(1 for w in workers if w.stats.ticks) >= 2, "the workers did not race"
    for worker in workers:
        worker.transport.close()
    admin.close()


def test_an_idle_worker_handles_a_delayed_message_on_time(rqlite_cluster3: Cluster) -> None:
    queue = f"sch_{uuid.uuid4().hex[:8]}"
    q = Transport.from_url(rqlite_cluster3.url, queue=queue)
    seen: list[float] = []
    worker = Worker(q, lambda lease: seen.append(time.time()), poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    time.sleep(0.3)
    due = time.time() + 1.0
    q.publish("g", "later", not_before=due)
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    thread.join(10)
    assert seen, "never delivered"
    assert due <= seen[0] < due + 0.5  # not a moment before; within a poll or so after
    q.close()
