"""Issue 52's round 6, the launch classes: autotuners, programs resident at once, configs a GPU skips, public
messages. (id, task, attack, reason, honest) in CASES, as tests/triton_corpus/round6.py; each attack scored 1.0 on
main before the change (e2de9f9) but where said, and its honest twin scores 1.0 now. LEAKS: candidates whose
public message (what triton_refine shows the model) carried values computed from the hidden inputs on e2de9f9.

  ninth_config_does_nothing   a relu autotuned over 9 configs, the ninth (WORK=0) stores nothing: runs were capped at
                              16, two per config, so the ninth was benchmarked but never chosen / the same 9 configs
                              all doing the work (rule: every config of every autotuner is chosen in a run that tunes
                              and in a run that only chooses: 2n runs for n configs, up to triton_gpu.MAX_RUNS; an
                              autotuned forward needing more is a refused launch)
  tuners_choose_apart         total_sum by two autotuned kernels, BLOCK 64 or 128 each: the second reads as many
                              partial sums as its own BLOCK makes, right only when both chose alike (every run gave
                              every autotuner the same config index) / the second sums every partial the smallest
                              BLOCK could make, zeros beyond (reset_to_zero: none left by the benchmark either)
                              (rule: each tuning chooses on its own, and the runs that only choose meet every pair of
                              configs of any two tunings)
  seventeen_inside            a relu over 50 programs that counts the programs inside with atomic_add and stores x
                              unchanged when 16 were inside before it: programs were admitted one at a time, so never
                              more than a few were inside / the same count, relu in every case (rule: run 2 of a case
                              admits every program, up to sm_90's 132 SMs, each up to its first atomic, before any
                              atomic runs, then round-robin at every atomic)
  all_configs_too_big         a tf32x3 matmul autotuned over two configs that need 256 KiB of shared memory, more than
                              sm_90's 227 KiB: gpu_compile before and now (Triton's autotuner skips a config that runs
                              out of resources and fails when all do) / one config that fits beside one too big: 1.0
                              now, gpu_compile on e2de9f9 (honest work refused; rule: a config that runs out of shared
                              memory or threads, or that ptxas or a static_assert refuses, is skipped while tuning, as
                              Triton's Autotuner._bench skips it)

LEAKS (id, task, code, reason): the public text now is the reason's own sentence (kernel.PUBLIC), nothing the run chose
  waits_where_positive   programs whose first element is positive wait on a flag nobody sets: the deadlock text
                         said how many programs waited (how many blocks start positive) and in which run
  races_by_sign          every program stores its block's sum to scratch a or b by the sign of x[0]: the race text
                         named the argument that raced in each case (the sign of each case's x[0])
  runs_by_sign           a relu off by 0.5 everywhere with an atomic_add from every program only where x[0] > 0
                         (4 runs instead of 3): wrong_output's text said "case 0, run 0 of N"
"""
from triton_corpus.gpu_rules import model

# ---- class 1: nine configs ----
_NINE = '''
@triton.autotune(configs=[
    triton.Config({"BLOCK": 64, "WORK": 1}, num_warps=1), triton.Config({"BLOCK": 64, "WORK": 1}, num_warps=2),
    triton.Config({"BLOCK": 128, "WORK": 1}, num_warps=1), triton.Config({"BLOCK": 128, "WORK": 1}, num_warps=2),
    triton.Config({"BLOCK": 256, "WORK": 1}, num_warps=1), triton.Config({"BLOCK": 256, "WORK": 1}, num_warps=2),
    triton.Config({"BLOCK": 512, "WORK": 1}, num_warps=1), triton.Config({"BLOCK": 512, "WORK": 1}, num_warps=2),
    triton.Config({"BLOCK": 1024, "WORK": NINTH}, num_warps=4),
], key=["n"])
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, WORK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if WORK:
        tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0), mask=offs < n)
'''
_NINE_LAUNCH = "x = x.contiguous()\nout = torch.empty_like(x)\n" \
    "relu_kernel[lambda meta: (triton.cdiv(x.numel(), meta[\"BLOCK\"]),)](x, out, x.numel())\nreturn out"
