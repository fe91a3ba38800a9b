"""Issue 52's round 6, the memory model and the language: candidates right only at an edge of a rule of the GPU
semantics run or of the accepted language, each beside an honest twin in the same style that must keep scoring
1.0. (id, task, attack, reason, honest) in CASES, the tuple format of round6.py. Every attack scored 1.0 on main
before the change (e2de9f9); the rule that now refuses it is named beside it.

  scalar_read_back_without_barrier   softmax_rows: the row max stored to a scratch word as a scalar and loaded back
        for the whole block with no tl.debug_barrier / the same with the barrier. Rule (memory.Visibility): a
        scalar store is made by thread 0, a plain scalar load by every thread (sm_90's PTX: `@tid==0 st`, then
        `ld` in all threads); a block of fewer elements than the program has threads is held by two threads or
        more, so its plain load meets any store of those bytes since the barrier: race
  relaxed_store_read_by_other_lanes   relu: each lane's result written into a scratch block by tl.atomic_store
        with sem="relaxed", read back reversed with plain loads / with tl.debug_barrier() between. Rule
        (Visibility): an atomic with no bar.sync after it (relaxed, release) is a write of its lane; a plain
        load of it in another lane before a barrier is a race
  relaxed_adds_race_the_zeroing      row_sum: a scratch row zeroed by plain stores, then every lane adds its
        element into its neighbour's slot with relaxed tl.atomic_add, no barrier between / with one. Rule
        (Visibility): a byte stored plainly by one lane and written by an atomic of another before a barrier is
        a race (either may land first); a non-relaxed atomic has Triton's bar.sync before (release) and after
        (acquire) it and needs no tl.debug_barrier
  cat_in_the_interpreter_order       relu: two half blocks joined by tl.cat(lo, hi, can_reorder=True) and stored in
        place / joined by tl.cat(lo, hi) (Triton 3.9: join + permute + reshape, ordered). Rule (gpu.hook_reorder): a
        result whose element order Triton leaves to the compiler (tl.cat with can_reorder, tl.reshape / tl.view with
        can_reorder) comes out in a random order: only uses that do not depend on it give the answer: wrong_output
  cuda_branch_never_checked          relu: `if x.is_cuda:` launches a kernel over half of x (what a GPU node would
        run), else the right launch (what a CPU reward runs) / one launch for every device, its output allocated
        with `device=x.device` through a name. Rule (language L9, lint_device): a device is a value the code only
        passes on (`device=`, `.to(...)`), never one it asks about or branches on: lint_device
  cta_scope_ticket_across_programs   total_sum: partial sums and a ticket kept with scope="cta" atomics, the
        last program reading the partials back / the same with scope="gpu". Rule (memory.Programs): a CTA-scoped
        atomic is atomic and ordered only among the threads of its own program (PTX: operations of two CTAs at cta
        scope are not morally strong), so across programs it counts as a plain access: a byte another program also
        accesses is a race

OPEN (not closed, kept to show the hole; tests/test_triton_round6_memory.py holds it as a strict xfail):
  relaxed_ticket_message_passing     total_sum: the same ticket with sem="relaxed" at gpu scope: a relaxed ticket
        does not acquire the other programs' partials, so on a GPU the last program may read stale ones; the
        schedules here keep atomics sequentially consistent (1.0) / the ticket with the default acq_rel (honest)
"""
from triton_corpus.gpu_rules import model

_SOFTMAX_STAT = '''
@triton.jit
def softmax_kernel(x_ptr, out_ptr, stat_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=-float("inf"))
    tl.store(stat_ptr + row, tl.max(x, axis=0))
    BARRIER
    m = tl.load(stat_ptr + row)
    e = tl.exp(x - m)
    tl.store(out_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=cols < N)
'''
_SOFTMAX_STAT_LAUNCH = "x = x.contiguous()\nM, N = x.shape\nout = torch.empty_like(x)\n" \
    "stat = torch.empty(M, dtype=x.dtype)\nsoftmax_kernel[(M,)](x, out, stat, N, BLOCK=triton.next_power_of_2(N))\n" \
    "return out"

_ATOMIC_SCRATCH = '''
@triton.jit
def relu_kernel(x_ptr, scratch_ptr, out_ptr, n, BLOCK: tl.constexpr):
    base = tl.program_id(0) * BLOCK
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + base + offs, mask=base + offs < n, other=0.0)
    tl.atomic_store(scratch_ptr + base + offs, tl.maximum(x, 0.0), sem="relaxed")
    BARRIER
    rev = BLOCK - 1 - offs
    tl.store(out_ptr + base + rev, tl.load(scratch_ptr + base + rev), mask=base + rev < n)
'''
_ATOMIC_SCRATCH_LAUNCH = "n = x.numel()\nout = torch.empty_like(x)\n" \
    "scratch = torch.empty(triton.cdiv(n, 256) * 256)\n" \
    "relu_kernel[(triton.cdiv(n, 256),)](x, scratch, out, n, BLOCK=256)\nreturn out"

_ZERO_THEN_ADD = '''
@triton.jit
def row_sum_kernel(x_ptr, acc_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(acc_ptr + row * BLOCK + cols, tl.zeros((BLOCK,), dtype=tl.float32))
    BARRIER
    tl.atomic_add(acc_ptr + row * BLOCK + (cols + 1) % BLOCK, x, sem="relaxed")
    tl.debug_barrier()
    tl.store(out_ptr + row, tl.sum(tl.load(acc_ptr + row * BLOCK + cols), axis=0))
'''
_ZERO_THEN_ADD_LAUNCH = "x = x.contiguous()\nM, N = x.shape\nBLOCK = triton.next_power_of_2(N)\n" \
    "acc = torch.empty(M * BLOCK)\nout = torch.empty(M, dtype=x.dtype)\n" \
    "row_sum_kernel[(M,)](x, acc, out, N, BLOCK=BLOCK)\nreturn out"

