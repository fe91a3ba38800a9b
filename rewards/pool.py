"""Score completions in worker processes with a hard per-sample wall limit that counts the job alone.

pool = RewardPool(workers=1, timeout_s=10)
results = pool.score([(task_row, completion), ...])   # [(score, info)], in order
ticket = pool.submit(job); ...; result = pool.result(ticket)   # asynchronous: the caller works meanwhile
pool.close()

Each worker is its own spawned process fed one job at a time over a pipe. A worker's life:
  start   import what unpickling `fn` needs (not the parent's main module: a worker started from trainer.py does
          not import the trainer, torch or vLLM), then say "ready"; until then it gets no job. Start-up has its own
          limit (startup_s): a worker that dies or overruns it is a start failure, replaced, and no job is lost;
          3 failed starts in a row (no job started in between) raise WorkerStartError.
  prepare `prepare(*job)` (default tasks.prepare_row: import the row's reward module, e.g. math-verify), then say
          "started". Importing counts against startup_s, not against the job.
  job     fn(*job) -> (score, info). The wall limit `timeout_s` starts at "started". A job that outlives it gets
          its worker killed and replaced and scores 0 with reason "timeout"; a worker that dies scores 0 with
          reason "crash". Neither stops the batch, and nothing else in the batch is scored 0 for it.
Inside a job, `time_left()` (rewards/deadline.py) is the seconds before the pool kills it: a scorer with its own
limit (the sandbox) takes min(its limit, time_left() - a margin), so the inner limit fires first and cleans up.

Device: a worker sees only its rank's GPU, as cuda:0 (CUDA_VISIBLE_DEVICES as rewards/sandbox.py's rank_gpu_env gives
it, LOCAL_RANK 0), so a reward function that loads a model on "cuda" lands on its rank's GPU, not on GPU 0.

Files: every worker's temporary files (tempfile, TMPDIR: the sandbox's scratch dirs, captured output, a candidate's
inputs) live in its own directory under one root per pool, `$TMPDIR/rlpool-<parent pid>-*`; what the workers of a
pool compute once for all of them (a Triton task's reference) goes in the root's `shared/`, named to them by the
environment variable SHARED_DIR_ENV. A killed worker's
directory is deleted with it, the root at close(), and a new pool deletes the roots of pools whose process is gone
(a SIGKILLed trainer). The workers ignore SIGINT and SIGTERM: the trainer decides when the run stops.
"""
import atexit
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import types
from multiprocessing.connection import wait
from pathlib import Path

from rewards.deadline import set_deadline
from rewards.sandbox import rank_gpu_env
from tasks import prepare_row, score_row

MAX_START_FAILURES = 3  # consecutive failed worker starts before the pool gives up (WorkerStartError)
SHARED_DIR_ENV = "RL_POOL_SHARED"  # a worker's path of its pool's shared/ directory


class WorkerStartError(RuntimeError):
    """Workers keep dying or hanging before they are ready: the job function cannot even be imported."""


def _worker(conn, fn, prepare, tmp: str, timeout_s: float, env: dict) -> None:
    os.environ.update(env)  # before a job can touch CUDA: the rank's device (RewardPool.__init__)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the trainer owns shutdown: a Ctrl-C or SIGTERM meant for the
        signal.signal(sig, signal.SIG_IGN)     # run must not kill its reward workers mid-batch
    os.environ["TMPDIR"] = tempfile.tempdir = tmp  # everything temporary lands where the pool can delete it
    os.environ[SHARED_DIR_ENV] = os.path.join(os.path.dirname(tmp), "shared")
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            if prepare is not None:
                prepare(*job)
            conn.send("started")
            set_deadline(timeout_s)
            conn.send(fn(*job))
        except Exception as e:  # a reward bug scores 0 for that sample, the worker lives on
            conn.send((0.0, {"reason": "error", "error": f"{type(e).__name__}: {e}"[:300]}))
        finally:
            set_deadline(None)


def _spawn_without_main(proc, fns) -> None:
    """proc.start() without the spawned child re-importing the parent's __main__ (trainer.py would import torch,
    vLLM and the rest: seconds to a minute of start-up for a worker that scores text). Functions defined in
    __main__ itself (fns) need it: then the child imports it as usual."""
    if any(getattr(f, "__module__", None) == "__main__" for f in fns):
        return proc.start()
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__: spawn prepares nothing
    try:
        proc.start()
    finally:
        sys.modules["__main__"] = main