NINTH_CONFIG_DOES_NOTHING = model(_NINE.replace("NINTH", "0"), _NINE_LAUNCH)
NINE_CONFIGS_ALL_WORK = model(_NINE.replace("NINTH", "1"), _NINE_LAUNCH)

# ---- class 2: two autotuners ----
_PARTIALS = '''
@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"]RESET)
@triton.jit
def partial_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(partial_ptr + pid, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def finish_kernel(partial_ptr, out_ptr, n, MAX_PARTS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, MAX_PARTS)
    tl.store(out_ptr, tl.sum(tl.load(partial_ptr + i, mask=i < COUNT, other=0.0), axis=0))
'''
_PARTIALS_LAUNCH = "x = x.contiguous()\nn = x.numel()\nparts = triton.cdiv(n, 64)\n" \
    "partial = torch.ALLOC(parts, dtype=x.dtype)\nout = torch.empty((), dtype=x.dtype)\n" \
    "partial_kernel[lambda meta: (triton.cdiv(n, meta[\"BLOCK\"]),)](x, partial, n)\n" \
    "finish_kernel[(1,)](partial, out, n, MAX_PARTS=triton.next_power_of_2(parts))\nreturn out"
# the second reads the partials its own BLOCK would make: right only when both autotuners chose the same BLOCK
TUNERS_CHOOSE_APART = model(_PARTIALS.replace("COUNT", "tl.cdiv(n, BLOCK)").replace("RESET", ""),
                            _PARTIALS_LAUNCH.replace("ALLOC", "empty"))
# every partial the smallest BLOCK makes, zeros past the ones written (also past the benchmark's: reset_to_zero):
# right for any pair of choices
TUNERS_ANY_PAIR = model(_PARTIALS.replace("COUNT", "tl.cdiv(n, 64)").replace("RESET",
                                                                             ', reset_to_zero=["partial_ptr"]'),
                        _PARTIALS_LAUNCH.replace("ALLOC", "zeros"))

# ---- class 3: programs resident at once ----
_INSIDE = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, inside_ptr, n, BLOCK: tl.constexpr):
    before = tl.atomic_add(inside_ptr, 1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, STORED, mask=offs < n)
    tl.atomic_add(inside_ptr, -1)
'''
_INSIDE_LAUNCH = "x = x.contiguous()\nout = torch.empty_like(x)\ninside = torch.zeros((), dtype=torch.int32)\n" \
    "relu_kernel[(triton.cdiv(x.numel(), 16),)](x, out, inside, x.numel(), BLOCK=16)\nreturn out"
SEVENTEEN_INSIDE = model(_INSIDE.replace("STORED", "tl.where(before < 16, tl.maximum(x, 0.0), x)"), _INSIDE_LAUNCH)
COUNTED_INSIDE = model(_INSIDE.replace("STORED", "tl.maximum(x, 0.0)"), _INSIDE_LAUNCH)

# ---- class 4: configs sm_90 cannot hold (a tf32x3 dot pipelined over CONFIGS stages of A and B tiles) ----
_MATMUL = '''
@triton.autotune(configs=[CONFIGS], key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="tf32x3")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''
_MATMUL_LAUNCH = "a = a.contiguous()\nb = b.contiguous()\nM, K = a.shape\nN = b.shape[1]\n" \
    "c = torch.empty((M, N), dtype=a.dtype)\nmatmul_kernel[lambda meta: (triton.cdiv(M, meta[\"BM\"]), " \
    "triton.cdiv(N, meta[\"BN\"]))](a, b, c, M, N, K)\nreturn c"
_FITS = 'triton.Config({"BM": 16, "BN": 16, "BK": 16}, num_stages=2)'
_TOO_BIG = 'triton.Config({"BM": 64, "BN": 64, "BK": 64}, num_stages=8)'      # 256 KiB of shared memory
ALL_CONFIGS_TOO_BIG = model(_MATMUL.replace("CONFIGS", f'{_TOO_BIG}, triton.Config({{"BM": 64, "BN": 64, "BK": 128}}, '
                                                       'num_stages=4)'), _MATMUL_LAUNCH, "a, b")
