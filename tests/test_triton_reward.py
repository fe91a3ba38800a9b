"""rewards/triton/kernel.py: code extraction, the linter, adversarial candidates (each scores 0 with its
reason and leaves the machine unharmed), and every shipped task solution scoring 1.0 under TRITON_INTERPRET=1.

Sandboxed runs go through a 2-worker thread pool (each is a subprocess); the reference of a task runs once
per pytest process (rewards.triton.kernel caches it).
"""
import os
import socket
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from data.triton_tasks import CATEGORIES, build_prompt, load_tasks, task_rows
from rewards import sandbox
from rewards.sandbox import OPT_OUT_ENV, bwrap_problem, running_sandboxes
from rewards.code import extract_code
from rewards.triton.kernel import execute, lint, triton_reward

ROOT = Path(__file__).resolve().parents[1]
TASKS = {t["name"]: t for t in load_tasks()}
WORKERS = 2
TIMEOUT_S = 60
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")

HEADER = """import torch
import torch.nn as nn
import triton
import triton.language as tl
"""
RELU_KERNEL = HEADER + """

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)
"""
LAUNCH = """out = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
return out"""


def relu_candidate(forward: str, prelude: str = "", kernel: str = RELU_KERNEL) -> str:
    """A ModelNew for the `relu` task: kernel, then prelude (module level), then forward's body."""
    return kernel + prelude + "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()" \
        "\n\n    def forward(self, x):\n" + textwrap.indent(forward, " " * 8) + "\n"


LINEAR_RELU_TORCH_MATMUL = RELU_KERNEL + """

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        h = {hidden}
        out = torch.empty_like(h)
        relu_kernel[(triton.cdiv(h.numel(), 256),)](h, out, h.numel(), BLOCK=256)
        return out
"""

MUL_ADD_TORCH_MUL = HEADER + """

@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y, z):
        t = x * y
        out = torch.empty_like(z)
        add_kernel[(triton.cdiv(z.numel(), 256),)](t, z, out, z.numel(), BLOCK=256)
        return out
"""

# a kernel body that computes with torch through a global dict of tensors: works only in the interpreter
STASH_CANDIDATE = relu_candidate(
    "out = torch.empty_like(x)\nSTASH['x'], STASH['out'] = x, out\n"
    "relu_kernel[(1,)](x, out, 1, BLOCK=16)\nreturn out",
    "\n\nSTASH = {}\n", kernel=HEADER + """

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    STASH["out"].copy_(STASH["x"].clamp(min=0))
""")

