"""The memory side of the GPU semantics (checked runs, inside the sandbox, as the top-level module triton_memory):
every load, store and atomic of an interpreted launch recorded with its program and lane, so what a GPU would do
differently from the interpreter's one-program-after-another is a violation: an access outside every tensor argument
("out_of_bounds: ..."), a byte one program stores (or updates atomically) that another accesses without an atomic
("race: ...", Programs), a store another lane of its program reads before a barrier, and two lanes storing different
values to one byte (Visibility). rewards/triton/gpu.py routes the interpreter through it (hook_programs). Imports only
stdlib, numpy, torch, triton.
"""

import numpy as np
import torch

_GPU_GRID = (2**31 - 1, 65535, 65535)      # CUDA's grid limits (x, y, z)
# accesses the race check tells apart, and which pairs conflict when two programs make them on one byte: a plain
# store with any access, an atomic update with a plain load or store (loads with loads and atomics with atomics
# are fine in any order); an atomic at scope="cta" is atomic only among the threads of its own program (PTX: two
# programs' cta-scoped operations are not morally strong), so across programs it counts as a plain access
_ALL = ("load", "store", "atomic", "atomic_load", "cta_atomic", "cta_load")
_CONFLICTS = (("store", _ALL), ("cta_atomic", _ALL), ("atomic", ("load", "store", "cta_load")))
_ACCESS_WORDS = {"load": "loads", "store": "stores to", "atomic": "updates atomically",
                 "atomic_load": "loads atomically", "cta_atomic": "updates atomically at CTA scope",
                 "cta_load": "loads atomically at CTA scope"}


