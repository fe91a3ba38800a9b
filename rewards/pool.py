"""Score completions in worker processes with a hard per-sample wall limit.

pool = RewardPool(workers=1, timeout_s=10)
results = pool.score([(task_row, completion), ...])   # [(score, info)], in order
ticket = pool.submit(job); ...; result = pool.result(ticket)   # asynchronous: the caller works meanwhile
pool.close()

Each worker is its own spawned process fed one job at a time over a pipe. A job that outlives
`timeout_s` gets its worker killed and replaced and scores 0 with reason "timeout"; a worker that
dies (segfault, os._exit) scores 0 with reason "crash". Neither stops the batch, and nothing else
in the batch is scored 0 for it. The default job function is tasks.score_row (by the row's `task`).
The workers ignore SIGINT and SIGTERM: the trainer decides when the run stops.
"""
import atexit
import multiprocessing as mp
import signal
import time
from multiprocessing.connection import wait

from tasks import score_row


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
        self.todo: list = []  # (ticket, job) not started yet
        self.busy: dict[int, tuple[int, float]] = {}  # worker index -> (ticket, deadline)
        self.done: dict = {}  # ticket -> result not yet taken
        self.next_ticket = 0
        self.dropped: set = set()  # tickets discarded while running
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
        """Every job's result, in order (blocks until all are done)."""
        return [self.result(t) for t in [self.submit(j) for j in jobs]]

    def submit(self, job: tuple) -> int:
        """Queue fn(*job); -> a ticket for result(). Jobs start in submission order as workers free up."""
        self.todo.append((self.next_ticket, job))
        self.next_ticket += 1
        self._pump(0.0)
        return self.next_ticket - 1

    def result(self, ticket: int):
        """fn's return for that job, or (0.0, {"reason": "timeout" | "crash" | "error", ...}); blocks until done."""
        while ticket not in self.done:
            self._pump(None)
        return self.done.pop(ticket)

    def discard(self, ticket: int) -> None:
        """The caller no longer wants that job's result: dropped whether it is queued, running or done."""
        self.todo = [(t, j) for t, j in self.todo if t != ticket]
        if self.done.pop(ticket, None) is None and any(t == ticket for t, _ in self.busy.values()):
            self.dropped.add(ticket)

    def _pump(self, timeout: float | None) -> None:
        """Start queued jobs on free workers, then collect what finished, waiting up to `timeout` seconds (None:
        until something finishes or a deadline passes)."""
        for w in range(len(self.procs)):
            if w not in self.busy and self.todo:
                ticket, job = self.todo.pop(0)
                self.procs[w][1].send(job)
                self.busy[w] = (ticket, time.monotonic() + self.timeout_s)
        if not self.busy:
            return
        conns = {self.procs[w][1]: w for w in self.busy}
        sentinels = {self.procs[w][0].sentinel: w for w in self.busy}
        next_deadline = min(d for _, d in self.busy.values())
        wait_s = max(0.0, next_deadline - time.monotonic())
        ready = wait(list(conns) + list(sentinels), timeout=wait_s if timeout is None else min(timeout, wait_s))
        for r in ready:
            w = conns.get(r, sentinels.get(r))
            if w not in self.busy:
                continue
            ticket, _ = self.busy.pop(w)
            try:
                out = self.procs[w][1].recv() if r in conns else None
            except (EOFError, OSError):
                out = None
            if out is None:
                out = (0.0, {"reason": "crash"})
                self._replace(w)
            self._finish(ticket, out)
        for w, (ticket, deadline) in list(self.busy.items()):
            if time.monotonic() >= deadline:
                self.busy.pop(w)
                self._finish(ticket, (0.0, {"reason": "timeout"}))
                self._replace(w)
        if self.todo and len(self.busy) < len(self.procs):
            self._pump(0.0)

    def _finish(self, ticket: int, out) -> None:
        if ticket in self.dropped:
            self.dropped.discard(ticket)
        else:
            self.done[ticket] = out

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
