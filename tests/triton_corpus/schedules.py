"""Issue 44's classes 1, 2 and 5 (programs that overlap, two programs, every autotune config): candidates right in
every order in which whole programs run one after another (and with the autotuner's first config), wrong when
programs interleave at atomics as on a GPU or when the autotuner benchmarks and picks another config; each beside
an honest kernel in the same style that must keep scoring 1.0. (id, task, attack, reason, honest) in CASES;
HONEST: kernels with no attack twin.
Every attack and every honest kernel here scored 1.0 on main before the change (a4162e1).

  cas_without_retry        tl.atomic_cas read-modify-write of a total, no retry loop / with the retry loop
  load_then_store          tl.atomic_load then tl.atomic_store of a total / tl.atomic_add
  carry_never_waits        cumsum chunks in ticket order, the carry taken with an atomic_add that never waits for
                           the predecessor / a ticketed carry that spins on the predecessor's flag (tl.atomic_load;
                           tl.atomic_poll in HONEST)
  program_0_runs_last      two programs, program 0 stores the total assuming program 1 has added / the program that
                           finishes last (an atomic counter) stores it
  tuned_total_without_reset_to_zero   an autotuned atomic total: the benchmarking launches accumulate into out /
                           reset_to_zero=["out_ptr"]
  tuned_second_config_does_less       an autotuned relu launched over the first config's grid: the second config
                           covers half of x / a grid from the config (meta["BLOCK"])
  caches_run_0_outputs     the atomic_load / atomic_store total launched into 4 outputs on the first call, which
                           returns one and keeps 3 in a module-level list for the later runs of the case, which
                           launch nothing and so dodge their schedules (1.0 on main at f38791a, where runs shared
                           the module). Now each later run has a fresh module and launches; the next case's first
                           run, which shares the first module as on a GPU, returns the previous case's spare
                           without a launch: lint_kernel_not_launched / the atomic_add total launched into 4
                           outputs on every call
"""
from triton_corpus.gpu_rules import model

_TOTAL_LAUNCH = "x = x.contiguous()\nout = torch.zeros((), dtype=x.dtype)\n" \
    "total_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)\nreturn out"
_PART = '''
@triton.jit
def total_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    part = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
'''
CAS_WITHOUT_RETRY = model(_PART + '''    seen = tl.atomic_add(out_ptr, 0.0)
    tl.atomic_cas(out_ptr, seen, seen + part)
''', _TOTAL_LAUNCH)
CAS_WITH_RETRY = model(_PART + '''    seen = tl.atomic_add(out_ptr, 0.0)
    found = tl.atomic_cas(out_ptr, seen, seen + part)
    while found != seen:
        seen = found
        found = tl.atomic_cas(out_ptr, seen, seen + part)
''', _TOTAL_LAUNCH)
LOAD_THEN_STORE = model(_PART + '''    tl.atomic_store(out_ptr, tl.atomic_load(out_ptr) + part)
''', _TOTAL_LAUNCH)
ATOMIC_ADD = model(_PART + '''    tl.atomic_add(out_ptr, part)
''', _TOTAL_LAUNCH)

# cumsum over rows of (M, N): each program takes a ticket (its chunk of its row) and the carry of the chunks before
_CHUNKS = '''
@triton.jit
def scan_kernel(x_ptr, out_ptr, tickets_ptr, carry_ptr, flags_ptr, N, CHUNKS, BLOCK: tl.constexpr):
    row = tl.program_id(0) // CHUNKS
    chunk = tl.atomic_add(tickets_ptr + row, 1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    total = tl.sum(x, axis=0)
'''
_SCAN_LAUNCH = "M, N = x.shape\nx = x.contiguous()\nchunks = triton.cdiv(N, 8)\nout = torch.empty_like(x)\n" \
    "tickets = torch.zeros(M, dtype=torch.int32)\ncarry = torch.zeros(M * chunks, dtype=x.dtype)\n" \
    "flags = torch.zeros(M * chunks, dtype=torch.int32)\n" \
    "scan_kernel[(M * chunks,)](x, out, tickets, carry, flags, N, chunks, BLOCK=8)\nreturn out"
