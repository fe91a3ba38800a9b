"""Issue 44: the interpreter behaves like the GPU it stands for (rewards/triton/gpu.py, rewards/triton/harness.py).

For each class done, an attack that scored 1.0 on main (before this issue's fix) and an honest kernel in the same
style that keeps scoring 1.0, through triton_reward:
  bounds     a load whose mask forgets `offs >= 1` reads 4 bytes before its tensor: out_of_bounds
  garbage    a ReLU that stores only the positive elements into a 64 MiB torch.empty (zero pages on CPU): NaN in
             fresh memory, wrong_output; the same kernel into torch.zeros scores
  tf32       an fp32 tl.dot with the default input precision: TF32 operands on sm_90, wrong_output at 1e-4;
             input_precision="ieee" scores
  messages   a race's and a bounds failure's detail names the kernel, the argument, programs and elements; their
             public text is the reason's own sentence (issue 52: which argument races can be the inputs' choice)
  builtins   min / max / and / or / not / conditions / assert on kernel values as sm_90's compiler compiles them
             (each form's TTIR equals its explicit twin's, the interpreter agrees bit for bit); the honest leaky
             ReLU with Python's max scored wrong_output on main, now 1.0
  descriptors  tl.make_tensor_descriptor loads and stores run (refused by accident on main), bounds checked
  visibility a scratch buffer read back in other lanes without tl.debug_barrier: race (1.0 on main); with it: 1.0;
             a row sum stored as its cumulative sums from every lane to one address (the interpreter keeps the
             last lane's, the total): race (1.0 on main at 1e081f3); the total stored from every lane: 1.0
"""
import pytest

from data.triton_tasks import load_tasks
from rewards.sandbox import bwrap_problem
from rewards.triton.kernel import PUBLIC, lint, triton_reward
from triton_corpus.gpu_rules import ATTACKS, model

TASKS = {t["name"]: t for t in load_tasks()}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")