def _sweep_stale_roots(base: str) -> None:
    """Delete the file roots of pools whose process is gone (a trainer killed with SIGKILL left them)."""
    for root in Path(base).glob("rlpool-*-*"):
        try:
            pid = int(root.name.split("-")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(root, ignore_errors=True)
        except (ValueError, PermissionError, IndexError):
            pass


class RewardPool:
    """A few spawned workers running `fn(*job) -> (score, info)` with a per-job wall timeout (module docstring)."""

    def __init__(self, workers: int = 1, timeout_s: float = 10.0, fn=score_row, prepare=None, startup_s: float = 300.0):
        self.ctx, self.fn, self.timeout_s, self.startup_s = mp.get_context("spawn"), fn, timeout_s, startup_s
        self.env = {**rank_gpu_env(), "LOCAL_RANK": "0"}  # the workers see only this rank's GPU, as cuda:0
        self.prepare = prepare_row if prepare is None and fn is score_row else prepare
        base = tempfile.gettempdir()
        _sweep_stale_roots(base)
        self.root = tempfile.mkdtemp(prefix=f"rlpool-{os.getpid()}-", dir=base)
        os.mkdir(os.path.join(self.root, "shared"))
        self.starts = 0  # worker processes started (names their file directories)
        self.start_failures = 0  # consecutive
        self.procs = [None] * max(1, workers)  # worker index -> (process, connection, its tmp dir)
        self.state: dict[int, tuple] = {}  # worker index -> ("starting", deadline) | ("preparing", ticket, job,
        # deadline) | ("running", ticket, job, deadline); idle workers are absent
        for w in range(len(self.procs)):
            self._start(w)
        self.todo: list = []  # (ticket, job) not started yet
        self.done: dict = {}  # ticket -> result not yet taken
        self.next_ticket = 0
        self.dropped: set = set()  # tickets discarded while running
        atexit.register(self.close)  # before multiprocessing's exit hook, whose SIGTERM the workers ignore

    def _start(self, w: int) -> None:
        self.starts += 1
        tmp = os.path.join(self.root, f"w{self.starts}")
        os.mkdir(tmp)
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(child, self.fn, self.prepare, tmp, self.timeout_s, self.env),
                             daemon=True)
        _spawn_without_main(p, (self.fn, self.prepare))
        child.close()
        self.procs[w] = (p, parent, tmp)
        self.state[w] = ("starting", time.monotonic() + self.startup_s)

    def _replace(self, w: int) -> None:
        p, conn, tmp = self.procs[w]
        p.kill()
        p.join()
        conn.close()
        shutil.rmtree(tmp, ignore_errors=True)
        self._start(w)

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
        if self.done.pop(ticket, None) is None and any(s[1] == ticket for s in self.state.values() if len(s) > 2):
            self.dropped.add(ticket)

    def _pump(self, timeout: float | None) -> None:
        """Give queued jobs to ready workers, then handle what the workers said or did, waiting up to `timeout`
        seconds (None: until something happens or a limit passes)."""
        for w in range(len(self.procs)):
            if w not in self.state and self.todo:
                ticket, job = self.todo.pop(0)
                self.procs[w][1].send(job)
                self.state[w] = ("preparing", ticket, job, time.monotonic() + self.startup_s)
        if not self.state:
            return
        conns = {self.procs[w][1]: w for w in self.state}
        sentinels = {self.procs[w][0].sentinel: w for w in self.state}
        wait_s = max(0.0, min(s[-1] for s in self.state.values()) - time.monotonic())
        heard = set()
        for r in wait(list(conns) + list(sentinels), timeout=wait_s if timeout is None else min(timeout, wait_s)):
            w = conns.get(r, sentinels.get(r))
            if w not in heard:  # once per worker: a death shows on both its pipe and its sentinel
                heard.add(w)
                self._heard(w, r in conns)
        for w, s in list(self.state.items()):
            if time.monotonic() >= s[-1]:
                if s[0] == "running":
                    self._finish(s[1], (0.0, {"reason": "timeout"}))
                else:
                    self._start_failed(w)
                self.state.pop(w, None)
                self._replace(w)
        if self.todo and len(self.state) < len(self.procs):
            self._pump(0.0)

    def _heard(self, w: int, readable: bool) -> None:
        """Worker w's pipe is readable or its process ended: advance its state."""
        s = self.state[w]
        try:
            msg = self.procs[w][1].recv() if readable else None
        except (EOFError, OSError):
            msg = None
        if msg is None:  # the process died
            if s[0] == "running":
                self._finish(s[1], (0.0, {"reason": "crash"}))
            else:
                self._start_failed(w)
            del self.state[w]
            self._replace(w)
        elif s[0] == "starting" and msg == "ready":
            del self.state[w]
        elif s[0] == "preparing" and msg == "started":
            self.state[w] = ("running", s[1], s[2], time.monotonic() + self.timeout_s)
            self.start_failures = 0
        elif s[0] in ("preparing", "running"):  # the result (or prepare raised: the worker's error verdict)
            del self.state[w]
            self._finish(s[1], msg)

    def _start_failed(self, w: int) -> None:
        """Worker w died or overran startup_s before it was ready or had prepared its job: the job (if any) goes back
        to the front of the queue for another worker; too many failures in a row is an error of its own."""
        s = self.state[w]
        if s[0] == "preparing":
            if s[1] in self.dropped:
                self.dropped.discard(s[1])
            else:
                self.todo.insert(0, (s[1], s[2]))
        self.start_failures += 1
        if self.start_failures >= MAX_START_FAILURES:
            self.close()
            raise WorkerStartError(f"{MAX_START_FAILURES} reward/tool workers in a row died or took over "
                                   f"{self.startup_s:g} s to start or to import what a job needs ({self.fn.__module__}."
                                   f"{getattr(self.fn, '__qualname__', type(self.fn).__qualname__)}): check that "
                                   f"module imports in a fresh process")

    def _finish(self, ticket: int, out) -> None:
        if ticket in self.dropped:
            self.dropped.discard(ticket)
        else:
            self.done[ticket] = out

    def close(self) -> None:
        for p, conn, _ in (x for x in self.procs if x is not None):
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
            conn.close()
        self.procs, self.state = [], {}
        shutil.rmtree(self.root, ignore_errors=True)
