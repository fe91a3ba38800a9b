"""Score completions in worker processes with a hard per-sample wall limit.

pool = RewardPool(workers=1, timeout_s=10)
results = pool.score([(task_row, completion), ...])   # [(score, info)], in order
pool.close()

Each worker is its own spawned process fed one job at a time over a pipe. A job that outlives
`timeout_s` gets its worker killed and replaced and scores 0 with reason "timeout"; a worker that
dies (segfault, os._exit) scores 0 with reason "crash". Neither stops the batch, and nothing else
in the batch is scored 0 for it. The default job function is rewards.tasks.score_row (by the row's `task`).
The workers ignore SIGINT and SIGTERM: the trainer decides when the run stops.
"""
import atexit
import multiprocessing as mp
import signal
import time
from multiprocessing.connection import wait

from rewards.tasks import score_row


def _worker(conn, fn) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):  # the trainer owns shutdown: a Ctrl-C or SIGTERM meant for the
        signal.signal(sig, signal.SIG_IGN)     # run must not kill its reward workers mid-batch
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(fn(*job))
        except Exception as e:  # a reward bug scores 0 for that sample, the worker lives on
            conn.send((0.0, {"reason": "error", "error": f"{type(e).__name__}: {e}"[:300]}))


class RewardPool:
    """A few spawned workers running `fn(*job) -> (score, info)` with a per-job wall timeout."""

    def __init__(self, workers: int = 1, timeout_s: float = 10.0, fn=score_row):
        self.ctx, self.fn, self.timeout_s = mp.get_context("spawn"), fn, timeout_s
        self.procs = [self._start() for _ in range(max(1, workers))]
        atexit.register(self.close)  # before multiprocessing's exit hook, whose SIGTERM the workers ignore

    def _start(self):
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(child, self.fn), daemon=True)
        p.start()
        child.close()
        return p, parent

    def _replace(self, i: int) -> None:
        p, conn = self.procs[i]
        p.kill()
        p.join()
        conn.close()
        self.procs[i] = self._start()

    def score(self, jobs: list[tuple]) -> list[tuple[float, dict]]:
        results: list = [None] * len(jobs)
        todo = list(range(len(jobs)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker index -> (job index, deadline)
        while todo or busy:
            for w in range(len(self.procs)):
                if w not in busy and todo:
                    j = todo.pop()
                    self.procs[w][1].send(jobs[j])
                    busy[w] = (j, time.monotonic() + self.timeout_s)
            conns = {self.procs[w][1]: w for w in busy}
            sentinels = {self.procs[w][0].sentinel: w for w in busy}
            next_deadline = min(d for _, d in busy.values())
            ready = wait(list(conns) + list(sentinels), timeout=max(0.0, next_deadline - time.monotonic()))
            for r in ready:
                w = conns.get(r, sentinels.get(r))
                if w not in busy:
                    continue
                j, _ = busy.pop(w)
                try:
                    results[j] = self.procs[w][1].recv() if r in conns else None
                except (EOFError, OSError):
                    results[j] = None
                if results[j] is None:
                    results[j] = (0.0, {"reason": "crash"})
                    self._replace(w)
            for w, (j, deadline) in list(busy.items()):
                if time.monotonic() >= deadline:
                    busy.pop(w)
                    results[j] = (0.0, {"reason": "timeout"})
                    self._replace(w)
        return results

    def close(self) -> None:
        for p, conn in self.procs:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
            conn.close()
        self.procs = []
