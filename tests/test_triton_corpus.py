"""Issue 29: the fourth-round adversarial corpus (tests/triton_corpus/attacks.py) against the Triton reward, and
unit tests of the pieces behind it.

Every attack scores 0.0 with its reason and detail through triton_reward (mode "reward") or execute (mode
"execute": the linter bypassed), the reward returns, and this process's peak RSS grows by less than 50 MB while
it runs (result files forged to make the parent allocate included). An attack's `before` is what the code before
the fix (c0600cc) gave it: "1.0" where it scored. The static attacks and one run per class of the others are in
the quick suite; the remaining runs are slow. Unit tests: the allowed names reach no module, evaluator or frame
(class 7), the linter's copy of Triton's source re-read matches Triton's own (3), a forged result parses in small
memory (6), the harness refuses launch arguments a kernel body could compute with (4), the linter's time grows
linearly with the code.
"""
import importlib
import inspect
import json
import sys
import tracemalloc
import types
from collections import Counter

import pytest
import torch

from data.triton_tasks import load_tasks
from rewards.triton import language as triton_language
from rewards.sandbox import bwrap_problem, running_sandboxes
from rewards.triton.kernel import Malformed, _parse_result, _reference, execute, lint, triton_reward
from triton_corpus.attacks import ATTACKS
from triton_corpus.honest import HONEST

TASKS = {t["name"]: t for t in load_tasks()}
QUICK_RUNS = {"tensor_as_constexpr_run", "grid_lambda_computes_run", "singledispatch_launders_tolist_run",
              "n_out_in_the_millions", "result_file_of_60_mb"}
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")


def _status_mb(field: str) -> float:
    line = next(line for line in open("/proc/self/status") if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def _is_static(attack) -> bool:
    return attack.mode == "reward" and lint(attack.code)[0] is not None


def test_corpus_covers_every_class():
    counts = Counter(a.cls for a in ATTACKS)
    assert set(counts) == set(range(1, 8)) and min(counts.values()) >= 3, counts
    assert len({a.id for a in ATTACKS}) == len(ATTACKS)
    scored_before = {a.cls for a in ATTACKS if a.before == "1.0" or a.before.endswith("MB")}
    assert scored_before == set(range(1, 8))
    assert QUICK_RUNS <= {a.id for a in ATTACKS if not _is_static(a)}


@pytest.fixture(scope="module")
def warm():
    """The references of the corpus's tasks and the linter's imports, before any memory is measured."""
    for task in {a.task for a in ATTACKS}:
        _reference(TASKS[task]["reference_code"], "cpu")
    lint(HONEST[0][2])


@needs_bwrap
@pytest.mark.parametrize("attack", [a if _is_static(a) or a.id in QUICK_RUNS else pytest.param(a, marks=pytest.mark.slow)
                                    for a in ATTACKS], ids=[a.id for a in ATTACKS])
def test_attack_scores_zero_with_its_reason(warm, attack):
    base = _status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")          # resets VmHWM, the peak RSS
    run = triton_reward if attack.mode == "reward" else execute
    score, info = run(attack.code, TASKS[attack.task], timeout_s=60)
    assert (score, info["reason"]) == (0.0, attack.reason), info
    assert attack.detail in info["detail"], info
    assert _status_mb("VmHWM") - base < 50
    assert running_sandboxes(wait_s=10) == []


def _resolve(name: str):
    value = importlib.import_module(name.split(".")[0])
    for part in name.split(".")[1:]:
        value = getattr(value, part)
    return value


def test_allowed_names_reach_no_module_evaluator_or_frame():
    """Class 7: what accepted code can name. Every allowed API name is a torch / triton / math object (or one of
    the typing names kept for annotations), none a module or a string evaluator; the allowed builtins evaluate nothing and are not among the globals Triton's
    interpreter injects (so an injected name can't shadow one)."""
    import builtins
    import functools
    import typing
    import triton.runtime.interpreter as interpreter
    evaluators = {id(v) for v in [builtins.eval, builtins.exec, builtins.compile, builtins.getattr, builtins.setattr,
                                  builtins.__import__, builtins.open, builtins.globals, builtins.vars, builtins.locals,
                                  typing.get_type_hints, typing.ForwardRef, functools.singledispatch, sys._getframe,
                                  inspect.stack, inspect.currentframe, importlib.import_module]}
    for name in sorted(triton_language._api_names() | triton_language._TORCH_INIT_OK | triton_language._TYPING):
        value = _resolve(name)
        assert not isinstance(value, types.ModuleType) and id(value) not in evaluators, name
        if callable(value):
            assert (getattr(value, "__module__", None) or "").split(".")[0] in ("torch", "triton", "math", "typing"), name
    assert all(callable(getattr(builtins, n)) for n in triton_language._BUILTINS)
    assert not {n for n in triton_language._BUILTINS if id(getattr(builtins, n)) in evaluators}
    assert triton_language._BUILTINS.isdisjoint(vars(interpreter))


def _kernels_as_triton_reads_them(code: str, tmp_path, name: str) -> dict:
    """{kernel name: (interpreter source, GPU source)} from Triton's own classes, the module imported from a file
    (the test process has no TRITON_INTERPRET: @triton.jit builds JITFunctions without compiling)."""
    from triton.runtime.interpreter import FunctionRewriter
    from triton.runtime.jit import JITFunction
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = {}
    for value in vars(module).values():
        while hasattr(value, "fn") and not isinstance(value, JITFunction):
            value = value.fn                      # Autotuner / Heuristics -> JITFunction
        if isinstance(value, JITFunction):
            rewriter = FunctionRewriter(value.fn)
            lines, _ = inspect.getsourcelines(value.fn)
            rewriter.def_lineno = rewriter._find_def(lines)
            found[value.fn.__name__] = (rewriter._prepare_source(lines), value.src)
    return found


def test_linter_reads_the_text_triton_compiles(tmp_path):
    """Class 3: the linter's copy of Triton's source re-read (_triton_sources) gives what Triton's interpreter and
    GPU compiler take, for every honest kernel and the docstring attack, where Triton's text is not the linted
    function."""
    import ast
    attack = next(a for a in ATTACKS if a.id == "def_line_in_the_docstring")
    for i, (cid, _, code) in enumerate([*HONEST, (attack.id, None, attack.code)]):
        tree = ast.parse(code)
        lines = code.splitlines(keepends=True)
        triton_reads = _kernels_as_triton_reads_them(code, tmp_path, f"candidate_{i}")
        assert triton_reads, cid
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in triton_reads):
            assert triton_language._triton_sources(lines, fn)[1:] == triton_reads[fn.name], (cid, fn.name)
            same = triton_language._same_function(triton_reads[fn.name][0], triton_language._undecorated(fn))
            assert same == (cid != attack.id), (cid, fn.name)