# A kernel that launches (the linter wants one) but the forward that computes with torch and, on the third
# call, writes the result file of the harness before 8e99526's fix itself and leaves: scored 1.0 there.
# `{torch}` is how the candidate reaches the torch module past the linter.
FORGE_OLD_RESULT = RELU_KERNEL + """
{prelude}
SEEN = []


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.t = {torch}

    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(1,)](x, out, 1, BLOCK=16)
        SEEN.append([x, self.t.nn.ReLU()(x)])
        if len(SEEN) == 3:
            self.t.save({{"outputs": [[s[1]] for s in SEEN], "inputs_after": [[s[0]] for s in SEEN],
                         "launches": [1, 1, 1], "torch_ops": [], "ms": 1e-06}}, "result.pt")
            self.t.os.abort()
        return out
"""
# the linter reads a comment; Python, decoding utf-7, runs the hidden lines (a forward in torch that forges the
# result file). No "+" in the visible code: utf-7 would decode it.
UTF7_CANDIDATE = """# -*- coding: utf-7 -*-
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr):
    tl.store(out_ptr, tl.load(x_ptr))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.zeros_like(x)
        relu_kernel[(1,)](x, out)
        return out

# fast path ahead +AAo-import os+AAo-SEEN = []+AAo-def fwd(self, x):+AAo-    SEEN.append([x, torch.relu(x)])+AAo-    if len(SEEN) == 3:+AAo-        torch.save({"outputs": [[s[1]] for s in SEEN], "inputs_after": [[s[0]] for s in SEEN], "launches": [1, 1, 1], "torch_ops": [], "ms": None}, "result.pt")+AAo-        os._exit(0)+AAo-    return x+AAo-ModelNew.forward = fwd
"""
# __init__ can regenerate the inputs when it runs right after the seed that made them (before the fix: the
# same seed as get_inputs), and cache the answer; forward copies it out
INIT_CACHES_ANSWER = RELU_KERNEL + """

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = (torch.randn(8, 100) * 3).clamp(min=0)

    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(1,)](x, out, 1, BLOCK=16)
        out.copy_(self.cache)
        return out
"""
# __init__ reads the inputs from the harness's frame through a running generator's frame (no dunder needed)
FRAME_SPY = RELU_KERNEL + """

BOX = []


def peek():
    yield BOX[-1].gi_frame.f_back.f_back


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        BOX.append(peek())
        frame = next(BOX[-1])
        self.cache = frame.f_locals["case"]["inputs"][0].clamp(min=0)

    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(1,)](x, out, 1, BLOCK=16)
        out.copy_(self.cache)
        return out
"""
# the numpy method loaded as an attribute and called later: numpy computes, torch sees nothing
NUMPY_METHOD_LOADED = relu_candidate("""out = torch.empty_like(x)
relu_kernel[(1,)](x, out, 1, BLOCK=16)
read, write = x.numpy, out.numpy
v = read()
write()[...] = v * (v > 0)
return out""")
# pure Python on scalars read out of the tensor, written back by indexing (only views and fills reach aten)
PYTHON_SCALARS = relu_candidate("""out = torch.empty_like(x)
relu_kernel[(1,)](x, out, 1, BLOCK=16)
xf, of = x.view(-1), out.view(-1)
for i in range(x.numel()):
    v = float(xf[i])
    of[i] = v if v > 0 else 0.0
return out""")
# numpy inside the kernel body, through the interpreter's array behind a Triton value (no GPU would compile it)
KERNEL_NUMPY_HANDLE = relu_candidate(
    "out = torch.empty_like(x)\nrelu_kernel[(1,)](x, out, x.numel(), BLOCK=1024)\nreturn out", kernel=HEADER + """

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x * 0.0
    y.handle.data[...] = x.handle.data.clip(0)
    tl.store(out_ptr + offs, y, mask=mask)
""")
TORCH_MODULE_AS_VALUE = relu_candidate("tmp = torch.empty_like(x)\nrelu_kernel[(1,)](x, tmp, 1, BLOCK=16)\n"
                                       "return NN.ReLU()(x)", "\n\nNN = torch.nn\n")

