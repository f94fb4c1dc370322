"""docs/harel.md's multi-machine example run as written: its `checkout.py` as two worker
processes (the "machines") and its publisher block, on a real 3-node cluster that holds both
the queue and harel's RqliteStore. The only change: the cluster's address in `NODES`."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from harel.engine.execution import Status
from harel.engine.store import RqliteStore

from rqlite_queue.testing import Cluster

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "harel.md").read_text()


def test_the_multi_machine_example_runs(rqlited_path: str, tmp_path: Path) -> None:
    module = re.search(r'```python title="checkout.py"\n(.*?)```', PAGE, re.DOTALL)
    publisher = re.search(r"```python\n(from harel import Event\n.*?)```", PAGE, re.DOTALL)
    assert module is not None and publisher is not None
    assert "RqliteStore" in module.group(1) and "worker_id=" in module.group(1)
    cluster = Cluster(3, binary=rqlited_path).start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        source, count = re.subn(
            r'^NODES = ".*"$', f"NODES = {cluster.url!r}", module.group(1), flags=re.MULTILINE
        )
        assert count == 1
        (tmp_path / "checkout.py").write_text(source)
        for i in range(2):
            log = (tmp_path / f"worker{i}.log").open("wb")
            workers.append(
                subprocess.Popen(
                    [sys.executable, "checkout.py"], cwd=tmp_path, stdout=log, stderr=log
                )
            )
        done = subprocess.run(
            [sys.executable, "-c", publisher.group(1)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        execution_id = done.stdout.strip().splitlines()[-1]
        store = RqliteStore(cluster.url.split(",")[0])
        deadline = time.monotonic() + 60
        while True:
            exe = store.load(execution_id)
            if exe is not None and exe.status is Status.DONE:
                break
            assert all(w.poll() is None for w in workers), [
                (tmp_path / f"worker{i}.log").read_text() for i in range(2)
            ]
            assert time.monotonic() < deadline, exe and (exe.status, exe.active_path)
            time.sleep(0.2)
        assert exe.active_path.endswith("Done")
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for i, worker in enumerate(workers):
            assert worker.wait(timeout=30) == 0, (tmp_path / f"worker{i}.log").read_text()
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        cluster.stop()
