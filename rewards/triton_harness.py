"""The side of the Triton reward that runs inside the sandbox; rewards/triton_kernel.py ships this file into
the scratch dir and runs `import triton_harness; triton_harness.main()`. Imports only stdlib, torch, triton.

job.json: {"role": "reference" | "candidate", "seeds": [int], "device": "cpu" | "cuda", "time": bool}
reference role: reads reference.py, writes ref.pt   = {"cases": [case], "ms": float | None}
    case = {"seed", "init_inputs": list, "inputs": list, "state": state_dict of Model, "outputs": [tensor]}
candidate role: reads inputs.pt = {"cases": [case without "outputs"]} BEFORE importing candidate.py, writes
    result.pt = {"outputs": [[tensor]], "inputs_after": [list], "launches": [per forward call, rounded down],
                 "torch_ops": [str], "ms": float | None}  or  {"error": reason, "detail": str}
On CUDA the timed calls (3 warm-up + 20) run under the same audit and launch count as the checked call.
The parent (triton_kernel.py) compares; nothing here decides the score, so a candidate that tampers with this
process can at most forge its own outputs, which it still has to get right without ever seeing the reference.
"""

import importlib
import json
import statistics

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import InterpreterError
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops a forward may run: allocation, views, copies, casts (also all the interpreter itself runs to move
# kernel arguments to numpy and back, and all the autotuner's benchmarking runs). Anything else (add, mm, relu,
# sum, ...) means torch computed part of the answer, wherever it was called from (forward, a hook, a kernel
# body under the interpreter).
_ALLOWED_ATEN = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like new_ones
full full_like new_full fill_ zero_ arange copy_ clone contiguous _to_copy to detach alias view _unsafe_view
reshape _reshape_alias as_strided t transpose permute expand unsqueeze squeeze flatten slice select split unbind
narrow set_ lift_fresh _local_scalar_dense resolve_conj resolve_neg is_same_size
""".split())
_TIME_WARMUP, _TIME_ITERS = 3, 20


class _Audit(TorchDispatchMode):
    """Records the aten ops outside _ALLOWED_ATEN run while active, and counts kernel launches."""

    def __init__(self):
        super().__init__()
        self.ops, self.launches = set(), 0

    @classmethod
    def _should_skip_dynamo(cls):
        return False      # torch's default wraps __torch_dispatch__ in dynamo.disable: a 1.7 s import, no use here

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in _ALLOWED_ATEN:
            self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def _hook_launches(audit: _Audit) -> None:
    """Count real kernel launches (jit on GPU, interpreter on CPU; autotuners end in one of these)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def wrap(cls):
        run = cls.run

        def counted_run(self, *args, **kwargs):
            audit.launches += not kwargs.get("warmup", False)
            return run(self, *args, **kwargs)
        cls.run = counted_run

    wrap(JITFunction)
    wrap(InterpretedFunction)


def _outputs(out) -> list:
    """Model output (tensor or tuple/list of tensors) as a list of detached CPU copies; raises TypeError else."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise TypeError(f"forward returned {type(out).__name__}, not tensors")
    return [o.detach().to("cpu", copy=True) for o in outs]


def _to(device, values) -> list:
    return [v.to(device, copy=True) if isinstance(v, torch.Tensor) else v for v in values]


def _time_ms(fn) -> float:
    """Median CUDA-event time of fn() in ms over _TIME_ITERS runs after _TIME_WARMUP."""
    for _ in range(_TIME_WARMUP):
        fn()
    times = []
    for _ in range(_TIME_ITERS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _error(exc: BaseException) -> dict:
    """Reason for an exception raised by candidate code: compile_error (the Triton compiler, or the interpreter
    failing inside a kernel, which the compiler would have rejected on a GPU), oom, or runtime_error."""
    detail = f"{type(exc).__name__}: {exc}"[:2000]
    if isinstance(exc, (CompilationError, InterpreterError)):
        return {"error": "compile_error", "detail": detail}
    if isinstance(exc, MemoryError) or "allocate" in str(exc) or "out of memory" in str(exc):
        return {"error": "oom", "detail": detail}
    return {"error": "runtime_error", "detail": detail}


def _run_reference(job: dict) -> dict:
    module = importlib.import_module("reference")
    cases, times = [], []
    for seed in job["seeds"]:
        torch.manual_seed(seed)
        inputs, init_inputs = module.get_inputs(), module.get_init_inputs()
        torch.manual_seed(seed)
        model = module.Model(*init_inputs)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model = model.to(job["device"])
        args = _to(job["device"], inputs)
        with torch.no_grad():
            outputs = _outputs(model(*args))
            if job["time"]:
                times.append(_time_ms(lambda: model(*args)))
        cases.append({"seed": seed, "init_inputs": init_inputs, "inputs": inputs, "state": state,
                      "outputs": outputs})
    return {"cases": cases, "ms": statistics.median(times) if times else None}


def _run_candidate(job: dict) -> dict:
    data = torch.load("inputs.pt", weights_only=True)      # before any candidate code runs
    audit = _Audit()
    _hook_launches(audit)
    try:
        module = importlib.import_module("candidate")
    except Exception as e:      # anything the candidate's module body raises is its own failure
        return {"error": "compile_error", "detail": f"{type(e).__name__}: {e}"[:2000]}
    result = {"outputs": [], "inputs_after": [], "launches": [], "torch_ops": [], "ms": None}
    times = []
    for case in data["cases"]:
        try:
            torch.manual_seed(case["seed"])
            model = module.ModelNew(*case["init_inputs"])
            own = model.state_dict()
            if own.keys() == case["state"].keys() and all(own[k].shape == v.shape for k, v in case["state"].items()):
                model.load_state_dict(case["state"])       # same parameters as the reference Model
            model = model.to(job["device"])
            args = _to(job["device"], case["inputs"])
            before = audit.launches
            with torch.no_grad(), audit:      # the timed calls too: each must launch and none may compute in torch
                result["outputs"].append(_outputs(model(*args)))
                if job["time"]:
                    times.append(_time_ms(lambda: model(*args)))
            calls = 1 + (_TIME_WARMUP + _TIME_ITERS if job["time"] else 0)
            result["launches"].append((audit.launches - before) // calls)     # launches per call, rounded down
            result["inputs_after"].append(_to("cpu", args))
        except Exception as e:      # a candidate failure of any kind is scored, never propagated
            return _error(e)
    result["torch_ops"] = sorted(audit.ops)
    result["ms"] = statistics.median(times) if times else None
    return result


def main() -> None:
    with open("job.json") as f:
        job = json.load(f)
    if job["role"] == "reference":
        torch.save(_run_reference(job), "ref.pt")
    else:
        torch.save(_run_candidate(job), "result.pt")