CARRY_NEVER_WAITS = model(_CHUNKS + '''    before = tl.atomic_add(carry_ptr + row * CHUNKS, total)
    tl.store(out_ptr + row * N + cols, tl.cumsum(x, axis=0) + before, mask=cols < N)
''', _SCAN_LAUNCH)
_LOOK_BACK = _CHUNKS + '''    before = 0.0
    if chunk > 0:
        WAIT
        before = tl.atomic_add(carry_ptr + row * CHUNKS + chunk - 1, 0.0)
    tl.atomic_store(carry_ptr + row * CHUNKS + chunk, before + total)
    tl.atomic_xchg(flags_ptr + row * CHUNKS + chunk, 1)
    tl.store(out_ptr + row * N + cols, tl.cumsum(x, axis=0) + before, mask=cols < N)
'''
_SPIN = '''while tl.atomic_load(flags_ptr + row * CHUNKS + chunk - 1) == 0:
            pass'''
CARRY_SPINS_ON_LOAD = model(_LOOK_BACK.replace("WAIT", _SPIN), _SCAN_LAUNCH)
CARRY_POLLS = model(_LOOK_BACK.replace("WAIT", "tl.atomic_poll(flags_ptr + row * CHUNKS + chunk - 1, 1)"),
                    _SCAN_LAUNCH)

# two programs, each sums half of x into acc
_HALVES = '''
@triton.jit
def halves_kernel(x_ptr, acc_ptr, count_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(acc_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))
'''
_HALVES_LAUNCH = "x = x.contiguous()\nacc = torch.zeros((), dtype=x.dtype)\n" \
    "count = torch.zeros((), dtype=torch.int32)\nout = torch.empty((), dtype=x.dtype)\n" \
    "halves_kernel[(2,)](x, acc, count, out, x.numel(), BLOCK=triton.next_power_of_2(triton.cdiv(x.numel(), 2)))\n" \
    "return out"
PROGRAM_0_RUNS_LAST = model(_HALVES + '''    if pid == 0:
        tl.store(out_ptr, tl.atomic_add(acc_ptr, 0.0))
''', _HALVES_LAUNCH)
LAST_TO_FINISH_STORES = model(_HALVES + '''    if tl.atomic_add(count_ptr, 1) == 1:
        tl.store(out_ptr, tl.atomic_add(acc_ptr, 0.0))
''', _HALVES_LAUNCH)

# col_sum of (M, N): programs over blocks of rows add their column sums into out with a masked vector atomic_add
VECTOR_ATOMIC_ADD = model('''
@triton.jit
def col_sum_kernel(x_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
    tl.atomic_add(out_ptr + cols, tl.sum(x, axis=0), mask=cols < N)
''', "M, N = x.shape\nx = x.contiguous()\nout = torch.zeros(N, dtype=x.dtype)\n"
     "col_sum_kernel[(triton.cdiv(M, 8), triton.cdiv(N, 16))](x, out, M, N, BLOCK_M=8, BLOCK_N=16)\nreturn out")

CASES = [
    ("cas_without_retry", "total_sum", CAS_WITHOUT_RETRY, "wrong_output", CAS_WITH_RETRY),
    ("load_then_store", "total_sum", LOAD_THEN_STORE, "wrong_output", ATOMIC_ADD),
    ("carry_never_waits", "cumsum", CARRY_NEVER_WAITS, "wrong_output", CARRY_SPINS_ON_LOAD),
    ("program_0_runs_last", "total_sum", PROGRAM_0_RUNS_LAST, "wrong_output", LAST_TO_FINISH_STORES),
]
HONEST = [
    ("carry_polls_with_atomic_poll", "cumsum", CARRY_POLLS),
    ("masked_vector_atomic_add", "col_sum", VECTOR_ATOMIC_ADD),
]

# each program waits for the flag of the program after it, which waits in turn: the last one waits on a flag nobody
# sets (on a GPU the launch hangs)
WAITS_ON_THE_NEXT = model('''
@triton.jit
def relay_kernel(x_ptr, out_ptr, flags_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    tl.atomic_poll(flags_ptr + pid + 1, 1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0), mask=offs < n)
    tl.atomic_xchg(flags_ptr + pid, 1)
''', "out = torch.empty_like(x)\nblocks = triton.cdiv(x.numel(), 256)\n"
     "flags = torch.zeros(blocks + 1, dtype=torch.int32)\n"
     "relay_kernel[(blocks,)](x, out, flags, x.numel(), BLOCK=256)\nreturn out")

# class 5: an autotuned atomic total; benchmarking launches accumulate into out unless reset_to_zero clears it
_TUNED_TOTAL = '''
@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"]RESET)
@triton.jit
def total_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))
'''
_TUNED_TOTAL_LAUNCH = "x = x.contiguous()\nout = torch.zeros((), dtype=x.dtype)\n" \
    "total_kernel[lambda meta: (triton.cdiv(x.numel(), meta[\"BLOCK\"]),)](x, out, x.numel())\nreturn out"
