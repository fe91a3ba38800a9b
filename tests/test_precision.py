"""precision (model.compute_dtype) and the unsharded CPU world of one (model.build_model's shard): auto's rule; the
unwrapped module gives FSDP2's fp32 gradients bit for bit; its bf16 compute (CPU autocast, the fused head on bf16
operands) stays within bf16's tolerance of the fp32 log-probs and gradients, with fp32 weights and gradients."""
import pytest
import torch

import model

ROWS = [model.Row([5, 6, 7, 8], [9, 10, 11]), model.Row([5, 6, 7, 8], [12, 13]), model.Row([3, 4], [20, 21, 22, 23])]


def test_auto_is_bf16_on_cuda_and_on_bf16_cpus_from_hidden_512(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert model.compute_dtype("fp32", cuda, 4096) == torch.float32
    assert model.compute_dtype("bf16", cpu, 64) == torch.bfloat16
    assert model.compute_dtype("auto", cuda, 64) == torch.bfloat16
    for bf16_cpu in (True, False):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: bf16_cpu)
        assert model.compute_dtype("auto", cpu, 128) == torch.float32
        assert model.compute_dtype("auto", cpu, 896) == (torch.bfloat16 if bf16_cpu else torch.float32)


def grads_and_logps(policy):
    logps = model.response_logprobs(policy, ROWS, torch.device("cpu"), 1.0)
    torch.cat([lp * (i + 1) for i, lp in enumerate(logps)]).sum().backward()
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
             for n, p in policy.named_parameters()}
    return torch.cat(logps).detach(), grads


def test_unsharded_world_of_one_matches_fsdp2(world_of_one, tiny):
    from torch.distributed.tensor import DTensor
    path, cpu = str(tiny / "model"), torch.device("cpu")
    plain = model.build_model(path, cpu, trainable=True, precision="fp32")
    sharded = model.build_model(path, cpu, trainable=True, precision="fp32", shard=True)
    assert not any(isinstance(p, DTensor) for p in plain.parameters())
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    lp, g = grads_and_logps(plain)
    lp_s, g_s = grads_and_logps(sharded)
    assert torch.equal(lp, lp_s) and all(torch.equal(g[n], g_s[n]) for n in g), "fp32: not bit for bit"
    bf16 = model.build_model(path, cpu, trainable=True, precision="bf16")
    lp_b, g_b = grads_and_logps(bf16)
    assert all(p.dtype == torch.float32 for p in bf16.parameters()) and all(x.dtype == torch.float32
                                                                            for x in g_b.values())
    assert 0 < (lp_b - lp).abs().max() < 0.05, (lp_b - lp).abs().max()  # computed in bf16: about 2^-8 relative
    for n in g:
        err = float((g_b[n] - g[n]).norm() / g[n].norm().clamp(min=1e-12))
        assert err < 5e-2, (n, err)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_unsharded_checkpoint_round_trip(world_of_one, tiny, precision):
    """DCP's state dict of the unwrapped policy and its fused AdamW loads back exactly."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    import trainer
    cfg = trainer.Config(lr=1e-3)
    policy = model.build_model(str(tiny / "model"), torch.device("cpu"), trainable=True, precision=precision)
    optim, _ = model.make_optimizer(cfg, policy, 3)
    grads_and_logps(policy)
    optim.step()
    m, o = get_state_dict(policy, optim)
    m, o = {k: v.clone() for k, v in m.items()}, {"state": {k: {s: t.clone() for s, t in v.items()}
                                                            for k, v in o["state"].items()},
                                                  "param_groups": o["param_groups"]}
    saved = {n: p.detach().clone() for n, p in policy.named_parameters()}
    grads_and_logps(policy)
    optim.step()
    set_state_dict(policy, optim, model_state_dict=m, optim_state_dict=o)
    assert all(torch.equal(p, saved[n]) for n, p in policy.named_parameters())