ONE_CONFIG_TOO_BIG = model(_MATMUL.replace("CONFIGS", f"{_FITS}, {_TOO_BIG}"), _MATMUL_LAUNCH, "a, b")

CASES = [
    ("ninth_config_does_nothing", "relu", NINTH_CONFIG_DOES_NOTHING, "wrong_output", NINE_CONFIGS_ALL_WORK),
    ("tuners_choose_apart", "total_sum", TUNERS_CHOOSE_APART, "wrong_output", TUNERS_ANY_PAIR),
    ("seventeen_inside", "relu", SEVENTEEN_INSIDE, "wrong_output", COUNTED_INSIDE),
    ("all_configs_too_big", "matmul", ALL_CONFIGS_TOO_BIG, "gpu_compile", ONE_CONFIG_TOO_BIG),
]

# ---- class 5: public messages ----
WAITS_WHERE_POSITIVE = model('''
@triton.jit
def relu_kernel(x_ptr, out_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if tl.load(x_ptr + tl.program_id(0) * BLOCK) > 0:
        tl.atomic_poll(flag_ptr, 1)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=offs < n)
''', "x = x.contiguous()\nout = torch.empty_like(x)\nflag = torch.zeros((), dtype=torch.int32)\n"
     "relu_kernel[(triton.cdiv(x.numel(), 128),)](x, out, flag, x.numel(), BLOCK=128)\nreturn out")
RACES_BY_SIGN = model('''
@triton.jit
def total_kernel(x_ptr, a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    part = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
    if tl.load(x_ptr) > 0:
        tl.store(a_ptr, part)
    else:
        tl.store(b_ptr, part)
    tl.atomic_add(out_ptr, part)
''', "x = x.contiguous()\na = torch.zeros((), dtype=x.dtype)\nb = torch.zeros((), dtype=x.dtype)\n"
     "out = torch.zeros((), dtype=x.dtype)\ntotal_kernel[(triton.cdiv(x.numel(), 64),)](x, a, b, out, x.numel(), "
     "BLOCK=64)\nreturn out")
RUNS_BY_SIGN = model('''
@triton.jit
def relu_kernel(x_ptr, out_ptr, count_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0) + 0.5, mask=offs < n)
    if tl.load(x_ptr) > 0:
        tl.atomic_add(count_ptr, 1)
''', "x = x.contiguous()\nout = torch.empty_like(x)\ncount = torch.zeros((), dtype=torch.int32)\n"
     "relu_kernel[(triton.cdiv(x.numel(), 128),)](x, out, count, x.numel(), BLOCK=128)\nreturn out")
LEAKS = [
    ("waits_where_positive", "relu", WAITS_WHERE_POSITIVE, "deadlock"),
    ("races_by_sign", "total_sum", RACES_BY_SIGN, "race"),
    ("runs_by_sign", "relu", RUNS_BY_SIGN, "wrong_output"),
]

# past the cap: the nine-config relu (all working) tuned for two sizes, a third of x and the rest, is two tunings of
# 9 configs each, 9 + 81 runs to meet every pair: a refused launch (lint_launch), as is any forward past
# triton_gpu.MAX_RUNS (honest work refused)
TWO_SIZES_OF_NINE = model(_NINE.replace("NINTH", "1"), "shape = x.shape\nx = x.contiguous().view(-1)\n"
                          "out = torch.empty_like(x)\nthird = x.numel() // 3\n"
                          "relu_kernel[lambda meta: (triton.cdiv(third, meta[\"BLOCK\"]),)](x, out, third)\n"
                          "relu_kernel[lambda meta: (triton.cdiv(x.numel() - third, meta[\"BLOCK\"]),)](x[third:], "
                          "out[third:], x.numel() - third)\nreturn out.view(shape)")