RELU_LAUNCH = "relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)\nreturn out"
RELU_BEFORE = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    before = tl.load(x_ptr + offs - 1, mask=MASK)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0) + tl.where(offs >= 1, before * 0.0, 0.0), mask=offs < n)
'''
RELU_POSITIVES = '''
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, x, mask=(offs < n) & (x > 0.0))
'''
BIG_EMPTY = "out = torch.empty(1 << 24, dtype=x.dtype)[:x.numel()].view(x.shape)\n"
MATMUL = TASKS["matmul"]["solution"]
CASES = [   # (id, task, attack, reason, honest)
    ("bounds_mask_forgets_the_first_column", "relu",
     model(RELU_BEFORE.replace("MASK", "offs < n"), "out = torch.empty_like(x)\n" + RELU_LAUNCH), "out_of_bounds",
     model(RELU_BEFORE.replace("MASK", "(offs < n) & (offs >= 1)"), "out = torch.empty_like(x)\n" + RELU_LAUNCH)),
    ("garbage_relu_stores_only_positives", "relu", model(RELU_POSITIVES, BIG_EMPTY + RELU_LAUNCH), "wrong_output",
     model(RELU_POSITIVES, "out = torch.zeros_like(x)\n" + RELU_LAUNCH)),
    ("tf32_dot_default_precision", "matmul", MATMUL.replace(', input_precision="ieee"', ""), "wrong_output",
     MATMUL.replace('input_precision="ieee"', 'input_precision="tf32x3"')),
]


def test_the_attacks_pass_the_linter_and_differ_from_their_honest_twins():
    assert MATMUL.count('input_precision="ieee"') == 1
    for cid, _, attack, _, honest in CASES:
        assert lint(attack) == lint(honest) == (None, ""), cid
        assert attack != honest, cid


@needs_bwrap
@pytest.mark.parametrize("cid, task, attack, reason, honest", CASES, ids=[c[0] for c in CASES])
def test_attack_scores_zero_and_its_honest_twin_one(cid, task, attack, reason, honest):
    score, info = triton_reward(attack, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (0.0, reason), info
    score, info = triton_reward(honest, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


@needs_bwrap
def test_race_and_bounds_messages_show_the_reason_only():
    race = next(a for a in ATTACKS if a.id == "total_sum_lost_updates")
    score, info = triton_reward(race.code, TASKS[race.task], timeout_s=60)
    assert info["reason"] == "race" and "race: sum_kernel: out_ptr: " in info["detail"], info
    assert "element 0 of out_ptr" in info["detail"] and info["public"] == PUBLIC["race"], info
    score, info = triton_reward(CASES[0][2], TASKS["relu"], timeout_s=60)
    assert info["reason"] == "out_of_bounds" and "out_of_bounds: relu_kernel: x_ptr: " in info["detail"], info
    assert "bytes outside" in info["detail"] and info["public"] == PUBLIC["out_of_bounds"], info


# ---- builtins and boolean operators on kernel values, as the compiler compiles them (triton_gpu._Semantics) ----
# (form, its explicit twin): the sm_90 compiler gives both the same TTIR, so the interpreter must give both the
# same result. x, y: fp32 blocks holding NaN and -0.0; n: an int32 scalar; slope: an fp32 scalar; C: a constexpr.
AGREE = [
    ("max(x, y)", "tl.maximum(x, y)"),
    ("min(x, y, 0.5)", "tl.minimum(tl.minimum(x, y), 0.5)"),
    ("max(x, slope * x)", "tl.maximum(x, slope * x)"),
    ("max(n, 2) + x", "tl.maximum(n, 2) + x"),
    ("min(C, 4) + x", "3 + x"),
    ("((x > 0) and (y > 0)).to(tl.float32)", "((x > 0) & (y > 0)).to(tl.float32)"),
    ("((x > 0) or (y > 0) or (x < -1)).to(tl.float32)", "((x > 0) | ((y > 0) | (x < -1))).to(tl.float32)"),
    ("(not (x > 0)).to(tl.float32)", "(~(x > 0)).to(tl.float32)"),
    ("x + (n > 4 and n < 100)", "x + ((n > 4) & (n < 100))"),
    ("x + (C > 1 and n > 4)", "x + (n > 4)"),
    ("x + (not C)", "x + 0"),
    ("x if n > 4 or C > 5 else y", "x if n > 4 else y"),
]
REFUSED = ["x if x > 0 else y", "(not x).to(tl.float32)", "x + (x if x else y)"]
KERNEL = '''
@triton.jit
def {name}(x_ptr, y_ptr, out_ptr, n, slope, C: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    r = {expr}
    tl.store(out_ptr + offs, r)
'''


def _kernels(tmp_path, exprs: list):
    """The module of one kernel per expression (k0, k1, ...), from a file (Triton reads kernels' source)."""
    import importlib.util
    path = tmp_path / "forms.py"
    path.write_text("import triton\nimport triton.language as tl\n" +
                    "".join(KERNEL.format(name=f"k{i}", expr=e) for i, e in enumerate(exprs)))
    spec = importlib.util.spec_from_file_location("forms", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [getattr(module, f"k{i}") for i in range(len(exprs))]


def _ttir(kernel) -> str:
    """The kernel's TTIR for sm_90, without locations and its name."""
    import re
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile
    from rewards.triton.gpu import _GPU_TARGET
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "slope": "fp32",
                 "C": "constexpr", "BLOCK": "constexpr"}
    ttir = compile(ASTSource(kernel, signature, {"C": 3, "BLOCK": 16}), target=GPUTarget(*_GPU_TARGET)).asm["ttir"]
    return re.sub(r"loc\([^)]*\)|#loc\d*|@k\d+", "", "\n".join(line for line in ttir.splitlines()
                                                               if not line.startswith("#loc")))


def _interpret(kernel, monkeypatch):
    """out of the kernel under Triton's interpreter with the sandbox's rewrite (n=7, slope=0.25, C=3)."""
    import torch
    from triton.runtime import interpreter
    from rewards.triton import gpu as triton_gpu
    monkeypatch.setattr(interpreter, triton_gpu._SEMANTICS, triton_gpu._Semantics, raising=False)
    monkeypatch.setattr(interpreter.FunctionRewriter, "ast_transformer", triton_gpu.gpu_transformer())
    x = torch.tensor([1.5, -2.0, 0.0, -0.0, float("nan"), 3.0, -0.5, 0.25] * 2)
    y = torch.tensor([-1.0, float("nan"), -0.0, 0.0, 2.0, 3.0, 0.75, -4.0] * 2)
    out = torch.empty(16)
    interpreter.InterpretedFunction(kernel.fn)[(1,)](x, y, out, 7, 0.25, C=3, BLOCK=16)
    return out


def test_builtins_and_boolean_operators_agree_with_the_compiler(tmp_path, monkeypatch):
    import torch
    kernels = _kernels(tmp_path, [e for pair in AGREE for e in pair])
    for i, (form, twin) in enumerate(AGREE):
        assert _ttir(kernels[2 * i]) == _ttir(kernels[2 * i + 1]), form
        got, want = _interpret(kernels[2 * i], monkeypatch), _interpret(kernels[2 * i + 1], monkeypatch)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (form, got, want)


def test_what_the_compiler_refuses_fails_in_the_interpreter_too(tmp_path, monkeypatch):
    for kernel, form in zip(_kernels(tmp_path, REFUSED), REFUSED):
        with pytest.raises(Exception):
            _ttir(kernel)
        with pytest.raises(Exception):
            _interpret(kernel, monkeypatch)


LEAKY_BUILTIN_MAX = TASKS["leaky_relu"]["solution"].replace("tl.where(x >= 0, x, x * negative_slope)",
                                                            "max(x, x * negative_slope)")


@needs_bwrap
def test_honest_leaky_relu_with_builtin_max_scores_one():
    """Python's max on blocks compiles element-wise (tl.maximum); the interpreter compared the blocks as a whole
    and returned one of them (wrong_output on main)."""
    assert "max(x, x * negative_slope)" in LEAKY_BUILTIN_MAX and lint(LEAKY_BUILTIN_MAX) == (None, "")
    score, info = triton_reward(LEAKY_BUILTIN_MAX, TASKS["leaky_relu"], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


DESCRIPTOR_RELU = model('''
@triton.jit
def relu_kernel(x_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, SHAPE_N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    m0 = tl.program_id(0) * BLOCK_M
    n0 = tl.program_id(1) * BLOCK_N
    out_desc.store([m0, n0], tl.maximum(x_desc.load([m0, n0]), 0.0))
''', "M, N = x.shape\nout = torch.empty_like(x)\n"
     "relu_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 32))](x, out, M, N, BLOCK_M=16, BLOCK_N=32)\nreturn out")


@needs_bwrap
def test_tensor_descriptors_run_with_bounds_on_what_they_access():
    """tl.make_tensor_descriptor / desc.load / desc.store (relu's 8 x 100 input: boxes of 16 x 32 cross both
    edges, TMA zero-fills what lies outside the descriptor's shape) score 1.0 (main: lint_forbidden_call for
    `.load`, and with the linter bypassed compile_error from the hooked masked_load's keyword arguments); a
    descriptor whose shape claims 28 more columns than x has reads past x's storage: out_of_bounds."""
    honest, overreach = DESCRIPTOR_RELU.replace("SHAPE_N", "N"), DESCRIPTOR_RELU.replace("SHAPE_N", "N + 28")
    assert lint(honest) == lint(overreach) == (None, "")
    score, info = triton_reward(honest, TASKS["relu"], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info
    score, info = triton_reward(overreach, TASKS["relu"], timeout_s=60)
    assert (score, info["reason"], info["public"]) == (0.0, "out_of_bounds", PUBLIC["out_of_bounds"]), info
    assert "out_of_bounds: relu_kernel: x_ptr: " in info["detail"], info


# ---- stores inside one program are visible to its other lanes only after tl.debug_barrier (Visibility) ----
SCRATCH_REVERSED = '''
@triton.jit
def relu_kernel(x_ptr, scratch_ptr, out_ptr, n, BLOCK: tl.constexpr):
    base = tl.program_id(0) * BLOCK
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + base + offs, mask=base + offs < n, other=0.0)
    tl.store(scratch_ptr + base + offs, tl.maximum(x, 0.0))
    BARRIER
    rev = BLOCK - 1 - offs
    tl.store(out_ptr + base + rev, tl.load(scratch_ptr + base + rev), mask=base + rev < n)
'''
SCRATCH_LAUNCH = "n = x.numel()\nout = torch.empty_like(x)\nscratch = torch.empty(triton.cdiv(n, 256) * 256)\n" \
    "relu_kernel[(triton.cdiv(n, 256),)](x, scratch, out, n, BLOCK=256)\nreturn out"
SCRATCH_TRANSPOSED = '''
@triton.jit
def relu_kernel(x_ptr, scratch_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BN)
    inside = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=inside, other=0.0)
    tl.store(scratch_ptr + cols[None, :] * M + rows[:, None], tl.maximum(x, 0.0), mask=inside)
    BARRIER
    t_inside = (cols[:, None] < N) & (rows[None, :] < M)
    t = tl.load(scratch_ptr + cols[:, None] * M + rows[None, :], mask=t_inside)
    tl.store(out_ptr + rows[None, :] * N + cols[:, None], t, mask=t_inside)