# (id, task, candidate code, expected reason). Each scores 0.0 through triton_reward.
ADVERSARIAL = [
    ("kernel_defined_never_launched", "relu", relu_candidate("return torch.relu(x)"), "lint_kernel_not_launched"),
    ("hard_op_in_torch_matmul", "linear_relu",
     LINEAR_RELU_TORCH_MATMUL.format(hidden="x @ self.linear.weight.T + self.linear.bias"), "lint_torch_op"),
    ("hard_op_in_torch_nn_module", "linear_relu", LINEAR_RELU_TORCH_MATMUL.format(hidden="self.linear(x)"),
     "lint_torch_op"),
    ("hard_op_in_torch_operator_runtime", "mul_add", MUL_ADD_TORCH_MUL, "lint_torch_op"),
    ("try_except_torch_fallback", "relu",
     relu_candidate("try:\n" + textwrap.indent(LAUNCH, "    ") + "\nexcept Exception:\n    return torch.relu(x)"),
     "lint_try_except"),
    ("inputs_mutated_in_place", "relu",
     relu_candidate("relu_kernel[(triton.cdiv(x.numel(), 256),)](x, x, x.numel(), BLOCK=256)\nreturn x"),
     "input_mutated"),
    ("reference_module_imported", "relu", relu_candidate(LAUNCH, "from reference import Model"), "lint_import"),
    ("reference_model_copied_and_called", "relu",
     relu_candidate("tmp = torch.empty_like(x)\nrelu_kernel[(1,)](x, tmp, 1, BLOCK=256)\nreturn Model()(x)",
                    "\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"),
     "lint_torch_op"),
    ("stale_memory_instead_of_output", "relu",
     relu_candidate("tmp = torch.empty_like(x)\nrelu_kernel[(triton.cdiv(x.numel(), 256),)](x, tmp, x.numel(), "
                    "BLOCK=256)\nreturn torch.empty_like(x)"), "wrong_output"),
    ("allclose_monkeypatched", "relu",
     relu_candidate("out = torch.empty_like(x)\nrelu_kernel[(1,)](x, out, 1, BLOCK=256)\nreturn out",
                    "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True"), "lint_monkeypatch"),
    ("timer_monkeypatched", "relu",
     relu_candidate(LAUNCH, "torch.cuda.Event.elapsed_time = lambda self, end: 1e-6"), "lint_monkeypatch"),
    ("sys_exit_before_checks", "relu", relu_candidate("sys.exit(0)", "import sys"), "lint_import"),
    ("os_exit_before_checks", "relu", relu_candidate("os._exit(0)", "import os"), "lint_forbidden_call"),
    ("builtin_exit_before_checks", "relu", relu_candidate("exit(0)"), "lint_forbidden_call"),
    ("infinite_loop", "relu", relu_candidate("while True:\n    pass\n" + LAUNCH), "timeout"),
    ("fork_bomb", "relu", relu_candidate("while True:\n    os.fork()", "import os"), "lint_import"),
    ("memory_bomb_tensor", "relu", relu_candidate("big = torch.empty(1 << 40)\n" + LAUNCH), "oom"),
    ("memory_bomb_list", "relu", relu_candidate("big = [0] * (1 << 36)\n" + LAUNCH), "oom"),
    ("write_outside_scratch", "relu",
     relu_candidate(LAUNCH, f"open('{ROOT}/pwned.txt', 'w').write('x')"), "lint_forbidden_call"),
    ("read_reference_solution_from_disk", "relu",
     relu_candidate(LAUNCH, f"exec(open('{ROOT}/data/triton_tasks/solutions/activations/relu.py').read())"),
     "lint_forbidden_call"),
    ("read_reference_with_pathlib", "relu",
     relu_candidate(LAUNCH, f"import pathlib\nSRC = pathlib.Path('{ROOT}/data/triton_tasks').read_text()"),
     "lint_import"),
    ("network_socket", "relu",
     relu_candidate(LAUNCH, "import socket\nsocket.create_connection(('127.0.0.1', 22))"), "lint_import"),
    ("getattr_hides_torch_op", "relu", relu_candidate("return getattr(torch, 're' + 'lu')(x)\n" + LAUNCH),
     "lint_forbidden_call"),
    ("dunder_escape", "relu",
     relu_candidate("f = x.__class__.__mro__[1].__dict__['relu']\n" + LAUNCH), "lint_forbidden_call"),
    ("call_override_does_the_work", "relu",
     relu_candidate(LAUNCH) + "\n    def __call__(self, x):\n        return torch.relu(x)\n", "lint_forbidden_call"),
    ("functional_import", "relu", relu_candidate("return F.relu(x)\n" + LAUNCH, "import torch.nn.functional as F"),
     "lint_torch_op"),
    ("tensor_method_does_the_work", "relu", relu_candidate("tmp = x.clamp_min(0)\n" + LAUNCH), "lint_torch_op"),
    ("dead_branch_launch_torch_operators", "relu",
     relu_candidate("if x.numel() < 0:\n" + textwrap.indent(LAUNCH, "    ") + "\nreturn x * (x > 0)"),
     "lint_torch_op"),
    ("dead_branch_launch_no_kernel_runs", "relu",
     relu_candidate("if x.numel() < 0:\n" + textwrap.indent(LAUNCH, "    ") + "\nreturn torch.zeros_like(x)"),
     "lint_kernel_not_launched"),
    ("star_import", "relu", relu_candidate(LAUNCH, "from torch import *"), "lint_import"),
    ("torch_compile_makes_the_kernel", "relu",
     relu_candidate("return FAST(x)\n" + LAUNCH, "FAST = torch.compile(torch.relu)"), "lint_torch_op"),
    ("cpp_extension_kernel", "relu",
     relu_candidate(LAUNCH, "from torch.utils.cpp_extension import load_inline\n"
                            "EXT = load_inline('r', cpp_sources='')"), "lint_torch_op"),
    ("kernel_body_reads_global_dict", "relu", STASH_CANDIDATE, "lint_forbidden_call"),
    # ---- issue 16: attribute chains, attributes loaded as values, what Python runs vs what was linted ----
    ("chain_torch_nn_functional_torch", "relu",
     FORGE_OLD_RESULT.format(prelude="", torch="torch.nn.functional.torch"), "lint_torch_op"),
    ("chain_typing_sys_modules", "relu",
     FORGE_OLD_RESULT.format(prelude="import typing\nT = typing.sys.modules['torch']", torch="T"), "lint_import"),
    ("chain_triton_knobs_importlib", "relu",
     FORGE_OLD_RESULT.format(prelude="", torch="triton.knobs.importlib.import_module('torch')"), "lint_import"),
    ("torch_module_as_value", "relu", TORCH_MODULE_AS_VALUE, "lint_torch_op"),
    ("numpy_method_loaded_then_called", "relu", NUMPY_METHOD_LOADED, "lint_torch_op"),
    ("coding_declaration_utf7", "relu", UTF7_CANDIDATE, "lint_encoding"),
    ("lone_surrogate_in_code", "relu", relu_candidate(LAUNCH, "# \ud800"), "lint_encoding"),
    ("kernel_numpy_through_handle", "relu", KERNEL_NUMPY_HANDLE, "lint_monkeypatch"),
    # ---- issue 16: the audit covers __init__ and Python scalars; inputs can't be predicted or read ----
    ("init_regenerates_inputs_caches_answer", "relu", INIT_CACHES_ANSWER, "wrong_output"),
    ("init_reads_inputs_from_caller_frame", "relu", FRAME_SPY, "lint_forbidden_call"),
    ("python_scalar_compute_in_forward", "relu", PYTHON_SCALARS, "lint_torch_op"),
    ("import_time_error", "relu", relu_candidate(LAUNCH, "BLOCK = 1 // 0"), "compile_error"),
    ("bad_kernel", "relu",
     relu_candidate(LAUNCH, kernel=RELU_KERNEL.replace("tl.maximum(x, 0.0)", "tl.maximum(x, tl.arange(0, 100))")),
     "gpu_compile"),
    ("unknown_triton_language_name", "relu",
     relu_candidate(LAUNCH, kernel=RELU_KERNEL.replace("tl.maximum(x, 0.0)", "tl.no_such_op(x)")), "lint_import"),
    ("no_triton_at_all", "relu", "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                                 "        return x\n", "lint_no_kernel"),
    ("prose_only", "relu", "I cannot write this kernel.", "syntax_error"),
    ("empty", "relu", "```python\n```", "no_code"),
]
STATIC_REASONS = {"syntax_error", "no_code"} | {r for *_, r in ADVERSARIAL if r.startswith("lint_")}


def _score_all(jobs):
    """[(score, info)] for [(completion, task_name, timeout_s)], 2 at a time; the first job of each task goes
    first so that the task's reference is computed once and cached before the rest."""
    first = {}
    for i, (_, task, _) in enumerate(jobs):
        first.setdefault(task, i)
    order = sorted(range(len(jobs)), key=lambda i: i not in first.values())
    with ThreadPoolExecutor(WORKERS) as pool:
        scored = dict(zip(order, pool.map(lambda i: triton_reward(jobs[i][0], TASKS[jobs[i][1]], timeout_s=jobs[i][2]),
                                          order)))
    return [scored[i] for i in range(len(jobs))]


@pytest.fixture(scope="module")
def adversarial_results():
    timeouts = {"infinite_loop": 8}
    jobs = [(f"Here is my kernel:\n```python\n{code}```\n", task, timeouts.get(cid, TIMEOUT_S))
            for cid, task, code, _ in ADVERSARIAL]
    return dict(zip([c[0] for c in ADVERSARIAL], _score_all(jobs)))


def test_at_least_15_adversarial_candidates():
    assert len(ADVERSARIAL) >= 15 and len({c[0] for c in ADVERSARIAL}) == len(ADVERSARIAL)


@pytest.mark.parametrize("cid, task, code, reason", ADVERSARIAL, ids=[c[0] for c in ADVERSARIAL])
def test_adversarial_scores_zero_with_reason(adversarial_results, cid, task, code, reason):
    score, info = adversarial_results[cid]
    if bwrap_problem() and info["reason"] == "no_sandbox":
        pytest.skip(f"passes the linter, runs only with isolation: {bwrap_problem()}")
    assert (score, info["reason"]) == (0.0, reason), info
    runtime_op = {"hard_op_in_torch_operator_runtime": "aten.mul", "dead_branch_launch_torch_operators": "aten.",
                  "python_scalar_compute_in_forward": "aten._local_scalar_dense"}.get(cid)
    if runtime_op:
        assert info["detail"].startswith("runtime") and runtime_op in info["detail"], info
    static = {"torch_module_as_value": "torch.nn as a value", "chain_typing_sys_modules": "typing.sys",
              "chain_triton_knobs_importlib": "triton.knobs", "numpy_method_loaded_then_called": ".numpy",
              "kernel_body_reads_global_dict": "uses .copy_", "coding_declaration_utf7": "utf-7",
              "kernel_numpy_through_handle": ".handle", "init_reads_inputs_from_caller_frame": "generators"}.get(cid)
    if static:
        assert static in info["detail"] and not info["detail"].startswith("runtime"), info


def test_adversarial_left_no_trace(adversarial_results):
    assert not (ROOT / "pwned.txt").exists()
    assert running_sandboxes(wait_s=10) == []


# ---- execution alone (linter bypassed): the sandbox and the parent-side comparison still hold ----
HOST_TMP = Path("/tmp") / f"triton-reward-leak-{os.getpid()}"


def _listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    return server


# writes a result file in the harness's format (lint bypassed: the candidate can import anything) and leaves
FORGE = """
import json, os
from safetensors.torch import save
SEEN = []
META = {"error": "runtime_error", "detail": "", "phase": None, "n_out": [], "launches": [], "runs": [1, 1, 1],
        "violations": [], "ms": None}


def forge(meta, tensors={}):
    open("result.bin", "wb").write(save(tensors, metadata={"meta": json.dumps(meta)}))
    os._exit(0)
"""
EXEC_ONLY = [
    ("sys_exit_in_forward", relu_candidate("sys.exit(0)", "import sys"), {"early_exit"}),
    ("os_exit_at_import", relu_candidate(LAUNCH, "import os\nos._exit(0)"), {"early_exit"}),
    ("patched_comparisons_still_wrong", relu_candidate(
        "tmp = torch.empty_like(x)\nrelu_kernel[(1,)](x, tmp, 1, BLOCK=256)\nreturn torch.zeros_like(x)",
        "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True"), {"wrong_output"}),
    ("forged_result_file", relu_candidate("""SEEN.append(x.clone())
if len(SEEN) == 3:
    t = {f"out.{k}.0": torch.zeros_like(a) for k, a in enumerate(SEEN)}
    t.update({f"after.{k}.0": a for k, a in enumerate(SEEN)})
    forge(dict(META, error=None, n_out=[1, 1, 1], launches=[1, 1, 1]), t)
return x""", FORGE), {"wrong_output"}),
    # ---- issue 16: forged verdicts, and result files that broke the reward ----
    ("old_result_error_ok_then_system_exit", relu_candidate(
        LAUNCH, "torch.save({'error': 'ok'}, 'result.pt')\nraise SystemExit(0)"), {"early_exit"}),
    ("old_result_reason_is_a_list", relu_candidate(
        LAUNCH, "import os\ntorch.save({'error': ['ok']}, 'result.pt')\nos._exit(0)"), {"early_exit"}),
    ("forged_error_ok", relu_candidate(LAUNCH, FORGE + "forge(dict(META, error='ok'))"), {"crash"}),
    ("forged_error_is_a_list", relu_candidate(LAUNCH, FORGE + "forge(dict(META, error=['ok']))"), {"crash"}),
    ("forged_timing", relu_candidate(LAUNCH, FORGE + "forge(dict(META, error=None, ms=-1.0, n_out=[1] * 3, launches=[1] * 3))"), {"crash"}),
    ("forged_deeply_nested_detail", relu_candidate(LAUNCH, FORGE + """meta = json.dumps(dict(META, detail=None))
big = meta.replace('"detail": null', '"detail": ' + '[' * 100000 + ']' * 100000)
open("result.bin", "wb").write(save({}, metadata={"meta": big}))
os._exit(0)"""), {"crash"}),
    ("pickle_whose_str_explodes", relu_candidate(LAUNCH, """import os
a = ["x" * 100]
for _ in range(22):
    a = [a, a]
torch.save({"error": "runtime_error", "detail": a}, "result.pt")
os._exit(0)"""), {"early_exit"}),
    ("deep_directory_tree", relu_candidate(LAUNCH, """import os
top = f"d{len(os.listdir('.'))}"    # a new tree each time the module runs (every further run of a case reloads it)
os.mkdir(top)
os.chdir(top)
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
os.chdir("/scratch")"""), {"ok"}),
    ("torch_in_a_second_thread", relu_candidate("""out = torch.empty_like(x)
relu_kernel[(1,)](x, out, 1, BLOCK=16)
t = threading.Thread(target=lambda: out.copy_(torch.relu(x)))
t.start()
t.join()
return out""", "import threading"), {"runtime_error"}),
    ("numpy_does_the_work", relu_candidate("""out = torch.empty_like(x)
relu_kernel[(1,)](x, out, 1, BLOCK=16)
out.numpy()[...] = np.maximum(x.numpy(), 0)
return out""", "import numpy as np"), {"lint_torch_op"}),
    ("base_exception_in_forward", relu_candidate("raise KeyboardInterrupt"), {"runtime_error"}),
    ("read_reference_solution", relu_candidate(
        LAUNCH, f"exec(open('{ROOT}/data/triton_tasks/solutions/activations/relu.py').read())"), {"compile_error"}),
    ("fork_bomb", relu_candidate("while True:\n    os.fork()", "import os"), {"runtime_error", "crash", "timeout"}),
]


@pytest.fixture(scope="module")
def exec_only_results():
    server = _listener()
    port = server.getsockname()[1]
    writes = f"""
for path in ['{ROOT}/pwned.txt', '/root/pwned.txt', '{HOST_TMP}', '/usr/pwned.txt']:
    try:
        open(path, 'w').write('x')
    except OSError:
        pass
import socket
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2)
    CONNECTED = True
except OSError:
    CONNECTED = False
"""
    cases = EXEC_ONLY + [("writes_and_network_contained", relu_candidate(LAUNCH, writes), {"ok"})]
    timeouts = {"fork_bomb": 15}      # it keeps forking at the process limit until the wall timeout
    cases.append(("kernel_body_torch_via_global_runtime", STASH_CANDIDATE, {"gpu_compile"}))
    def timed(case):
        t0 = time.monotonic()
        return execute(case[1], TASKS["relu"], timeout_s=timeouts.get(case[0], TIMEOUT_S)), time.monotonic() - t0

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(timed, cases))
    with pytest.raises(socket.timeout):
        server.accept()         # nobody connected
    server.close()
    return {c[0]: (r, c[2], wall) for c, (r, wall) in zip(cases, results)}