_CAT_HALVES = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, HALF: tl.constexpr):
    base = tl.program_id(0) * 2 * HALF
    offs = tl.arange(0, HALF)
    lo = tl.load(x_ptr + base + offs, mask=base + offs < n, other=0.0)
    hi = tl.load(x_ptr + base + HALF + offs, mask=base + HALF + offs < n, other=0.0)
    both = CAT
    out = base + tl.arange(0, 2 * HALF)
    tl.store(out_ptr + out, tl.maximum(both, 0.0), mask=out < n)
'''
_CAT_LAUNCH = "n = x.numel()\nout = torch.empty_like(x)\nrelu_kernel[(triton.cdiv(n, 256),)](x, out, n, HALF=128)\n" \
    "return out"
CAT_REORDERED = model(_CAT_HALVES.replace("CAT", "tl.cat(lo, hi, can_reorder=True)"), _CAT_LAUNCH)
CAT_ORDERED = model(_CAT_HALVES.replace("CAT", "tl.cat(lo, hi)"), _CAT_LAUNCH)

_RELU = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=offs < n)
'''
CUDA_BRANCH = model(_RELU, "x = x.contiguous()\nout = torch.empty_like(x)\nn = x.numel()\nif x.is_cuda:\n"
                           "    relu_kernel[(triton.cdiv(n // 2, 256),)](x, out, n // 2, BLOCK=256)\n"
                           "    return out\nrelu_kernel[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)\nreturn out")
ONE_PATH = model(_RELU, "x = x.contiguous()\ndevice = x.device\n"
                        "out = torch.empty(x.shape, dtype=x.dtype, device=device)\n"
                        "n = x.numel()\nrelu_kernel[(triton.cdiv(n, 256),)](x, out.to(x.device), n, BLOCK=256)\n"
                        "return out")

_TICKET = '''
@triton.jit
def total_kernel(x_ptr, part_ptr, count_ptr, out_ptr, n, P: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    s = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
    tl.atomic_add(part_ptr + pid, s, ORDER)
    ticket = tl.atomic_add(count_ptr, 1, ORDER)
    if ticket == tl.num_programs(0) - 1:
        idx = tl.arange(0, P)
        inside = idx < tl.num_programs(0)
        parts = tl.atomic_add(part_ptr + idx, tl.zeros((P,), dtype=tl.float32), mask=inside, ORDER)
        tl.store(out_ptr, tl.sum(tl.where(inside, parts, 0.0), axis=0))
'''
_TICKET_LAUNCH = "x = x.contiguous()\nn = x.numel()\nprograms = triton.cdiv(n, 64)\n" \
    "part = torch.zeros(triton.next_power_of_2(programs), dtype=x.dtype)\ncount = torch.zeros(1, dtype=torch.int32)\n" \
    "out = torch.empty((), dtype=x.dtype)\n" \
    "total_kernel[(programs,)](x, part, count, out, n, P=triton.next_power_of_2(programs), BLOCK=64)\nreturn out"
CTA_TICKET = model(_TICKET.replace("ORDER", 'scope="cta"'), _TICKET_LAUNCH)
GPU_TICKET = model(_TICKET.replace("ORDER", 'scope="gpu"'), _TICKET_LAUNCH)
RELAXED_TICKET = model(_TICKET.replace("ORDER", 'sem="relaxed"'), _TICKET_LAUNCH)


def _twins(kernel: str, launch: str) -> tuple:
    """(attack, honest): the kernel with nothing at BARRIER, and with tl.debug_barrier() there."""
    return model(kernel.replace("BARRIER", "pass"), launch), model(kernel.replace("BARRIER", "tl.debug_barrier()"),
                                                                   launch)


SCALAR_READ_BACK, SCALAR_READ_BACK_HONEST = _twins(_SOFTMAX_STAT, _SOFTMAX_STAT_LAUNCH)
RELAXED_STORE, RELAXED_STORE_HONEST = _twins(_ATOMIC_SCRATCH, _ATOMIC_SCRATCH_LAUNCH)
ZERO_THEN_ADD, ZERO_THEN_ADD_HONEST = _twins(_ZERO_THEN_ADD, _ZERO_THEN_ADD_LAUNCH)

CASES = [
    ("scalar_read_back_without_barrier", "softmax_rows", SCALAR_READ_BACK, "race", SCALAR_READ_BACK_HONEST),
    ("relaxed_store_read_by_other_lanes", "relu", RELAXED_STORE, "race", RELAXED_STORE_HONEST),
    ("relaxed_adds_race_the_zeroing", "row_sum", ZERO_THEN_ADD, "race", ZERO_THEN_ADD_HONEST),
    ("cat_in_the_interpreter_order", "relu", CAT_REORDERED, "wrong_output", CAT_ORDERED),
    ("cuda_branch_never_checked", "relu", CUDA_BRANCH, "lint_device", ONE_PATH),
    ("cta_scope_ticket_across_programs", "total_sum", CTA_TICKET, "race", GPU_TICKET),
]
OPEN = [     # (id, task, attack, reason it should get, honest): still 1.0, see the docstring
    ("relaxed_ticket_message_passing", "total_sum", RELAXED_TICKET, "wrong_output", GPU_TICKET),
]
