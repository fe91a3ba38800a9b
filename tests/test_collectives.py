"""NCCL has no CPU backend: on a CUDA run a CPU tensor handed to a collective raises ("No backend type associated
with device type cpu"), a failure gloo (the CPU tests' backend) never shows. So the rule is structural and tested
here on CPU: product code reaches tensor collectives only through model.py's helpers, each of which takes the run's
device and reduces there; and the kernels refuse inputs from two device types with a message naming both."""
import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import model
from kernels import (discounted_returns, fused_linear_ppo_loss, implicit_prm_rewards, linear_token_logprobs,
                     ppo_loss, token_logprobs)

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = [ROOT / f for f in ("trainer.py", "model.py", "launch.py", "report.py", "config.py")] + [
    p for d in ("kernels", "rollout", "rewards", "data") for p in sorted((ROOT / d).rglob("*.py"))]
TENSOR_COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                      "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv",
                      "isend", "irecv"}


def test_tensor_collectives_only_in_helpers_that_take_the_device():
    found = []
    for path in PRODUCT:
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and \
                        call.func.attr in TENSOR_COLLECTIVES and getattr(call.func.value, "id", None) == "dist":
                    found.append((path.relative_to(ROOT).as_posix(), fn.name, [a.arg for a in fn.args.args]))
    assert found, "the scan found no collective at all: it is broken"
    for where, name, args in found:
        assert where == "model.py" and "device" in args, \
            f"{where}:{name} calls a tensor collective; use model.py's helpers (they take the run's device)"


def test_helpers_reduce_on_the_device_they_are_given(monkeypatch):
    """A stand-in for NCCL: collectives accept only tensors on the run's device (meta here, as CUDA would be); the
    helpers must move a host tensor there before reducing."""
    seen = []

    def all_reduce(t, op=None, group=None):
        if t.device.type != "meta":
            raise RuntimeError(f"No backend type associated with device type {t.device.type}")
        seen.append(t.device.type)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    out = model.sum_over_ranks(torch.ones(3), torch.device("meta"))
    assert out.device.type == "meta" and out.dtype == torch.float64 and seen == ["meta"]


def meta(x):
    return x.to("meta")


@pytest.mark.parametrize("name", ["token_logprobs", "ppo_loss", "implicit_prm_rewards", "discounted_returns",
                                  "fused_linear_ppo_loss", "linear_token_logprobs"])
def test_kernels_refuse_inputs_on_two_device_types(name):
    g = torch.Generator().manual_seed(0)
    B, T, V, H = 2, 5, 11, 8
    logp, old, m = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g), torch.ones(B, T)
    h, w, tgt = torch.randn(B * T, H, generator=g), torch.randn(V, H, generator=g), torch.randint(0, V, (B * T,))
    calls = {"token_logprobs": lambda: token_logprobs(torch.randn(B * T, V), meta(tgt)),
             "ppo_loss": lambda: ppo_loss(logp, meta(old), torch.ones(B), m),
             "implicit_prm_rewards": lambda: implicit_prm_rewards(logp, meta(old), m, 0.05),
             "discounted_returns": lambda: discounted_returns(logp, meta(m)),
             "fused_linear_ppo_loss": lambda: fused_linear_ppo_loss(h, w, tgt, meta(old.flatten()), old.flatten(),
                                                                    torch.ones(B * T)),
             "linear_token_logprobs": lambda: linear_token_logprobs(h, meta(w), tgt)}
    with pytest.raises(ValueError, match="different devices.*cpu.*meta"):
        calls[name]()