@needs_bwrap
@pytest.mark.parametrize("cid", [c[0] for c in EXEC_ONLY] + ["writes_and_network_contained",
                                                              "kernel_body_torch_via_global_runtime"])
def test_execution_alone_contains_hostile_code(exec_only_results, cid):
    (score, info), expected, wall = exec_only_results[cid]
    assert type(info["reason"]) is str and info["reason"] in expected, info
    assert score == (1.0 if expected == {"ok"} else 0.0)
    assert wall < 30, wall          # a result file that is expensive to read costs nothing here
    detail = {"numpy_does_the_work": "Tensor.numpy", "kernel_body_torch_via_global_runtime": "global variables",
              "forged_error_ok": "error is not one of", "forged_timing": "ms"}.get(cid)
    if detail:
        assert detail in info["detail"], info
    assert not (ROOT / "pwned.txt").exists() and not HOST_TMP.exists() and not Path("/usr/pwned.txt").exists()
    assert running_sandboxes(wait_s=10) == []


# ---- the linter, no execution ----
@pytest.mark.parametrize("variant", [
    "import triton.language as tl\nfrom triton import jit\n" + RELU_KERNEL.replace("@triton.jit", "@jit"),
    RELU_KERNEL.replace("@triton.jit", "@triton.autotune(configs=[triton.Config({})], key=['n'])\n@triton.jit"),
])
def test_linter_accepts_variants(variant):
    assert lint(relu_candidate(LAUNCH, kernel=variant)) == (None, "")


