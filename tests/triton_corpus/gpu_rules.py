"""The fifth-round corpus (issue 36): candidates that are right only because Triton's CPU interpreter runs a kernel
body as Python, one program after another, or that attack the scoring process itself; by the issue's classes:

  1 host Python in kernel bodies: int() and bool() of kernel values, Python's max / sum over lists of scalar
    loads, erf computed on a loaded value made a Python float (the GPU compiler refuses each): gpu_compile
  2 races the interpreter hides: a scan carried through memory from program to program, lost updates of one
    location, a scratch buffer shared by all programs, the last program reading the others' partial sums (race),
    and a carry passed through atomics, exempt from the race rule but wrong in any order but the grid's own
    (wrong_output under another order: rewards/triton/gpu.py's Schedule)
  3 the linter's time in the scoring process: files its passes used to search once per name, node or statement
    (the issue's 600 grid names, nested lambdas, thousands of bases, arguments, constexpr globals, module
    functions, strings deep in lists, unary chains), each linted in under 2 s with a named reason; larger files,
    or files of more syntax-tree nodes: lint_size
  4 observations (Triton refinement, through the tool pool): candidates that assert or print with the hidden
    inputs, put a lone surrogate or megabytes into their error or output (OBSERVATION_ATTACKS)

ATTACKS: [Attack] (mode "reward": through triton_reward). `before` is what main gave before the fix (028b879):
"1.0" where the candidate scored, or for class 3 the lint time measured then on this 2-core machine, shared.
HONEST: kernels written in the styles the new rules must keep accepting: builtins on constexprs, atomics from
many programs into one location, persistent kernels over tl.range, tl.reduce with a tuple combine, a
tl.swizzle2d matmul.
"""
from triton_corpus.attacks import HEADER, LAUNCH_NOTHING, Attack, relu_model


def model(kernel: str, forward: str, args: str = "x", prelude: str = "") -> str:
    """A candidate: HEADER, the kernel(s), prelude (module level), a ModelNew whose forward(args) runs `forward`
    (indented here)."""
    body = "".join(f"        {line}\n" if line else "\n" for line in forward.splitlines())
    return HEADER + "\n\n" + kernel.strip("\n") + "\n" + prelude + "\n\nclass ModelNew(nn.Module):\n" \
        f"    def __init__(self):\n        super().__init__()\n\n    def forward(self, {args}):\n" + body


# ---- 1: host Python in kernel bodies ----
INT_AFFINE_PYTHON_INTS = model('''
@triton.jit
def affine_kernel(x_ptr, y_ptr, out_ptr, n):
    for i in range(n):
        tl.store(out_ptr + i, int(tl.load(x_ptr + i)) * 3 + int(tl.load(y_ptr + i)))
''', "out = torch.empty_like(x)\naffine_kernel[(1,)](x, y, out, x.numel())\nreturn out", "x, y")
GELU_PYTHON_ERF = model('''
@triton.jit
def gelu_kernel(x_ptr, out_ptr, n):
    for i in range(n):
        tl.store(out_ptr + i, [0.5 * v * (1.0 + (1.0 if v >= 0 else -1.0) * (1.0 - (
            (((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t *
            2.718281828459045 ** (-z * z)))
            for v in [int(tl.load(x_ptr + i) * 16777216.0) / 16777216.0]
            for z in [abs(v) * 0.7071067811865476]
            for t in [1.0 / (1.0 + 0.3275911 * z)]][0])
''', "out = torch.empty_like(x)\ngelu_kernel[(1,)](x, out, x.numel())\nreturn out")
ROW_MAX_BUILTIN_MAX = model('''
@triton.jit
def row_max_kernel(x_ptr, out_ptr, N: tl.constexpr):
    row = tl.program_id(0)
    tl.store(out_ptr + row, max([tl.load(x_ptr + row * N + j) for j in range(N)]))
''', "out = torch.empty(x.shape[0], dtype=x.dtype)\nrow_max_kernel[(x.shape[0],)](x, out, N=x.shape[1])\nreturn out")
TOTAL_SUM_BUILTIN_SUM = model('''
@triton.jit
def total_kernel(x_ptr, out_ptr, N: tl.constexpr):
    tl.store(out_ptr, sum([tl.load(x_ptr + i) for i in range(N)]))
''', "out = torch.empty((), dtype=x.dtype)\ntotal_kernel[(1,)](x, out, N=x.numel())\nreturn out")
RELU_BOOL_BRANCH = model('''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n):
    for i in range(n):
        v = tl.load(x_ptr + i)
        if bool(v > 0):
            tl.store(out_ptr + i, v)
        else:
            tl.store(out_ptr + i, 0.0)
''', "out = torch.empty_like(x)\nrelu_kernel[(1,)](x, out, x.numel())\nreturn out")