'''
TRANSPOSED_LAUNCH = "M, N = x.shape\nout = torch.empty_like(x)\nscratch = torch.empty(N * M)\n" \
    "relu_kernel[(triton.cdiv(M, 4),)](x, scratch, out, M, N, BM=4, BN=128)\nreturn out"
VISIBILITY = [   # (id, task, attack, reason, honest): the attacks scored 1.0 on main
    ("visibility_scratch_read_back_reversed", "relu",
     model(SCRATCH_REVERSED.replace("BARRIER", "pass"), SCRATCH_LAUNCH), "race",
     model(SCRATCH_REVERSED.replace("BARRIER", "tl.debug_barrier()"), SCRATCH_LAUNCH)),
    ("visibility_scratch_read_back_transposed", "relu",
     model(SCRATCH_TRANSPOSED.replace("BARRIER", "pass"), TRANSPOSED_LAUNCH), "race",
     model(SCRATCH_TRANSPOSED.replace("BARRIER", "tl.debug_barrier()"), TRANSPOSED_LAUNCH)),
]


@needs_bwrap
@pytest.mark.parametrize("cid, task, attack, reason, honest", VISIBILITY, ids=[c[0] for c in VISIBILITY])
def test_visibility_attack_scores_zero_and_its_honest_twin_one(cid, task, attack, reason, honest):
    assert lint(attack) == lint(honest) == (None, "")
    score, info = triton_reward(attack, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (0.0, reason), info
    assert info["public"] == PUBLIC["race"] and "race: relu_kernel: scratch_ptr: " in info["detail"], info
    score, info = triton_reward(honest, TASKS[task], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


ONE_ADDRESS = '''
@triton.jit
def row_sum_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(out_ptr + row + cols * 0, VALUE, mask=cols < N)
'''
ONE_ADDRESS_LAUNCH = "x = x.contiguous()\nM, N = x.shape\nout = torch.empty(M, dtype=x.dtype)\n" \
    "row_sum_kernel[(M,)](x, out, N, BLOCK=triton.next_power_of_2(N))\nreturn out"


@needs_bwrap
def test_lanes_that_store_different_values_to_one_byte_race():
    """Every lane of a row's program stores to out[row]: the cumulative sums (the interpreter keeps the last
    lane's, the total; a GPU any lane's) is a race; the total from every lane agrees and scores."""
    attack = model(ONE_ADDRESS.replace("VALUE", "tl.cumsum(x, axis=0)"), ONE_ADDRESS_LAUNCH)
    honest = model(ONE_ADDRESS.replace("VALUE", "tl.sum(x, axis=0) + cols * 0.0"), ONE_ADDRESS_LAUNCH)
    assert lint(attack) == lint(honest) == (None, "")
    score, info = triton_reward(attack, TASKS["row_sum"], timeout_s=60)
    assert (score, info["reason"], info["public"]) == (0.0, "race", PUBLIC["race"]), info
    assert "race: row_sum_kernel: out_ptr: " in info["detail"], info
    score, info = triton_reward(honest, TASKS["row_sum"], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


SAME_LANES = model('''
@triton.jit
def relu_kernel(x_ptr, out_ptr, count_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
    y = tl.maximum(tl.load(out_ptr + offs, mask=mask), 0.0)
    tl.store(out_ptr + offs, y, mask=mask)
    tl.store(count_ptr + tl.program_id(0), tl.sum(tl.where(mask, 1, 0), axis=0))
    tl.debug_barrier()
    total = tl.load(count_ptr + tl.program_id(0))
    tl.atomic_add(count_ptr + tl.num_programs(0), total)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=mask) + 0.0 * total, mask=mask)