def test_linter_follows_helpers_and_autograd_functions():
    helper = relu_candidate("return launch(x)", "\n\ndef launch(x):\n" + textwrap.indent(LAUNCH, "    ") + "\n")
    assert lint(helper) == (None, "")
    fn = relu_candidate("return Relu.apply(x)", "\n\nclass Relu(torch.autograd.Function):\n    @staticmethod\n"
                        "    def forward(ctx, x):\n" + textwrap.indent(LAUNCH, " " * 8) + "\n")
    assert lint(fn) == (None, "")
    bad_helper = helper.replace("return out", "return out.sum()")
    assert lint(bad_helper)[0] == "lint_torch_op"


def test_linter_allows_torch_in_init_only():
    init = relu_candidate(LAUNCH).replace("super().__init__()",
                                          "super().__init__()\n        self.w = torch.randn(3).exp()")
    assert lint(init) == (None, "")
    assert lint(relu_candidate("y = torch.exp(x)\n" + LAUNCH))[0] == "lint_torch_op"


def test_reward_never_raises_on_junk():
    for junk in [None, 3, "", "```python\n" + "(" * 5000 + "\n```", "\x00\x01", "def f(:\n", "x = 1  # \udcff",
                 "# coding: rot13\nx = 1", "# coding: no-such-codec\nx = 1"]:
        score, info = triton_reward(junk, TASKS["relu"])
        assert score == 0.0 and info["reason"] in ("no_code", "syntax_error", "lint_encoding"), (junk, info)
        assert type(info["reason"]) is str and "time_s" in info
    score, info = triton_reward(TASKS["relu"]["solution"], {"name": "relu"})      # a task without its reference
    assert (score, info["reason"], info["detail"]) == (0.0, "reward_error", "KeyError"), info