class Visibility:
    """What each running program wrote since its last barrier, and by which lane: on a GPU a plain store is
    visible to the other threads of its program only after a barrier (tl.debug_barrier, the bar.sync Triton puts
    around a non-relaxed atomic, or the program's end), so a load that reads such a byte in another lane (another
    position in its block, or a block of another shape) is a race inside one program; and two lanes whose last
    stores to one byte before a barrier differ leave either value (the interpreter keeps the later store's, or
    within one store the last element's), a race too; lanes that store the same value agree. Lanes are told apart
    by (block shape, flattened position): the same position of blocks of one shape is one thread.

    Threads that hold one element (sm_90, Triton 3.9's codegen, read in its PTX): a store, or an atomic, of an
    element is made by one thread (a scalar by thread 0), but a plain load by every thread that holds the element.
    Every thread of a program holds at least one element of every block, so a block of fewer elements than the
    program has threads (32 x num_warps; a scalar always) is held by two threads or more: its plain load reads in
    lanes other than the storing one, and meets any store of those bytes since the barrier (`broadcast`).

    Atomics (hook_programs passes their `sem`): a release (or acq_rel) atomic has a bar.sync before it, an
    acquire (or acq_rel) one a bar.sync after it; a relaxed one none. What an atomic writes without a barrier
    after it (relaxed, release) is recorded as a write of its lane (`updated`): a plain load of it in another lane
    is a race, and so is a plain store to it from another lane (either may come first); an atomic read of a byte
    another lane stored plainly is a race too. Atomics among themselves are coherent. State per program (a dict),
    so programs may interleave."""

    def __init__(self, threads: int = 128):
        self.threads = threads      # threads of a program of the launch: 32 x num_warps
        self.stored = {}            # program -> [(byte addresses, lane keys, values)] of its plain stores since its
        #                             barrier
        self.updated = {}           # program -> [(byte addresses, lane keys)] of its atomic writes since then
        self.merged = {}            # (program, with atomic writes) -> (sorted addresses, lowest key, highest key)
        self.shapes = {}            # block shape -> its number in the lane keys
        self.clash = None           # the launch's first: (program, byte address, "load" | "store")

    def lanes(self, ptrs, mask, value=None, broadcast=False) -> tuple:
        """(lane keys, values) of the bytes of the masked-in elements of `ptrs`, in the order of _bytes(ptrs, mask):
        the lane that accesses each byte and, with a stored `value`, the element written there (its bits as an
        unsigned integer; else None). A plain load (`broadcast`) of fewer elements than the program has threads
        is made by several threads of each element: keys None."""
        if broadcast and ptrs.data.size < self.threads:
            return None, None
        size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        shape = self.shapes.setdefault(ptrs.data.shape if ptrs.data.size > 1 else (), len(self.shapes))
        lanes = np.arange(ptrs.data.size, dtype=np.uint64) if mask is None else \
            np.flatnonzero(np.broadcast_to(mask.data, ptrs.data.shape)).astype(np.uint64)
        keys = np.repeat(lanes | np.uint64(shape << 40), size)
        if value is None:
            return keys, None
        written = np.ascontiguousarray(np.broadcast_to(value.data, ptrs.data.shape).ravel()[lanes])
        return keys, np.repeat(written.view(f"u{written.itemsize}").astype(np.uint64), size)

    def pending(self, program: int) -> bool:
        return program in self.stored or program in self.updated

    def store(self, program: int, addresses, keys, written) -> None:
        self.stored.setdefault(program, []).append((addresses, keys, written))
        self.merged.pop((program, True), None)
        self.merged.pop((program, False), None)

    def update(self, program: int, addresses, keys) -> None:
        """An atomic write with no barrier after it (relaxed, release)."""
        self.updated.setdefault(program, []).append((addresses, keys))
        self.merged.pop((program, True), None)

    def load(self, program: int, addresses, keys, atomic: bool = False) -> None:
        """A load by `program` (keys None: by every thread; `atomic`: an atomic read, which meets only plain
        stores): the first byte it reads that another lane of it wrote since its barrier."""
        if self.clash is not None or not len(addresses):
            return
        parts = [(a, k) for a, k, _ in self.stored.get(program, ())] + \
            ([] if atomic else self.updated.get(program, []))
        if not parts:
            return
        if (program, not atomic) not in self.merged:
            a = np.concatenate([a for a, _ in parts])
            k = np.concatenate([k for _, k in parts])
            order = np.lexsort((k, a))
            a, k = a[order], k[order]
            first = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
            self.merged[program, not atomic] = a[first], k[first], k[np.r_[first[1:], len(a)] - 1]
        stored, low, high = self.merged[program, not atomic]
        at = np.minimum(np.searchsorted(stored, addresses), len(stored) - 1)
        clash = stored[at] == addresses
        if keys is not None:
            clash &= (low[at] != keys) | (high[at] != keys)
        if clash.any():
            self.clash = program, int(addresses[np.argmax(clash)]), "load"

    def barrier(self, program: int) -> None:
        """A barrier in `program`, or its end: what it wrote is visible to all its lanes, once the last store of
        each lane to each byte agrees with the other lanes', and no byte was both stored plainly and written by an
        atomic from two lanes."""
        parts, updates = self.stored.pop(program, None), self.updated.pop(program, None)
        self.merged.pop((program, True), None)
        self.merged.pop((program, False), None)
        if self.clash is not None or not parts:
            return
        if updates:
            a = np.concatenate([p[0] for p in parts + updates])
            k = np.concatenate([p[1] for p in parts + updates])
            plain = np.repeat([True, False], [sum(len(p[0]) for p in parts), len(a) - sum(len(p[0]) for p in parts)])
            order = np.lexsort((k, a))
            a, k, plain = a[order], k[order], plain[order]
            first = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
            plain = plain.astype(np.uint8)
            both = (np.minimum.reduceat(plain, first) != np.maximum.reduceat(plain, first)) & \
                (np.minimum.reduceat(k, first) != np.maximum.reduceat(k, first))
            if both.any():
                self.clash = program, int(a[first[np.argmax(both)]]), "update"
                return
        if len(parts) == 1 and len(np.unique(parts[0][0])) == len(parts[0][0]):
            return
        a, k, b = (np.concatenate([part[i] for part in parts]) for i in range(3))
        order = np.lexsort((np.arange(len(a)), k, a))          # by byte, lane, then store order
        a, k, b = a[order], k[order], b[order]
        last = np.r_[(a[1:] != a[:-1]) | (k[1:] != k[:-1]), True]     # each lane's last store to each byte
        a, b = a[last], b[last]
        first = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
        differ = np.minimum.reduceat(b, first) != np.maximum.reduceat(b, first)
        if differ.any():
            self.clash = program, int(a[first[np.argmax(differ)]]), "store"