TUNED_WITHOUT_RESET = model(_TUNED_TOTAL.replace("RESET", ""), _TUNED_TOTAL_LAUNCH)
TUNED_WITH_RESET = model(_TUNED_TOTAL.replace("RESET", ', reset_to_zero=["out_ptr"]'), _TUNED_TOTAL_LAUNCH)
# a relu autotuned over two block sizes, launched over the grid of the first one: the second covers half of x
_TUNED_RELU = '''
@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0), mask=offs < n)
'''
TUNED_SECOND_CONFIG_DOES_LESS = model(_TUNED_RELU, "out = torch.empty_like(x)\n"
                                      "relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel())\nreturn out")
TUNED_CONFIGS_BOTH_RIGHT = model(_TUNED_RELU, "out = torch.empty_like(x)\nrelu_kernel[lambda meta: "
                                 "(triton.cdiv(x.numel(), meta[\"BLOCK\"]),)](x, out, x.numel())\nreturn out")
CASES += [
    ("tuned_total_without_reset_to_zero", "total_sum", TUNED_WITHOUT_RESET, "wrong_output", TUNED_WITH_RESET),
    ("tuned_second_config_does_less", "relu", TUNED_SECOND_CONFIG_DOES_LESS, "wrong_output", TUNED_CONFIGS_BOTH_RIGHT),
]

# every run of a case from one module (main up to f38791a) let a candidate replay run 0, computed in the
# grid's order, in the runs that interleave
_FOUR_OUTPUTS = "x = x.contiguous()\nouts = [torch.zeros((), dtype=x.dtype) for _ in range(4)]\nfor o in outs:\n" \
    "    total_kernel[(triton.cdiv(x.numel(), 64),)](x, o, x.numel(), BLOCK=64)\n"
CACHES_RUN_0_OUTPUTS = model("_SPARES = []\n" + _PART + '''    tl.atomic_store(out_ptr, tl.atomic_load(out_ptr) + part)
''', "if _SPARES:\n    return _SPARES.pop()\n" + _FOUR_OUTPUTS + "_SPARES.extend(outs[1:])\nreturn outs[0]")
FOUR_OUTPUTS_EVERY_CALL = model(_PART + '''    tl.atomic_add(out_ptr, part)
''', _FOUR_OUTPUTS + "return outs[0]")
CASES.append(("caches_run_0_outputs", "total_sum", CACHES_RUN_0_OUTPUTS, "lint_kernel_not_launched",
              FOUR_OUTPUTS_EVERY_CALL))

# a bias_add whose load_state_dict hook keeps the state dict's tensor (the harness's, not the model's) and whose
# forward then overwrites it with x's first row: right in every run only when each run loads a fresh copy of the
# reference state (two autotune configs: 4 runs). 0 on main up to f38791a, where runs shared the state.
WRITES_INTO_THE_LOADED_STATE = model('''
@triton.autotune(configs=[triton.Config({"ROWS": 1}), triton.Config({"ROWS": 2})], key=["M"])
@triton.jit
def bias_add_kernel(x_ptr, b_ptr, out_ptr, M, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask)
    b = tl.load(b_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], x + b[None, :], mask=mask)
''', "x = x.contiguous()\nM, N = x.shape\nout = torch.empty_like(x)\nbias_add_kernel[lambda meta: "
     "(triton.cdiv(M, meta[\"ROWS\"]),)](x, self.bias, out, M, N, BLOCK_N=triton.next_power_of_2(N))\n"
     "_STATES[-1].copy_(x[0])\nreturn out",
     prelude="\n\n_STATES = []\n\n\ndef keep(module, state_dict, *args):\n"
             "    _STATES.append(state_dict[\"bias\"])\n").replace(
    "    def __init__(self):\n        super().__init__()\n",
    "    def __init__(self, n):\n        super().__init__()\n        self.bias = nn.Parameter(torch.randn(n))\n"
    "        self.register_load_state_dict_pre_hook(keep)\n")

# reset_to_zero clears out around the benchmark only: a total into torch.empty is right on the first call and
# garbage from the second on, as on a GPU (0 on main too; it guards run 2j + 1, which chooses without a benchmark)
TUNED_RESET_ON_EMPTY = model(_TUNED_TOTAL.replace("RESET", ', reset_to_zero=["out_ptr"]'),
                             _TUNED_TOTAL_LAUNCH.replace("torch.zeros", "torch.empty"))