def test_no_isolation_fails_closed(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap not installed (apt-get install bubblewrap)")
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    score, info = triton_reward(TASKS["relu"]["solution"], TASKS["relu"])
    assert (score, info["reason"]) == (0.0, "no_sandbox") and "bubblewrap" in info["detail"], info
    score, info = triton_reward(relu_candidate("return torch.relu(x)"), TASKS["relu"])     # lint needs no sandbox
    assert (score, info["reason"]) == (0.0, "lint_kernel_not_launched"), info


def test_linter_exact_paths():
    """Allowed names are exact: a module reached through an allowed one is never allowed, whatever follows;
    functools and __future__ are not importable, typing only for a few names in annotations (issue 29: they
    evaluate strings)."""
    ok = ["tl.math.exp", "tl.extra.libdevice.tanh", "triton.next_power_of_2(x.numel())", "math.sqrt(2.0)",
          "tl.float32"]
    bad = {"triton.knobs.os": "lint_import", "triton.runtime.driver": "lint_import", "math.floor.mro": "lint_import",
           "torch.nn.functional.torch.relu": "lint_torch_op", "torch.cuda.os": "lint_torch_op",
           "torch.Tensor.numpy": "lint_torch_op", "T = torch": "lint_torch_op", "print(tl)": "lint_import",
           "tl.math.exp(x)": "lint_launch", "typing.get_type_hints": "lint_import", "typing.Optional": "lint_import",
           "torch.cuda.is_available()": "lint_device"}      # issue 52: a device query (language L9)
    prelude = "import math\nimport typing\n"
    for expr in ok:
        assert lint(relu_candidate(f"y = {expr}\n" + LAUNCH, prelude)) == (None, ""), expr
    for expr, reason in bad.items():
        assert lint(relu_candidate(f"{expr}\n" + LAUNCH, prelude))[0] == reason, expr
    for imp in ["import functools", "from __future__ import annotations", "from typing import sys",
                "from triton import knobs", "from triton.language import core", "import triton.runtime"]:
        assert lint(relu_candidate(LAUNCH, imp))[0] == "lint_import", imp
    init = relu_candidate(LAUNCH).replace("super().__init__()", "super().__init__()\n        self.f = {}")
    assert lint(init.format("torch.nn.Linear(3, 3)")) == (None, "")
    assert lint(init.format("torch.nn.functional.torch.relu"))[0] == "lint_torch_op"
    assert lint(init.format("torch.zeros(3).numpy"))[0] == "lint_torch_op"      # bridges: not even in __init__


# ---- tasks, prompts, export ----
def test_task_set():
    tasks = load_tasks()
    assert len(tasks) >= 40
    assert {t["category"] for t in tasks} == set(CATEGORIES)
    assert len({t["name"] for t in tasks}) == len(tasks)
    for t in tasks:
        assert "class Model(" in t["reference_code"] and "def get_inputs" in t["reference_code"]
        assert "def get_init_inputs" in t["reference_code"] and "class ModelNew(" in t["solution"]
        assert lint(t["solution"]) == (None, ""), t["name"]


def test_prompt_and_rows(tmp_path):
    from data.triton_tasks.build import export
    relu = TASKS["relu"]
    prompt = build_prompt(relu["reference_code"])
    assert relu["reference_code"] in prompt and "ModelNew" in prompt and "Triton" in prompt
    export(tmp_path)
    import json
    rl = [json.loads(line) for line in open(tmp_path / "rl_train.jsonl")]
    sft = [json.loads(line) for line in open(tmp_path / "sft.jsonl")]
    assert len(rl) == len(sft) == len(TASKS) and rl == task_rows()
    assert all(r["task"] == "triton" and r["prompt"] and r["reference_code"] for r in rl)
    assert extract_code(sft[0]["completion"]) == load_tasks()[0]["solution"].strip()


@needs_bwrap
@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["first_per_category", "all"])
def test_every_reference_solution_scores_one(every):
    """Shipped solutions through the full reward (the same path as training), 2 sandboxes at a time: the first
    task of each category, and (slow: about 3.5 s of CPU per task) all of them."""
    tasks = load_tasks()
    if not every:
        tasks = [next(t for t in tasks if t["category"] == c) for c in CATEGORIES]
    rows = {r["name"]: r for r in task_rows(sft=True)}
    results = _score_all([(rows[t["name"]]["completion"], t["name"], TIMEOUT_S) for t in tasks])
    failed = {t["name"]: info for t, (score, info) in zip(tasks, results) if score != 1.0}
    assert not failed, failed
    assert all(info["max_abs_err"] < 1e-4 for _, info in results)