''', "n = x.numel()\nout = torch.empty_like(x)\ncount = torch.zeros(triton.cdiv(n, 256) + 1, dtype=torch.int32)\n"
     "relu_kernel[(triton.cdiv(n, 256),)](x, out, count, n, BLOCK=256)\nreturn out")


@needs_bwrap
def test_reading_back_in_the_same_lanes_needs_no_barrier():
    """Honest patterns the visibility rule keeps: a store then a load of the same offsets in the same block shape,
    a reduction stored as a scalar and loaded back as a scalar after tl.debug_barrier (thread 0 stores it, every
    thread loads it: without the barrier a race, tests/triton_corpus/round6_memory.py), atomics after plain
    stores."""
    assert lint(SAME_LANES) == (None, "")
    score, info = triton_reward(SAME_LANES, TASKS["relu"], timeout_s=60)
    assert (score, info["reason"]) == (1.0, "ok"), info


def test_visibility_rule_lanes_barriers_and_programs():
    """Visibility alone: a load in the lanes that stored (same shape, same positions) is fine, another position or
    another shape is a race until tl.debug_barrier or the program's end; each program has its own stores. At a
    barrier, two lanes whose last stores to a byte differ are a race; the same value, or one lane storing twice
    (program order), is not."""
    from types import SimpleNamespace as Handle
    import numpy as np
    from rewards.triton.memory import Visibility, _bytes

    def access(v, kind, program, addresses, mask=None, values=None):
        ptrs = Handle(data=np.array(addresses, np.uint64), get_element_ty=lambda: Handle(primitive_bitwidth=32))
        mask = mask and Handle(data=np.array(mask))
        value = Handle(data=np.array(values if values is not None else np.zeros(ptrs.data.shape), np.float32))
        keys, written = v.lanes(ptrs, mask, value if kind == "store" else None)
        getattr(v, kind)(program, _bytes(ptrs, mask), keys, *([written] if kind == "store" else []))
        return v.clash

    block, reversed_block, tile = [100, 104, 108, 112], [112, 108, 104, 100], [[100, 104], [108, 112]]
    v = Visibility()
    assert access(v, "store", 0, block) is None and access(v, "load", 0, block) is None
    assert access(v, "load", 1, reversed_block) is None                         # another program: not this rule
    assert access(v, "load", 0, [200, 204, 208, 212]) is None                    # bytes no lane of it stored
    assert access(v, "load", 0, [112, 104, 100, 108], [False, True, False, False]) is None   # masked-in: lane 1
    v.barrier(0)
    assert access(v, "load", 0, tile) is None                                   # after the barrier: any shape
    assert access(v, "store", 0, block, [True, True, False, False]) is None
    assert access(v, "load", 0, [[104, 100], [112, 116]]) == (0, 104, "load")   # lane 0 reads lane 1's store
    v = Visibility()
    access(v, "store", 3, block)
    assert access(v, "load", 3, tile) == (3, 100, "load")                       # another block shape
    v = Visibility()
    access(v, "store", 5, [100])
    assert access(v, "load", 5, [100]) is None                                  # the storing lane reads it back
    v = Visibility()
    access(v, "store", 6, [100, 100, 104, 104], values=[1.0, 1.0, 2.0, 2.0])    # lanes agree on each byte
    access(v, "store", 6, block, values=[7.0, 2.0, 0.0, 0.0])
    access(v, "store", 6, block, values=[1.0, 2.0, 0.0, 0.0])                   # lane 0 again: program order
    v.barrier(6)
    assert v.clash is None
    access(v, "store", 7, block, values=[1.0, 2.0, 3.0, 4.0])
    access(v, "store", 7, [100], values=[5.0])                                  # a scalar: another lane
    assert v.clash is None and v.barrier(7) is None and v.clash == (7, 100, "store")
    v = Visibility()
    access(v, "store", 8, [100, 104, 104, 108], [True, True, True, False], values=[1.0, 2.0, 3.0, 9.0])
    v.barrier(8)
    assert v.clash == (8, 104, "store")                                         # within one store; 108 masked out


def test_visibility_scalars_small_blocks_and_relaxed_atomics():
    """Round 6 (issue 52): a plain load of fewer elements than the program has threads is made by several threads
    per element (keys None), so it meets any store since the barrier, the storing lane's included; an atomic write
    with no barrier after it is a write of its lane: a plain load of it elsewhere, or a plain store to it from
    another lane, is a race; atomics among themselves are not; an atomic read meets only plain stores."""
    from types import SimpleNamespace as Handle
    import numpy as np
    from rewards.triton.memory import Visibility, _bytes

    def handle(addresses):
        return Handle(data=np.array(addresses, np.uint64), get_element_ty=lambda: Handle(primitive_bitwidth=32))

    def store(v, program, addresses, atomic=False):
        ptrs = handle(addresses)
        value = Handle(data=np.zeros(ptrs.data.shape, np.float32))
        if atomic:
            v.update(program, _bytes(ptrs, None), v.lanes(ptrs, None)[0])
        else:
            v.store(program, _bytes(ptrs, None), *v.lanes(ptrs, None, value))

    def load(v, program, addresses, atomic=False):
        ptrs = handle(addresses)
        v.load(program, _bytes(ptrs, None), v.lanes(ptrs, None, broadcast=not atomic)[0], atomic)
        return v.clash

    block = [100, 104, 108, 112]
    v = Visibility(threads=4)
    store(v, 0, [100])
    assert load(v, 0, [100], atomic=True) is None                     # thread 0 reads its own scalar atomically
    assert load(v, 0, [100]) == (0, 100, "load")                      # every thread loads a scalar
    v = Visibility(threads=4)
    store(v, 1, block)
    assert load(v, 1, block) is None                                  # 4 elements, 4 threads: one each
    v = Visibility(threads=8)
    store(v, 2, block)
    assert load(v, 2, block) == (2, 100, "load")                      # 4 elements, 8 threads: replicated
    v = Visibility(threads=4)
    store(v, 3, block, atomic=True)
    assert load(v, 3, block) is None and load(v, 3, block[::-1]) == (3, 112, "load")
    v = Visibility(threads=4)
    store(v, 4, block, atomic=True)
    store(v, 4, block[::-1], atomic=True)                              # atomics of two lanes: coherent
    v.barrier(4)
    assert v.clash is None
    store(v, 4, block)
    store(v, 4, block[::-1], atomic=True)                              # a plain store and another lane's atomic
    v.barrier(4)
    assert v.clash == (4, 100, "update")
    v = Visibility(threads=4)
    store(v, 5, block, atomic=True)
    assert load(v, 5, block[::-1], atomic=True) is None                # an atomic read meets only plain stores


def test_the_semantics_global_is_reserved():
    """A file binding the global through which rewritten kernels reach _Semantics would run its own code there."""
    from rewards.triton.language import _triton_reads
    assert "_triton_gpu_semantics" in _triton_reads()
    code = LEAKY_BUILTIN_MAX.replace("class ModelNew", "_triton_gpu_semantics = tl.constexpr(1)\n\n\nclass ModelNew")
    assert lint(code)[0] == "lint_name", lint(code)