class Programs:
    """The race recorder of each interpreted launch: the bytes each program loads, stores and updates atomically
    (Schedule runs the programs and says which one runs). A launch in which one program stores (or updates
    atomically) what another accesses without an atomic is a race: its result on a GPU depends on timing. Atomics
    among themselves are exempt."""

    def __init__(self):
        self.dims = self.program = None                # the running launch's grid, and the program that runs
        self.atomic = None                             # inside an atomic load / store: its (sem, scope)
        self.threads = 128                             # threads of a program of the launch (bind)
        self.pending, self.touched = {}, {kind: [] for kind in _ACCESS_WORDS}      # start: per launch
        self.storages = (np.zeros(0, np.uint64), np.zeros(0, np.uint64), [])     # bind: (starts, ends, names)
        self.outside = None
        self.visibility = Visibility()

    def bind(self, arguments: dict) -> None:
        """The launch's arguments, before it runs: every access must stay inside the storage of a tensor among
        them (memcheck's rule: a view's whole storage counts)."""
        self.threads = 32 * (arguments.get("num_warps") or 4)     # sm_90's default: 4 warps
        spans = {}
        for name, value in arguments.items():
            for t in value if type(value) is tuple else (value,):
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    spans.setdefault(storage.data_ptr(), (storage.data_ptr() + storage.nbytes(), name))
        starts = sorted(spans)
        self.storages = (np.array(starts, np.uint64), np.array([spans[a][0] for a in starts], np.uint64),
                         [spans[a][1] for a in starts])

    def start(self, dims: tuple) -> None:
        self.outside = None                            # the launch's first access outside every storage
        self.visibility = Visibility(self.threads)
        self.dims, self.program = dims, None
        self.pending = {}                              # program -> {kind: [byte addresses]} of unfinished programs
        self.touched = {kind: [] for kind in _ACCESS_WORDS}     # (addresses, program) of the finished ones

    def index(self, program: int) -> tuple:
        return _grid_index(program, self.dims)

    def record(self, kind: str, ptrs, mask, value=None, order=None) -> None:
        """The bytes a program accesses through `ptrs` (a TensorHandle of addresses) where `mask` is set (a plain
        store: writing `value`; an atomic: with its `order`, (ir.MEM_SEMANTIC, ir.MEM_SYNC_SCOPE))."""
        if self.program is None:
            return
        role = None                        # an atomic's part in Visibility: (reads, writes)
        if kind == "atomic":
            role = True, True
        elif self.atomic is not None:      # atomic_load, atomic_store (through the masked load / store)
            kind, role, order = {"load": "atomic_load", "store": "atomic"}[kind], (kind == "load", kind == "store"), \
                self.atomic
        if role:
            from triton._C.libtriton import ir
            if order[1] == ir.MEM_SYNC_SCOPE.CTA:
                kind = "cta_load" if kind == "atomic_load" else "cta_atomic"
        touched = _bytes(ptrs, mask)
        self.pending.setdefault(self.program, {k: [] for k in _ACCESS_WORDS})[kind].append(touched)
        visibility = self.visibility
        if kind == "store":
            visibility.store(self.program, touched, *visibility.lanes(ptrs, mask, value))
        elif kind == "load" and visibility.pending(self.program):
            visibility.load(self.program, touched, visibility.lanes(ptrs, mask, broadcast=True)[0])
        elif role:
            self._atomic(touched, visibility.lanes(ptrs, mask)[0], order[0], *role)
        starts, ends, _ = self.storages
        at = np.searchsorted(starts, touched, "right") - 1
        outside = (at < 0) | (touched >= ends[np.maximum(at, 0)])
        if self.outside is None and outside.any():
            self.outside = (kind, self.program, int(touched[np.argmax(outside)]), int(outside.sum()))

    def _atomic(self, touched, keys, sem, reads: bool, writes: bool) -> None:
        """An atomic of the running program in Visibility: a bar.sync before a release one, after an acquire one
        (acq_rel: both), none around a relaxed one."""
        from triton._C.libtriton import ir
        visibility, program = self.visibility, self.program
        if sem in (ir.MEM_SEMANTIC.RELEASE, ir.MEM_SEMANTIC.ACQUIRE_RELEASE):
            visibility.barrier(program)
        if reads and visibility.pending(program):
            visibility.load(program, touched, keys, atomic=True)
        if writes:
            visibility.update(program, touched, keys)
        if sem in (ir.MEM_SEMANTIC.ACQUIRE, ir.MEM_SEMANTIC.ACQUIRE_RELEASE):
            visibility.barrier(program)

    def done(self, program: int) -> None:
        """`program` has ended: its bytes join the launch's, its stores are visible to all its lanes."""
        self.visibility.barrier(program)
        for kind, parts in self.pending.pop(program, {}).items():
            if parts:
                self.touched[kind].append((np.unique(np.concatenate(parts)), program))

    def _flush(self) -> None:
        for program in list(self.pending):
            self.done(program)

    def abandon(self) -> None:
        self.dims = self.program = None

    def finish(self, kernel: str, arguments: dict) -> list:
        """Violations of the launch that just ran: its grid over CUDA's limits, or a race (programs, the access
        each makes, which argument and element)."""
        if self.dims is None:
            return []
        self._flush()
        found = [f"gpu_compile: {kernel}: grid {self.dims} over CUDA's limits {_GPU_GRID}"] \
            if any(d > top for d, top in zip(self.dims, _GPU_GRID)) else []
        if self.outside:
            kind, program, address, count = self.outside
            starts, ends, names = self.storages
            near = int(np.argmin([min(abs(int(a) - address), abs(int(e) - 1 - address)) for a, e in
                                  zip(starts, ends)])) if names else None
            found.append(f"out_of_bounds: {kernel}: {names[near] if names else '-'}: program "
                         f"{self.index(program)} {_ACCESS_WORDS[kind]} {count} bytes outside every tensor "
                         f"argument's storage (first at {address - int(starts[near]) if names else address:+d})")
        if self.visibility.clash:
            program, address, kind = self.visibility.clash
            starts, _, names = self.storages
            at = int(np.searchsorted(starts, address, "right")) - 1
            what = {"load": "loads in one lane what another lane of it wrote",
                    "store": "stores different values to one byte from two lanes",
                    "update": "stores to a byte that another lane of it updates atomically"}[kind]
            found.append(f"race: {kernel}: {names[at] if at >= 0 else '-'}: program {self.index(program)} {what}, "
                         f"with no tl.debug_barrier between (byte {address - int(starts[at]) if at >= 0 else address} "
                         "of the argument)")
        for kind, others in _CONFLICTS:
            clash = _first_clash(self._spans((kind,)), self._spans(others))
            if clash is not None:
                found.append(f"race: {kernel}: {self._describe(clash, kind, others, arguments)}")
                break
        return found

    def _spans(self, kinds: tuple) -> tuple:
        """(addresses, lowest program, highest program) per distinct byte the programs accessed as `kinds`."""
        parts = [(a, p) for kind in kinds for a, p in self.touched[kind] if len(a)]
        if not parts:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        addresses = np.concatenate([a for a, _ in parts])
        programs = np.concatenate([np.full(len(a), p) for a, p in parts])
        order = np.lexsort((programs, addresses))
        addresses, programs = addresses[order], programs[order]
        first = np.flatnonzero(np.r_[True, addresses[1:] != addresses[:-1]])
        return addresses[first], programs[first], programs[np.r_[first[1:], len(addresses)] - 1]

    def _describe(self, address: int, kind: str, others: tuple, arguments: dict) -> str:
        def who(kinds):
            return [(p, k) for k in kinds for a, p in self.touched[k] if address in a]
        (p, k), (q, j) = next((a, b) for a in who((kind,)) for b in who(others) if a[0] != b[0])
        name, where = next(((name, f"element {(address - t.data_ptr()) // t.element_size()} of {name}")
                            for name, t in arguments.items() if isinstance(t, torch.Tensor) and
                            0 <= address - t.data_ptr() < t.element_size() * (1 + sum((s - 1) * d for s, d in
                                                                                      zip(t.shape, t.stride())))),
                           ("-", "memory outside the tensor arguments"))
        return f"{name}: program {self.index(p)} {_ACCESS_WORDS[k]} {where}, which program {self.index(q)} " \
               f"{_ACCESS_WORDS[j]}"