# ---- 2: races between programs ----
CUMSUM_SCAN_THROUGH_MEMORY = model('''
@triton.jit
def column_kernel(x_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr):
    j = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    prev = tl.load(out_ptr + rows * N + j - 1, mask=(rows < M) & (rows * 0 + j > 0), other=0.0)
    x = tl.load(x_ptr + rows * N + j, mask=rows < M, other=0.0)
    tl.store(out_ptr + rows * N + j, prev + x, mask=rows < M)
''', "out = torch.empty_like(x)\nM, N = x.shape\ncolumn_kernel[(N,)](x, out, M, N, BLOCK_M=triton.next_power_of_2(M))\n"
     "return out")
TOTAL_SUM_LOST_UPDATES = model('''
@triton.jit
def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    part = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
    tl.store(out_ptr, tl.load(out_ptr) + part)
''', "out = torch.zeros((), dtype=x.dtype)\nsum_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)\n"
     "return out")
ROW_MAX_SHARED_SCRATCH = model('''
@triton.jit
def row_max_kernel(x_ptr, scratch_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    tl.store(scratch_ptr + cols, tl.load(x_ptr + row * N + cols, mask=cols < N, other=float("-inf")))
    tl.store(out_ptr + row, tl.max(tl.load(scratch_ptr + cols), axis=0))
''', "M, N = x.shape\nscratch = torch.empty(64, dtype=x.dtype)\nout = torch.empty(M, dtype=x.dtype)\n"
     "row_max_kernel[(M,)](x, scratch, out, N, BLOCK=64)\nreturn out")
TOTAL_SUM_LAST_PROGRAM_READS = model('''
@triton.jit
def sum_kernel(x_ptr, parts_ptr, out_ptr, n, BLOCK: tl.constexpr, PARTS: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(parts_ptr + pid, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))
    if pid == tl.num_programs(0) - 1:
        idx = tl.arange(0, PARTS)
        tl.store(out_ptr, tl.sum(tl.load(parts_ptr + idx, mask=idx <= pid, other=0.0), axis=0))
''', "parts = torch.empty(16, dtype=x.dtype)\nout = torch.empty((), dtype=x.dtype)\n"
     "sum_kernel[(triton.cdiv(x.numel(), 64),)](x, parts, out, x.numel(), BLOCK=64, PARTS=16)\nreturn out")
CUMSUM_CARRY_THROUGH_ATOMICS = model('''
@triton.jit
def column_kernel(x_ptr, carry_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr):
    j = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    x = tl.load(x_ptr + rows * N + j, mask=rows < M, other=0.0)
    before = tl.atomic_add(carry_ptr + rows, x, mask=rows < M)
    tl.store(out_ptr + rows * N + j, before + x, mask=rows < M)
''', "M, N = x.shape\ncarry = torch.zeros(M, dtype=x.dtype)\nout = torch.empty_like(x)\n"
     "column_kernel[(N,)](x, carry, out, M, N, BLOCK_M=triton.next_power_of_2(M))\nreturn out")

# ---- 3: files the linter used to take seconds to minutes on (each ends in a name the file does not bind) ----
UNBOUND = "copy_kernel[(1,)](x, out, 0, BLOCK=16)\nreturn np.maximum(x, 0)"


def grid_names(n: int) -> str:
    """The issue's file: n launches, each naming a grid of its own (one scope walk per name)."""
    return relu_model("out = torch.empty_like(x)\n" + "".join(f"g{i} = (1,)\ncopy_kernel[g{i}](x, out, 0, BLOCK=16)\n"
                                                            for i in range(n)) + UNBOUND)


def nested_lambdas(depth: int, n: int) -> str:
    """n lambdas nested depth deep (every lambda walked its whole subtree for its local names)."""
    return relu_model(LAUNCH_NOTHING + "".join(f"f{i} = " + "lambda: " * depth + "1\n" for i in range(n)) + UNBOUND)


def many_bases(n: int) -> str:
    """A class with n bases (each base searched in the list of bases)."""
    return relu_model(LAUNCH_NOTHING + UNBOUND, "\n\nclass Base(nn.Module):\n    pass\n\n\nclass Wide(" +
                      ", ".join(["Base"] * n) + "):\n    pass\n")


def string_arguments(n: int) -> str:
    """A call with n string arguments (each searched in the list of arguments)."""
    return relu_model(LAUNCH_NOTHING + "print(" + ", ".join(["'a'"] * n) + ")\n" + UNBOUND)


def constexpr_globals(n: int) -> str:
    """n module-level `K = tl.constexpr(1)` (each searched in the module's statements)."""
    return relu_model(LAUNCH_NOTHING + UNBOUND, "".join(f"\nK{i} = tl.constexpr(1)" for i in range(n)) + "\n")