def test_linter_time_grows_linearly():
    """The linter runs in the trainer's process without a timeout: 2000 launches with a named grid and 2000
    unbound names (about 100 KB each) lint in seconds (quadratic passes took minutes)."""
    import time
    from triton_corpus.attacks import LAUNCH_NOTHING, relu_model
    launches = relu_model("out = torch.empty_like(x)\ngrid = (1,)\n" +
                          "copy_kernel[grid](x, out, 0, BLOCK=16)\n" * 2000 + "return out")
    unbound = relu_model(LAUNCH_NOTHING + "".join(f"y{i} = z{i}\n" for i in range(2000)) + "return out")
    for code, reason in [(launches, None), (unbound, "lint_name")]:
        t0 = time.monotonic()
        assert lint(code)[0] == reason
        assert time.monotonic() - t0 < 10


def _cases(n_cases: int = 3) -> list:
    return [{"inputs": [torch.zeros(8, 100)], "outputs": [torch.zeros(8, 100)]} for _ in range(n_cases)]


def _blob(meta: dict, tensors: dict = None) -> bytes:
    from safetensors.torch import save
    full = {"error": None, "detail": "", "phase": None, "n_out": [1] * 3, "launches": [1] * 3, "runs": [1] * 3,
            "violations": [], "ms": None, **meta}
    return save(tensors or {}, metadata={"meta": json.dumps(full)})


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    except Malformed:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_forged_result_parses_in_small_memory():
    """Class 6: counts and byte ranges are checked against the reference before anything is built from them."""
    for blob in [_blob({"n_out": [1_000_000] * 3}), _blob({"n_out": [64, 64, 64]}),
                 _blob({}, {f"out.{k}.0": torch.zeros(1 << 20) for k in range(3)})]:
        assert _peak_bytes(lambda: _parse_result(blob, _cases())) < 1 << 20
        with pytest.raises(Malformed):
            _parse_result(blob, _cases())
    good = {f"{p}.{k}.0": torch.full((8, 100), float(k)) for p in ("out", "after") for k in range(3)}
    parsed = _parse_result(_blob({}, good), _cases())
    assert [o[0][0][0, 0].item() for o in parsed["outputs"]] == [0.0, 1.0, 2.0]


def test_harness_refuses_kernel_arguments_a_body_could_compute_with():
    """Class 4: what may reach a kernel body is a tensor (never as tl.constexpr), an exact scalar, a Triton dtype or
    constexpr of one, or a tuple of those."""
    import triton.language as tl
    from rewards.triton.harness import _argument_problem

    class Int(int):
        pass

    for value, constexpr in [(torch.zeros(2), False), (torch.nn.Parameter(torch.zeros(2)), False), (3, True),
                             (0.5, False), ("relu", True), (None, False), (tl.float16, True), (tl.constexpr(4), True),
                             ((1, 2), False), ((torch.zeros(1), 2), False)]:
        assert _argument_problem(value, constexpr) is None, value
    for value, constexpr in [(torch.zeros(2), True), ([torch.zeros(2)], False), ({"x": 1}, False), (Int(3), True),
                             (tl.constexpr(torch.zeros(2)), False), ((torch.zeros(1),), True), (object(), False)]:
        assert _argument_problem(value, constexpr), value