@needs_bwrap
def test_wrong_solution_scores_zero():
    """The full check can fail: a solution with a wrong constant."""
    sol = TASKS["gelu"]["solution"].replace("0.7071067811865476", "0.7")
    score, info = triton_reward(sol, TASKS["gelu"])
    assert (score, info["reason"]) == (0.0, "wrong_output"), info
    assert torch.isfinite(torch.tensor(info["max_abs_err"]))


@needs_bwrap
def test_eval_call_and_exec_accuracy(tmp_path):
    from rewards.triton.eval import score_completions, summarize
    rows = [{"name": "relu", "completion": TASKS["relu"]["solution"]},
            {"name": "relu", "completion": dict((c[0], c[2]) for c in ADVERSARIAL)["stale_memory_instead_of_output"]},
            {"name": "relu", "completion": relu_candidate("return torch.relu(x)")},
            {"name": "no_such_task", "completion": "x"}]
    summary = summarize(rows, score_completions(rows, TASKS))
    assert (summary["n"], summary["call"], summary["exec"]) == (4, 0.5, 0.25), summary
    assert summary["reasons"] == {"ok": 1, "wrong_output": 1, "lint_kernel_not_launched": 1, "unknown_task": 1}
    assert summary["fast_1"] is None and summary["speedup"] is None          # no CUDA timings on CPU


def test_eval_command_line(tmp_path):
    import json
    import subprocess
    import sys
    path = tmp_path / "completions.jsonl"
    path.write_text(json.dumps({"name": "relu", "completion": "no code here"}) + "\n")
    out = subprocess.run([sys.executable, "-m", "rewards.triton.eval", str(path), "--out", str(tmp_path / "s.jsonl")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert (last["n"], last["call"], last["exec"], last["reasons"]) == (1, 0.0, 0.0, {"syntax_error": 1})
    assert json.loads((tmp_path / "s.jsonl").read_text())["info"]["reason"] == "syntax_error"