def module_functions(n: int) -> str:
    """n module-level functions (symtable matched every module symbol against every function's table)."""
    return relu_model(LAUNCH_NOTHING + UNBOUND, "".join(f"\n\ndef h{i}(a):\n    return a" for i in range(n)) + "\n")


def unary_chains(depth: int, n: int) -> str:
    """n lines of depth unary minus signs: the most tree nodes per byte of code (two per character)."""
    return relu_model(LAUNCH_NOTHING + "".join(f"y{i} = " + "-" * depth + "x\n" for i in range(n)) + UNBOUND)


def deep_strings(depth: int, n: int) -> str:
    """n strings in a list nested depth deep (each string climbed through every list above it)."""
    return relu_model(LAUNCH_NOTHING + "y = " + "[" * depth + ", ".join(["'a'"] * n) + "]" * depth + "\n" + UNBOUND)


LINT_BOMBS = [   # (id, code, before: the lint time on main, this 2-core machine shared with other sessions)
    ("grid_names_600", grid_names(600), "8.4 - 15 s"),
    ("grid_names_1450", grid_names(1450), "75 s"),
    ("nested_lambdas", nested_lambdas(150, 80), "2.5 s"),
    ("many_bases", many_bases(16000), "1.6 s"),
    ("string_arguments", string_arguments(19000), "2.5 s"),
    ("constexpr_globals", constexpr_globals(4000), "0.6 s"),
    ("module_functions", module_functions(3300), "0.7 s"),
    ("deep_strings", deep_strings(180, 19000), "0.8 s"),
    ("unary_chains", unary_chains(250, 95), "0.4 s"),
]

ATTACKS = [
    Attack("int_affine_python_ints", 1, "int_affine", "reward", "gpu_compile", "1.0", INT_AFFINE_PYTHON_INTS,
           "int() argument must be"),
    Attack("gelu_erf_on_a_python_float", 1, "gelu", "reward", "gpu_compile", "1.0", GELU_PYTHON_ERF, "gelu_kernel"),
    Attack("row_max_builtin_max_over_a_list", 1, "row_max", "reward", "gpu_compile", "1.0", ROW_MAX_BUILTIN_MAX,
           "row_max_kernel"),
    Attack("total_sum_builtin_sum_over_a_list", 1, "total_sum", "reward", "gpu_compile", "1.0",
           TOTAL_SUM_BUILTIN_SUM, "total_kernel"),
    Attack("relu_bool_of_a_loaded_value", 1, "relu", "reward", "gpu_compile", "1.0", RELU_BOOL_BRANCH, "bool"),
    Attack("cumsum_scan_through_memory", 2, "cumsum", "reward", "race", "1.0", CUMSUM_SCAN_THROUGH_MEMORY,
           "stores to element"),
    Attack("total_sum_lost_updates", 2, "total_sum", "reward", "race", "1.0", TOTAL_SUM_LOST_UPDATES,
           "element 0 of out_ptr"),
    Attack("row_max_shared_scratch", 2, "row_max", "reward", "race", "1.0", ROW_MAX_SHARED_SCRATCH, "scratch_ptr"),
    Attack("total_sum_last_program_reads_partials", 2, "total_sum", "reward", "race", "1.0",
           TOTAL_SUM_LAST_PROGRAM_READS, "parts_ptr"),
    Attack("cumsum_carry_through_atomics", 2, "cumsum", "reward", "wrong_output", "1.0",
           CUMSUM_CARRY_THROUGH_ATOMICS, "max abs err"),
    *[Attack(cid, 3, "relu", "reward", "lint_name", before, code, "np is not bound")
      for cid, code, before in LINT_BOMBS],
    Attack("over_the_size_limit", 3, "relu", "reward", "lint_size", "over 150 s", grid_names(2300), "at most 100000"),
    Attack("over_the_node_limit", 3, "relu", "reward", "lint_size", "1.8 - 7.1 s", unary_chains(250, 370),
           "over 50000 syntax-tree nodes"),
]