def _grid_index(program: int, dims: tuple) -> tuple:
    """The grid position (x, y, z) of the program numbered `program` in the grid's own order."""
    _, ny, nz = dims
    return program // (ny * nz), program // nz % ny, program % nz


def _bytes(ptrs, mask) -> np.ndarray:
    """The byte addresses (uint64) that the element addresses in `ptrs` (a TensorHandle) cover where `mask` is set."""
    addresses = ptrs.data if mask is None else ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)]
    size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    return (addresses.astype(np.uint64).reshape(-1, 1) + np.arange(size, dtype=np.uint64)).ravel()


def _first_clash(mine: tuple, theirs: tuple) -> int | None:
    """A byte address that some program accesses in `mine` and another program in `theirs` (both _spans), else
    None: at a common address the two sides are one and the same program only if all four bounds agree."""
    common, i, j = np.intersect1d(mine[0], theirs[0], assume_unique=True, return_indices=True)
    clash = (mine[1][i] != mine[2][i]) | (theirs[1][j] != theirs[2][j]) | (mine[1][i] != theirs[1][j])
    return int(common[np.argmax(clash)]) if clash.any() else None


def hook_programs(programs: Programs) -> None:
    """Route the interpreter's grid and memory operations through `programs`: set_grid_dim starts a launch, every
    load, store and atomic records its bytes (which program runs: hook_schedule), tl.debug_barrier makes the running
    program's stores visible to all its lanes (Visibility)."""
    from triton.runtime.interpreter import InterpreterBuilder as B
    set_dim = B.set_grid_dim
    load, store, rmw, cas = B.create_masked_load, B.create_masked_store, B.create_atomic_rmw, B.create_atomic_cas

    def set_grid_dim(self, nx, ny, nz):
        programs.start((nx, ny, nz))
        return set_dim(self, nx, ny, nz)

    def masked_load(self, ptrs, mask, *rest, **options):    # tensor descriptors pass options by keyword
        programs.record("load", ptrs, mask)
        return load(self, ptrs, mask, *rest, **options)

    def masked_store(self, ptrs, value, mask, *rest, **options):
        programs.record("store", ptrs, mask, None if programs.atomic is not None else value)
        return store(self, ptrs, value, mask, *rest, **options)

    def atomic_rmw(self, op, ptr, value, mask, sem, scope):
        programs.record("atomic", ptr, mask, None, (sem, scope))
        return rmw(self, op, ptr, value, mask, sem, scope)

    def atomic_cas(self, ptr, cmp, value, sem, scope):
        programs.record("atomic", ptr, None, None, (sem, scope))
        return cas(self, ptr, cmp, value, sem, scope)

    def atomically(method, at):      # atomic loads and stores go through the masked load / store above
        def run(self, *args):
            programs.atomic = args[at:at + 2]            # their sem and scope
            try:
                return method(self, *args)
            finally:
                programs.atomic = None
        return run

    B.set_grid_dim, B.create_masked_load, B.create_masked_store = set_grid_dim, masked_load, masked_store
    B.create_atomic_rmw, B.create_atomic_cas = atomic_rmw, atomic_cas
    B.create_barrier = lambda self: programs.visibility.barrier(programs.program)     # tl.debug_barrier
    for name, at in (("create_atomic_load", 2), ("create_atomic_store", 3)):     # create_atomic_poll: atomic loads
        setattr(B, name, atomically(getattr(B, name), at))                         # (triton_gpu.hook_schedule)
