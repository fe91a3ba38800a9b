"""Programs of one interpreted launch that overlap as on a GPU (CPU, inside the sandbox): Schedule runs them as
coroutines switched at atomics; rewards/triton/gpu.py routes the interpreter through it and ships beside it
(rewards/triton/kernel.py ships both). Imports only stdlib, numpy, greenlet.
"""

import os
import random

import greenlet
import numpy as np

_STREAK = 256          # atomics a program makes in a row before runs 0 and 1 let another run (no program starves)
_RESIDENT = 132        # programs resident at once in run 2: one per SM of an H100 (sm_90), which any kernel that
#                        compiles for it fits (a GPU may hold more)


class Deadlock(BaseException):
    """Every program of a launch still running waits in an atomic that no program will change (a BaseException:
    the interpreter turns an Exception from a kernel body into an InterpreterError, a compile_error)."""


class Schedule:
    """The programs of one interpreted launch run as a GPU may run them: overlapping. Each program is a coroutine
    (a greenlet: the harness allows no thread) that may be suspended at every atomic operation (atomic_rmw,
    atomic_cas, atomic_load, atomic_store, atomic_poll), each of which stays indivisible. Run 0 of a case admits
    the programs in the grid's own order, run 1 in its reverse, and each runs until it ends or waits. Run 2 has
    them all resident at once, as a GPU's SMs hold them from the start: it admits every program (in the grid's
    order, up to _RESIDENT live at once, the next as one ends), each running up to its first atomic, before any
    atomic runs, then takes them round-robin, switching before every atomic. Later runs admit them in a random
    order and switch to a random live program (or admit the next) before every atomic, seeded from os.urandom. A
    launch whose atomics came from 2 or more programs asks for triton_gpu.SCHEDULES runs.

    Switching at atomics only is as strong as switching at every load and store for any launch the race check
    passes: a plain access to a byte that another program stores or updates atomically is a race (Programs), so
    the programs of a race-free launch share only what they reach through atomics, and what a program does
    between two atomics reads and writes memory no other program touches in that launch; moving a switch into
    that stretch changes nothing any program can observe. Atomics are sequentially consistent here (relaxed
    ordering is not emulated).

    A spin-wait ends: a program whose atomic changes nothing in memory (atomic_load, a failed atomic_cas, an
    atomic_poll not yet matched, atomic_add 0 ...) and repeats such an access (same addresses, same values) with no
    atomic having changed memory since is blocked until an atomic changes one of the bytes it read; no schedule
    runs a blocked program. When every live program is blocked and none is left to admit, each is let go once (a
    repeated read need not be a wait); when they all block again with no atomic having changed memory, no program
    having ended and none having read anything new, the launch is a deadlock (a GPU hangs)."""

    def __init__(self):
        self.rng = random.Random(os.urandom(16))       # never the candidate's RNG, never a seed it could know
        self.run_index = 0
        self.executor = self.launch = None             # GridExecutor running; its programs (start)

    def start(self, n: int, place, ended) -> None:
        """A launch of n programs begins: place(p) makes p the running program (grid index, race recorder),
        ended(p) says it has ended."""
        self.launch, self.place, self.ended, self.atomics = n, place, ended, set()
        self.executor.fn = self._defer(self.executor.fn)

    def _defer(self, body):
        """The interpreter's loop calls the kernel body once per program: the first call runs them all here."""
        def programs(**args):
            n, self.launch = self.launch, None
            if n is not None:
                self._run(n, lambda: body(**args))
        return programs

    def _run(self, n: int, body) -> None:
        order = list(range(n))
        if self.run_index == 1:
            order.reverse()
        elif self.run_index > 1:
            self.rng.shuffle(order)
        self.random, self.wide = self.run_index > 2, self.run_index == 2
        self.waiting, self.live = order[::-1], {}       # live: program -> greenlet
        self.blocked, self.seen, self.version = {}, {}, 0      # program -> bytes it waits on; its unchanged reads
        self.progress = True
        self.current, self.streak = None, 0
        main = greenlet.getcurrent()
        try:
            while self.live or self.waiting:
                program = self._next()
                if program is None:
                    raise Deadlock(f"{len(self.live)} programs wait in atomics that no program will change")
                if program not in self.live:
                    self.live[program] = greenlet.greenlet(body, parent=main)
                self.current, self.streak = program, 0
                self.place(program)
                self.live[program].switch()
                if self.wide and not self.live[program].dead:
                    self.live[program] = self.live.pop(program)      # round-robin: to the back
                if self.live[program].dead:
                    self.progress = True
                    del self.live[program]
                    self.seen.pop(program, None)
                    self.ended(program)
        finally:
            for g in self.live.values():       # a kernel that raised or deadlocked: unwind the others
                if not g.dead:
                    g.throw()
            self.live = {}

    def _next(self):
        """The program to run next (a new one: popped from waiting), or None when all live ones are blocked, none
        is left to admit and none made progress (a write, a new read, an end) since they were last all blocked:
        then each is let go once, as its repeated read may not have been a wait."""
        admit = bool(self.waiting) and (not self.wide or len(self.live) < _RESIDENT)
        if self.live and not admit and len(self.blocked) == len(self.live):
            if not self.progress:
                return None
            self.progress = False
            self.blocked.clear()
        runnable = [p for p in self.live if p not in self.blocked]
        if self.wide:        # every program that may be resident first, then the live ones in turn
            return self.waiting.pop() if admit else runnable[0] if runnable else None
        if self.random:
            choice = self.rng.randrange(len(runnable) + bool(self.waiting)) if runnable or self.waiting else None
            return None if choice is None else runnable[choice] if choice < len(runnable) else self.waiting.pop()
        if self.current in runnable and self.streak < _STREAK:
            return self.current
        others = [p for p in runnable if p != self.current]
        return others[0] if others else self.waiting.pop() if self.waiting else runnable[0] if runnable else None

    def atomic(self, op, read, addresses: np.ndarray):
        """op() (an atomic operation of the running program on the bytes `addresses`) at a point where another
        program may run first; read() is the bytes there. Blocks the program when op changed nothing and repeats an
        access since which nothing changed."""
        program = self.current
        self.atomics.add(program)
        self.streak += 1
        if self.random or self.wide or self.streak >= _STREAK:
            self._pause()
        before = read()
        out = op()
        after = read()
        if before != after:
            self.version, self.progress = self.version + 1, True
            for other, waits in list(self.blocked.items()):
                if np.intersect1d(waits, addresses, assume_unique=False).size:
                    del self.blocked[other]
            return out
        version, reads = self.seen.get(program, (None, None))
        if version != self.version:
            reads = {}
            self.seen[program] = self.version, reads
        key = addresses.tobytes(), after
        if key in reads:
            self.blocked[program] = np.concatenate(list(reads.values()))
            self._pause()
        else:
            self.progress = True
        reads[key] = addresses
        return out

    def _pause(self) -> None:
        self.live[self.current].parent.switch()