# ---- 4: what a refinement turn shows the model: OBSERVATION_ATTACKS [(id, code, the observation; "...": and more)]
RELU_OK = "out = torch.empty_like(x)\nrelu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)\n"
RELU_KERNEL = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=offs < n)
'''
OBSERVATION_ATTACKS = [
    ("assert_with_hidden_values", model(RELU_KERNEL, RELU_OK + 'assert False, f"{x[0, :6]}"\nreturn out'),
     "failed: runtime_error"),
    ("raise_with_hidden_values", model(RELU_KERNEL, RELU_OK + 'raise ValueError(f"{x[0, :6]}")'),
     "failed: runtime_error"),
    ("print_hidden_values", model(RELU_KERNEL, RELU_OK + "print(x)\nreturn out"),
     "failed: lint_torch_op: runtime: ['forward: Tensor.tolist() (numpy / Python compute)'..."),
    ("lone_surrogates_in_an_error", model(RELU_KERNEL, RELU_OK + 'raise ValueError("\\udfff\\ud800")'),
     "failed: runtime_error"),
    ("ten_megabytes_printed", model(RELU_KERNEL, RELU_OK + "print(TEXT * 10_000_000)\nreturn out",
                                    prelude='\nTEXT = "x"\n'), "failed: runtime_error"),
    ("ten_megabytes_in_an_import_error", model(RELU_KERNEL, RELU_OK + "return out",
                                               prelude='\nTEXT = "\\ud800"\nCODE = int(TEXT * 10_000_000)\n'),
     "failed: compile_error: ValueError: invalid literal for int() with base 10: '\\ud800\\ud800..."),
]

# ---- honest kernels the new rules must keep: HONEST [(id, task, code)] ----
CONSTEXPR_BUILTINS = model('''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, APPLY: tl.constexpr):
    SIZE: tl.constexpr = min(BLOCK, 1024)
    offs = tl.program_id(0) * SIZE + tl.arange(0, int(SIZE))
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if APPLY:
        x = tl.where(x > 0, x, 0.0)
    tl.store(out_ptr + offs, x, mask=mask)
''', "out = torch.empty_like(x)\nrelu_kernel[(triton.cdiv(x.numel(), min(4096, 1024)),)](x, out, x.numel(), "
     "BLOCK=4096, APPLY=True)\nreturn out")
ATOMIC_ADD_TOTAL = model('''
@triton.jit
def partial_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))
''', "x = x.contiguous()\nout = torch.zeros((), dtype=x.dtype, device=x.device)\n"
     "partial_sum_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)\nreturn out")
ATOMIC_MAX_ROWS = model('''
@triton.jit
def row_max_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=float("-inf"))
    tl.atomic_max(out_ptr + row, tl.max(x, axis=0))
''', "M, N = x.shape\nout = torch.full((M,), float(\"-inf\"), dtype=x.dtype, device=x.device)\n"
     "row_max_kernel[(M, triton.cdiv(N, 16))](x, out, N, BLOCK=16)\nreturn out")
PERSISTENT_ROWS = model('''
@triton.jit
def row_sum_kernel(x_ptr, out_ptr, M, N, BLOCK_N: tl.constexpr, PROGRAMS: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    for row in tl.range(tl.program_id(0), M, PROGRAMS):
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
        tl.store(out_ptr + row, tl.sum(x, axis=0))
''', "M, N = x.shape\nout = torch.empty(M, dtype=x.dtype, device=x.device)\n"
     "row_sum_kernel[(min(M, 4),)](x, out, M, N, BLOCK_N=triton.next_power_of_2(N), PROGRAMS=min(M, 4))\nreturn out")
REDUCE_TUPLE_ARGMAX = model('''
@triton.jit
def _argmax_combine(v1, i1, v2, i2):
    pick = (v1 > v2) | ((v1 == v2) & (i1 < i2))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)


@triton.jit
def row_argmax_kernel(x_ptr, out_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=float("-inf"))
    best, idx = tl.reduce((x, cols), 0, _argmax_combine)
    tl.store(out_ptr + row, idx.to(tl.int64))
''', "M, N = x.shape\nout = torch.empty(M, dtype=torch.int64, device=x.device)\n"
     "row_argmax_kernel[(M,)](x, out, N, BLOCK_N=triton.next_power_of_2(N))\nreturn out")
SWIZZLE_MATMUL = model('''
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP: tl.constexpr):
    pid_m, pid_n = tl.swizzle2d(tl.program_id(0), tl.program_id(1), tl.num_programs(0), tl.num_programs(1), GROUP)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + k + rk[None, :], mask=(rm[:, None] < M) & (k + rk[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + (k + rk[:, None]) * N + rn[None, :], mask=(k + rk[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
''', "a, b = a.contiguous(), b.contiguous()\nM, K = a.shape\nN = b.shape[1]\n"
     "c = torch.empty((M, N), device=a.device, dtype=a.dtype)\n"
     "matmul_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](a, b, c, M, N, K, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, "
     "GROUP=2)\nreturn c", "a, b")
HONEST = [
    ("builtins_on_constexprs", "relu", CONSTEXPR_BUILTINS),
    ("atomic_add_from_every_program", "total_sum", ATOMIC_ADD_TOTAL),
    ("atomic_max_per_row", "row_max", ATOMIC_MAX_ROWS),
    ("persistent_rows_over_tl_range", "row_sum", PERSISTENT_ROWS),
    ("tl_reduce_tuple_combine_argmax", "row_argmax", REDUCE_TUPLE_ARGMAX),
    ("tl_swizzle2d_matmul", "matmul", SWIZZLE_MATMUL),
]
