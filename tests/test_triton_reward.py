"""rewards/triton_kernel.py: code extraction, the linter, adversarial candidates (each scores 0 with its
reason and leaves the machine unharmed), and every shipped task solution scoring 1.0 under TRITON_INTERPRET=1.

Sandboxed runs go through a 2-worker thread pool (each is a subprocess); the reference of a task runs once
per pytest process (rewards.triton_kernel caches it).
"""
import os
import socket
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from data.triton_tasks import CATEGORIES, build_prompt, load_tasks, task_rows
from rewards.sandbox import bwrap_problem, running_sandboxes
from rewards.code import extract_code
from rewards.triton_kernel import execute, lint, triton_reward

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
    ("os_exit_before_checks", "relu", relu_candidate("os._exit(0)", "import os"), "lint_import"),
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
    ("torch_inside_kernel_body_runtime", "relu", relu_candidate(
        "out = torch.empty_like(x)\nSTASH['x'], STASH['out'] = x, out\n"
        "relu_kernel[(1,)](x, out, 1, BLOCK=16)\nreturn out",
        "\n\nSTASH = {}\n", kernel=HEADER + """

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    STASH["out"].copy_(STASH["x"].clamp(min=0))
"""), "lint_torch_op"),
    ("import_time_error", "relu", relu_candidate(LAUNCH, "BLOCK = undefined_name"), "compile_error"),
    ("bad_kernel", "relu",
     relu_candidate(LAUNCH, kernel=RELU_KERNEL.replace("tl.maximum(x, 0.0)", "tl.no_such_op(x)")), "compile_error"),
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
    assert (score, info["reason"]) == (0.0, reason), info
    runtime_op = {"hard_op_in_torch_operator_runtime": "aten.mul", "dead_branch_launch_torch_operators": "aten.",
                  "torch_inside_kernel_body_runtime": "aten.clamp"}.get(cid)
    if runtime_op:
        assert info["detail"].startswith("runtime") and runtime_op in info["detail"], info


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


EXEC_ONLY = [
    ("sys_exit_in_forward", relu_candidate("sys.exit(0)", "import sys"), {"early_exit"}),
    ("os_exit_at_import", relu_candidate(LAUNCH, "import os\nos._exit(0)"), {"early_exit"}),
    ("patched_comparisons_still_wrong", relu_candidate(
        "tmp = torch.empty_like(x)\nrelu_kernel[(1,)](x, tmp, 1, BLOCK=256)\nreturn torch.zeros_like(x)",
        "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True"), {"wrong_output"}),
    ("forged_result_file", relu_candidate(LAUNCH, """import os
cases = torch.load("inputs.pt")["cases"]
torch.save({"outputs": [[torch.zeros(8, 100)]] * 3, "inputs_after": [c["inputs"] for c in cases],
            "launches": [1, 1, 1], "torch_ops": [], "ms": None}, "result.pt")
os._exit(0)"""), {"wrong_output"}),
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
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda c: execute(c[1], TASKS["relu"], timeout_s=timeouts.get(c[0], TIMEOUT_S)),
                                cases))
    with pytest.raises(socket.timeout):
        server.accept()         # nobody connected
    server.close()
    return {c[0]: (r, c[2]) for c, r in zip(cases, results)}


@needs_bwrap
@pytest.mark.parametrize("cid", [c[0] for c in EXEC_ONLY] + ["writes_and_network_contained"])
def test_execution_alone_contains_hostile_code(exec_only_results, cid):
    (score, info), expected = exec_only_results[cid]
    assert info["reason"] in expected, info
    assert score == (1.0 if expected == {"ok"} else 0.0)
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
    for junk in [None, 3, "", "```python\n" + "(" * 5000 + "\n```", "\x00\x01", "def f(:\n"]:
        score, info = triton_reward(junk, TASKS["relu"])
        assert score == 0.0 and info["reason"] in ("no_code", "syntax_error"), (junk, info)
        assert "time_s" in info


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


def test_every_reference_solution_scores_one():
    """Shipped solutions through the full reward (the same path as training), 2 sandboxes at a time: all of
    them with TRITON_ALL_TASKS=1 (about 3.5 s of CPU per task), else the first task of each category."""
    tasks = load_tasks()
    if os.environ.get("TRITON_ALL_TASKS") != "1":
        tasks = [next(t for t in tasks if t["category"] == c) for c in CATEGORIES]
    rows = {r["name"]: r for r in task_rows(sft=True)}
    results = _score_all([(rows[t["name"]]["completion"], t["name"], TIMEOUT_S) for t in tasks])
    failed = {t["name"]: info for t, (score, info) in zip(tasks, results) if score != 1.0}
    assert not failed, failed
    assert all(info["max_abs_err"] < 1e-4 for _, info in results)


def test_wrong_solution_scores_zero():
    """The full check can fail: a solution with a wrong constant."""
    sol = TASKS["gelu"]["solution"].replace("0.7071067811865476", "0.7")
    score, info = triton_reward(sol, TASKS["gelu"])
    assert (score, info["reason"]) == (0.0, "wrong_output"), info
    assert torch.isfinite(torch.tensor(info["max_abs_err"]))


def test_eval_call_and_exec_accuracy(tmp_path):
    from rewards.triton_eval import score_completions, summarize
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
    out = subprocess.run([sys.executable, "-m", "rewards.triton_eval", str(path), "--out", str(tmp_path / "s.jsonl")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert (last["n"], last["call"], last["exec"], last["reasons"]) == (1, 0.0, 0.0, {"syntax_error": 1})
    assert json.loads((tmp_path / "s.jsonl").read_text())["info"]["reason"] == "syntax_error"
