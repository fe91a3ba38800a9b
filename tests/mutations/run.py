"""Planted bugs: each is applied to a temporary copy of the working tree, the tests meant to catch it run there,
and the report says which ones the suite caught. Every one must be caught. `make mutants` runs it (not make test).

    .venv/bin/python tests/mutations/run.py [NAME ...]      # all, or some by name; -l lists them

A mutant is (name, file, the exact text it replaces (once), the replacement, the pytest selection that must fail).
A stale mutant (its text is no longer in the file, or is there twice) is reported as an error, not as caught.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MUTANTS = [
    # trainer: the RL step
    ("advantage sign flipped", "trainer.py", "r.adv = a.expand(len(r.response))", "r.adv = (-a).expand(len(r.response))",
     ["tests/test_learning.py", "-k", "grpo"]),
    ("advantages on the wrong trajectories", "trainer.py", "for r, a in zip(rows, estimator(rewards, group_size)):",
     "for r, a in zip(rows, estimator(rewards, group_size).roll(1)):", ["tests/test_learning.py", "-k", "grpo"]),
    ("loss scale ignores the ranks", "trainer.py", "* torch.cat(corr) * run.world", "* torch.cat(corr)",
     ["tests/test_trainer_phases.py", "-k", "same_batch"]),
    ("old log-probs overwrite earlier stages", "trainer.py",
     "need[i].old_logprobs += logp[len(need[i].old_logprobs):].tolist()", "need[i].old_logprobs = logp.tolist()",
     ["tests/test_wiring.py", "tests/test_trainer_phases.py", "-k", "cross_stage"]),
    ("a resumed buffer forgets its old log-probs (recomputed by the resumed policy)", "rollout/copris.py",
     '[Trajectory(**t) for t in g["samples"]]', '[Trajectory(**{**t, "old_logprobs": []}) for t in g["samples"]]',
     ["tests/test_wiring.py", "-k", "cross_stage"]),
    ("update ignores the old log-probs it must supply", "trainer.py", "wt, ref, torch.isnan(old) | fresh))",
     "wt, ref, fresh))", ["tests/test_trainer_phases.py", "-k", "supplies or same_batch"]),
    ("correction weights by the inverse ratio (old and engine log-probs swapped)", "trainer.py",
     "run.correct(r.old_logp[m],", "(lambda old, roll: run.correct(roll, old))(r.old_logp[m],",
     ["tests/test_wiring.py", "-k", "correction"]),
    ("correction without old log-probs computed before the update", "trainer.py",
     'upfront = cfg.mini_batches > 1 or cfg.correction.mode != "none" or', "upfront = cfg.mini_batches > 1 or",
     ["tests/test_wiring.py", "-k", "correction"]),
    ("two mini-batches without old log-probs computed before the update", "trainer.py",
     'upfront = cfg.mini_batches > 1 or cfg.correction.mode', "upfront = cfg.correction.mode",
     ["tests/test_wiring.py", "-k", "mini_batch"]),
    ("PRIME ref=policy without old log-probs computed before the update", "trainer.py",
     '(cfg.prime.enabled and cfg.prime.ref == "policy")', "False", ["tests/test_wiring.py", "-k", "resume"]),
    ("checkpoint keeps the CPU generators only (not CUDA's)", "trainer.py", "mine = rng_state(self.device)",
     'mine = rng_state(torch.device("cpu"))', ["tests/test_wiring.py", "-k", "cuda"]),
    ("resume leaves the LR schedule at its start", "trainer.py", '        self.sched.load_state_dict(shared["sched"])\n',
     "", ["tests/test_wiring.py", "-k", "resume"]),
    ("masked tokens stay in the denominator", "trainer.py", "kept = torch.cat(corr) > 0", "kept = torch.cat(corr) >= 0",
     ["tests/test_mismatch.py", "-k", "denominator"]),
    ("PRM state left out of checkpoints", "trainer.py", 'sharded["prime"] = self.advantages.state_dict()',
     'sharded["prime"] = {}', ["tests/test_resume.py", "-k", "prime"]),
    ("used run_dir overwritten silently", "launch.py", "    if not used or cfg.overwrite or continues(run_dir, ckpt):",
     "    if True:", ["tests/test_lifecycle.py", "-k", "refused_and_nothing"]),
    # config keys on their way from the command line to the computation (tests/test_wiring.py)
    ("staleness_cap not passed to the scheduler", "trainer.py", "staleness_cap=cfg.copris.staleness_cap,",
     "staleness_cap=None,", ["tests/test_wiring.py", "-k", "staleness"]),
    ("GRPO's scale_std not passed by the trainer", "trainer.py",
     "grpo_advantages(r, k, cfg.scale_std, reduce=every_rank)", "grpo_advantages(r, k, reduce=every_rank)",
     ["tests/test_wiring.py", "-k", "rollout"]),
    ("update clips with clip_low and clip_high swapped", "trainer.py", "w, cfg.clip_low, cfg.clip_high,",
     "w, cfg.clip_high, cfg.clip_low,", ["tests/test_wiring.py", "-k", "rollout"]),
    ("update's log-probs at temperature 1 whatever the sampling temperature", "trainer.py",
     "cfg.kl_coef, cfg.temperature, cfg.entropy_coef,", "cfg.kl_coef, 1.0, cfg.entropy_coef,",
     ["tests/test_wiring.py", "-k", "rollout"]),
    ("tools.max_obs_tokens and tools.tool_steps swapped on their way to the episodes", "trainer.py",
     "c.max_turns, c.max_obs_tokens, c.tool_steps,", "c.max_turns, c.tool_steps, c.max_obs_tokens,",
     ["tests/test_wiring.py", "-k", "tools"]),
    ("tool calls run with the default wall limit and worker count whatever tools.* says", "trainer.py",
     "c.timeout_s, c.workers)", "30.0, 2)", ["tests/test_wiring.py", "-k", "timeout_and_workers"]),
    # model: packing
    ("packed positions do not restart per row", "model.py", "pos += range(P)\n", "pos += range(len(ids) - P, len(ids))\n",
     ["tests/test_packing.py"]),
    ("shared-prompt responses restart at 0", "model.py", "pos += range(P, P + L)", "pos += range(L)",
     ["tests/test_packing.py"]),
    ("shared-prompt rows predict their first token from the wrong position", "model.py",
     "keep[i] = [last, *range(len(ids), len(ids) + L - 1)][:L]", "keep[i] = [len(ids) - 1, *range(len(ids), len(ids) + L - 1)][:L]",
     ["tests/test_trainer_phases.py", "-k", "packed"]),
    # PRIME
    ("PRIME update=before stops recomputing rewards", "rewards/prime.py", "if self.recompute:", "if False:",
     ["tests/test_prime.py"]),
    ("PRIME's beta left at its default", "rewards/prime.py", "(a, b, m, self.p.beta)", "(a, b, m, 0.05)",
     ["tests/test_wiring.py", "-k", "prime_keys"]),
    ("PRIME's outcome advantage weighted by process_coef", "rewards/prime.py", "self.p.gamma, self.p.outcome_coef,",
     "self.p.gamma, self.p.process_coef,", ["tests/test_wiring.py", "-k", "prime_keys"]),
    ("PRIME's process returns undiscounted whatever prime.gamma", "rewards/prime.py", "self.p.gamma, self.p.outcome_coef,",
     "1.0, self.p.outcome_coef,", ["tests/test_wiring.py", "-k", "prime_keys"]),
    ("PRIME's rewards at temperature 1 whatever the sampling temperature", "rewards/prime.py",
     "response_logprobs(self.model, batch, self.device, self.cfg.temperature)",
     "response_logprobs(self.model, batch, self.device, 1.0)", ["tests/test_wiring.py", "-k", "prime_keys"]),
    ("PRIME whitening over this rank only", "rewards/advantages.py", "_moments(m.sum(), adv.sum(), (adv * adv).sum(), reduce)",
     "_moments(m.sum(), adv.sum(), (adv * adv).sum(), None)", ["tests/test_trainer_phases.py", "-k", "whitening"]),
    # advantages
    ("GRPO std biased", "rewards/advantages.py", "std = r.std(dim=1, keepdim=True)",
     "std = r.std(dim=1, keepdim=True, unbiased=False)", ["tests/test_advantages_loss.py"]),
    ("RLOO baseline includes the sample itself", "rewards/advantages.py",
     "((g.sum(1, keepdim=True) - g) / (group_size - 1))", "(g.sum(1, keepdim=True) / group_size).expand_as(g)",
     ["tests/test_advantages_loss.py", "tests/test_prime_advantages.py"]),
    # evaluation and rewards
    ("pass@k counts the greedy completion among the k samples", "report.py",
     "passed = sum(x >= 1.0 for x in s[1:])", "passed = sum(x >= 1.0 for x in s)", ["tests/test_eval_metrics.py"]),
    ("mean@k not divided by k", "report.py", 'f"{prefix}mean@{k}": t[1] / (n * k)', 'f"{prefix}mean@{k}": t[1] / n',
     ["tests/test_eval_metrics.py"]),
    ("math reward length cap removed", "rewards/math.py", "if m and len(m.group(1)) > MAX_ANSWER_CHARS:",
     "if False:", ["tests/test_math_reward.py"]),
    ("math reward's gold-text shortcut skips the comparison", "rewards/math.py",
     "if pred.strip() == answer.strip():", "if True:", ["tests/test_math_reward.py"]),
    ("math answers compared at 1 decimal (1.2 accepted for 1.23)", "rewards/math.py",
     "verify(list(gold_expr), pred_expr,", "verify(list(gold_expr), pred_expr, float_rounding=1,",
     ["tests/test_math_reward.py", "-k", "wrong"]),
    ("math reward bracket depth cap removed", "rewards/math.py", "if brackets > MAX_DEPTH:", "if False:",
     ["tests/test_math_reward.py"]),
    # rollout
    ("CoPRIS buffer drops versions", "rollout/copris.py", '"samples": [vars(t) for t in g.samples]',
     '"samples": [{**vars(t), "versions": []} for t in g.samples]', ["tests/test_copris_unit.py"]),
    ("stale restart keeps the old sampling's old log-probs", "rollout/copris.py",
     "t.tokens, t.logprobs, t.versions, t.old_logprobs = [], [], [], []", "t.tokens, t.logprobs, t.versions = [], [], []",
     ["tests/test_copris_unit.py", "-k", "stale_restart"]),
    ("staleness counted from the newest token, not the first", "rollout/copris.py",
     "version - t.versions[0] > self.staleness_cap", "version - t.versions[-1] > self.staleness_cap",
     ["tests/test_copris_unit.py", "-k", "first_token"]),
    ("CoPRIS resumes without reducing max_tokens", "rollout/copris.py", "engine.sampling(self._limit(t) - len(t.tokens),",
     "engine.sampling(self._limit(t),", ["tests/test_copris_unit.py"]),
    ("ranks draw the same prompts", "data/rows.py", "idx = int(order[i * self.groups + self.group])",
     "idx = int(order[i * self.groups])", ["tests/test_copris.py", "-k", "disjoint"]),
    ("mismatch TIS weight not truncated", "rollout/mismatch.py", "return _d(old, roll).exp().clamp(max=C).float()",
     "return _d(old, roll).exp().float()", ["tests/test_mismatch.py", "-k", "formulas"]),
    ("Seq-TIS weight from the geometric mean, not the product of the token ratios", "rollout/mismatch.py",
     "rho = seq_log_ratio(old, roll).exp()\n        return rho.clamp", "rho = geo_ratio(old, roll)\n        return rho.clamp",
     ["tests/test_mismatch.py", "-k", "formulas"]),
    # engine tensor parallel, LoRA
    ("TP rollout counts counted t times", "trainer.py", "rstats.new_tokens / t, off_policy", "rstats.new_tokens, off_policy",
     ["tests/test_e2e.py", "-k", "tensor_parallel"]),
    ("engine keeps its prefix cache after a weight push", "rollout/vllm_engine.py",
     "        self.llm.reset_prefix_cache()\n        self.holds_weights = True", "        self.holds_weights = True",
     ["tests/test_engine.py", "-k", "parity_and_tokenizer"]),
    ("LoRA reference keeps the adapter on", "trainer.py", "    with adapter_disabled(run.ref):\n",
     "    with torch.no_grad():\n", ["tests/test_lora.py", "-k", "reference"]),
    ("packed attention scatters the padding", "kernels/packed_attention.py",
     "src = write.flatten().nonzero()[:, 0]", "src = torch.arange(write.numel())",
     ["tests/test_packing.py", "-k", "sdpa"]),
    # kernels
    ("PPO upper clip uses clip_low", "kernels/ppo_loss.py", "pg2 = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)",
     "pg2 = -adv * ratio.clamp(1 - clip_low, 1 + clip_low)", ["tests/test_kernels.py", "-k", "ppo and torch"]),
    ("discounted returns off by one", "kernels/prm_reward.py", "G = torch.cat([G[:, :-d] + g * G[:, d:], G[:, -d:]], dim=1)",
     "G = torch.cat([G[:, :-d] + g * G[:, d:], 0 * G[:, -d:]], dim=1)",
     ["tests/test_kernels.py", "-k", "discounted", "tests/test_prime_advantages.py"]),
    # multi-turn episodes, GPU semantics, review fixes
    ("observation tokens trained on", "trainer.py",
     "corr = [(torch.ones(len(r.response)) if r.weight is None else r.weight) * model_tokens(r)",
     "corr = [(torch.ones(len(r.response)) if r.weight is None else r.weight)",
     ["tests/test_episodes.py", "-k", "observation_tokens"]),
    ("a level-2 sleep does not force the next push", "trainer.py",
     "stale = run.engine_version != run.policy_version or not run.engine.holds_weights",
     "stale = run.engine_version != run.policy_version", ["tests/test_gpu_semantics.py", "-k", "level2_sleep_makes"]),
    ("packed attention drops the sliding window", "kernels/packed_attention.py",
     "window = None if sliding_window is None else", "window = None if True else",
     ["tests/test_packing.py", "-k", "sliding"]),
    ("collective helper reduces where the tensor lies", "model.py",
     "out = t.detach().to(device=device, dtype=torch.float64, copy=True)", "out = t.detach().double().clone()",
     ["tests/test_collectives.py"]),
    ("kernels take inputs from two device types", "kernels/_common.py",
     "if isinstance(t, torch.Tensor) and t.device.type != x.device.type:", "if False:",
     ["tests/test_collectives.py", "-k", "two_device"]),
    ("LoRA dropout's perturbed forward supplies the old log-probs", "trainer.py",
     "\n        or (cfg.lora.rank > 0 and cfg.lora.dropout > 0)", "",
     ["tests/test_lora.py", "-k", "first_pass"]),
    ("numeric math answers go unconverted to the verifier", "rewards/math.py", "    answer = str(answer)\n", "",
     ["tests/test_math_reward.py", "-k", "numeric"]),
    ("resume overwrites what lies after its checkpoint", "launch.py",
     "            set_aside(run_dir, read_manifest(ckpt)[\"step\"], config)", "            pass",
     ["tests/test_lifecycle.py", "-k", "sets_aside"]),
    ("resume replaces config.yaml without setting it aside", "launch.py",
     "    replaced = old_config.exists() and not same_settings(old_config.read_text(), config)", "    replaced = False",
     ["tests/test_lifecycle.py", "-k", "config_it_replaces"]),
    ("a config key renamed in the dataclass, not in the docs' prose", "trainer.py", "    eval_every: int = 10",
     "    eval_interval: int = 10", ["tests/test_docs.py", "-k", "prose_are_config_keys"]),
    ("--resume=auto without a checkpoint starts over in a used run_dir", "launch.py",
     "    if not used or cfg.overwrite or continues(run_dir, ckpt):",
     "    if not used or cfg.overwrite or cfg.resume != \"off\":",
     ["tests/test_lifecycle.py", "-k", "complete_checkpoint or another_run_dirs"]),
    ("every rank loads the whole model", "model.py", "        if dist.get_rank() == 0:\n            model = AutoModelForCausalLM",
     "        if True:\n            model = AutoModelForCausalLM", ["tests/test_build_export.py"]),
    ("fused lm_head op ignores on_policy", "kernels/fused_linear.py",
     "old = old if onp is None else torch.where(onp, logp + old, old)", "old = old",
     ["tests/test_fused_linear.py"]),
    # tied embeddings and the weight push (issue: review fixes 4)
    ("ranks other than 0 leave their skeleton untied", "model.py", "            model.tie_weights()\n",
     "", ["tests/test_tied.py", "-k", "same_tied"]),
    ("the engine keeps the tied head it packed at start", "rollout/vllm_engine.py",
     "        self.llm.collective_rpc(refresh_tied_head)\n", "", ["tests/test_engine.py", "-k", "push_parity and tied"]),
    ("push maps the KV cache before the weights arrive", "rollout/vllm_engine.py", 'self.wake(("weights",))',
     "self.wake()", ["tests/test_gpu_semantics.py", "-k", "maps_the_weights"]),
    ("push gathers fp32, then casts", "model.py",
     "        t = p.detach() if dtype is None else p.detach().to(dtype)\n        yield name, t.full_tensor() if hasattr(t, \"full_tensor\") else t",
     "        t = p.full_tensor() if hasattr(p, \"full_tensor\") else p\n        yield name, t.detach() if dtype is None else t.detach().to(dtype)",
     ["tests/test_gpu_semantics.py", "-k", "push_dtype"]),
    ("no-grad forwards keep the root unsharded", "model.py", "            model.reshard()  #", "            pass  #",
     ["tests/test_gpu_semantics.py", "-k", "root_sharded"]),
    ("export without the generation config", "model.py", "tok, getattr(model, \"generation_config\", None))", "tok)",
     ["tests/test_build_export.py", "-k", "generation_config"]),
    # policy objectives (issue 37): each formula's planted bug, caught by the quick suite
    ("GSPO's sequence ratio from the sum of the log-ratios, not their mean", "kernels/fused_linear.py",
     "index_add_(0, seq, d) / n.clamp(min=1)).clamp(-20, 20)", "index_add_(0, seq, d)).clamp(-20, 20)",
     ["tests/test_objectives.py", "-k", "gspo"]),
    ("CISPO's clipped IS weight without the stop-gradient", "kernels/ppo_loss.py",
     "loss, clipped = -adv * w_is.detach() * logp, w_is != ratio", "loss, clipped = -adv * w_is * logp, w_is != ratio",
     ["tests/test_objectives.py", "-k", "cispo"]),
    ("DAPO's overlong penalty with its sign flipped", "rewards/advantages.py",
     "inside = ((max_len - buffer) - lengths.double()) / buffer", "inside = (lengths.double() - (max_len - buffer)) / buffer",
     ["tests/test_objectives.py", "-k", "overlong"]),
    ("Dr. GRPO's normaliser per sequence (its length), not constant", "kernels/ppo_loss.py",
     "return m / ((len(seq_lens) if n_rows is None else n_rows) * max_len)",
     "return m / ((len(seq_lens) if n_rows is None else n_rows) * n_tok.clamp(min=1)[seq])",
     ["tests/test_objectives.py", "-k", "dr-grpo"]),
    ("batch-scaled advantages divided by this rank's std only", "trainer.py",
     "grpo_advantages(r, k, cfg.scale_std, reduce=every_rank)", "grpo_advantages(r, k, cfg.scale_std)",
     ["tests/test_objectives.py", "-k", "every_rank"]),
    ("GSPO's sequence term weighted by each token's weight times the sequence mean, not by the mean alone",
     "kernels/fused_linear.py", "adv = torch.where(valid, adv * wbar[seq] / torch.where(valid, w, 1.0), 0.0)",
     "adv = torch.where(valid, adv * wbar[seq], 0.0)", ["tests/test_objectives.py", "-k", "gspo"]),
    ("objective not passed to the fused op (always ppo)", "trainer.py", "objective=cfg.objective, seq_lens=lens)",
     "seq_lens=lens)", ["tests/test_wiring.py", "-k", "gspo or cispo"]),
    ("overlong filtering keeps cut responses in the loss", "rewards/advantages.py",
     "r.mask = torch.zeros(len(r.response), dtype=torch.bool) if cut else r.mask", "pass",
     ["tests/test_wiring.py", "-k", "dr-grpo"]),
    # day one (issue 46) and objectives round 2 (issue 47)
    ("reward.weights ignored (every user function weighs 1)", "rewards/user.py",
     "for spec, w in zip(funcs, weights or [1.0] * len(funcs)):", "for spec, w in zip(funcs, [1.0] * len(funcs)):",
     ["tests/test_user_rewards.py"]),
    ("ppo_epochs ignored (one pass over the batch)", "trainer.py",
     "itertools.product(range(cfg.ppo_epochs), range(cfg.mini_batches))",
     "itertools.product(range(1), range(cfg.mini_batches))", ["tests/test_ppo_epochs.py"]),
    ("cosine schedule stays at the peak", "model.py", '"cosine": 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))',
     '"cosine": 1.0', ["tests/test_day_one.py", "-k", "lr_schedules"]),
    ("overlong.penalty_factor not passed (always 1)", "trainer.py", "o.filter, every_rank, o.penalty_factor)",
     "o.filter, every_rank, 1.0)", ["tests/test_wiring.py", "-k", "dr-grpo"]),
    # rewards round 5 (issue 44): the runs of a case
    ("a Triton case's later runs reuse run 0's module", "rewards/triton/harness.py",
     "self._run(fresh, k, case, runs)", "self._run(module, k, case, runs)",
     ["tests/test_triton_schedules.py", "-k", "caches_run_0_outputs"]),
    ("a Triton case's runs share the reference state", "rewards/triton/harness.py",
     '{n: v.clone() for n, v in case["state"].items()}', 'dict(case["state"])',
     ["tests/test_triton_schedules.py", "-k", "copies_of_the_reference_state"]),
    ("a tuned kernel's choosing run resets reset_to_zero's arguments", "rewards/triton/gpu.py",
     "hook, self.pre_hook = self.pre_hook, lambda *_, **__: None", "hook = self.pre_hook",
     ["tests/test_triton_schedules.py", "-k", "no_reset_to_zero"]),
    ("two lanes storing different values to one byte pass", "rewards/triton/memory.py",
     "differ = np.minimum.reduceat(b, first) != np.maximum.reduceat(b, first)", "differ = np.zeros(len(first), bool)",
     ["tests/test_triton_gpu_semantics.py", "-k", "one_byte"]),
    # porting a TRL or verl job (issue 53)
    ("LR schedule advances per optimizer step (ends after 1 / (ppo_epochs x mini_batches) of the run)", "trainer.py",
     "    run.optim.zero_grad(set_to_none=True)\n", "    run.optim.zero_grad(set_to_none=True)\n    run.sched.step()\n",
     ["tests/test_ppo_epochs.py", "-k", "cosine"]),
    ("mini-batches of ceil(rows / M) rows (the last ones empty)", "trainer.py",
     "mini = rows[m * len(rows) // cfg.mini_batches:(m + 1) * len(rows) // cfg.mini_batches]",
     "mini = rows[m * -(-len(rows) // cfg.mini_batches):(m + 1) * -(-len(rows) // cfg.mini_batches)]",
     ["tests/test_ppo_epochs.py", "-k", "evenly"]),
    ("a failed reward function zeroes the whole sample", "rewards/user.py",
     'out.update(reason="reward_error", failed=failed, error=next(iter(failed.values()))[1])',
     'out.update(reason="reward_error", failed=failed, error=next(iter(failed.values()))[1])\n            total = 0.0',
     ["tests/test_user_rewards.py", "-k", "failing_function"]),
    ("a reward function's None counted as a 0 component", "rewards/user.py",
     "            elif score is not None:\n                parts[key] = score",
     "            else:\n                parts[key] = score = score or 0.0", ["tests/test_reward_styles.py", "-k", "none"]),
    ("a TRL function gets no dataset columns", "rewards/styles.py",
     'columns = {k: [v] for k, v in row.items() if k not in NOT_COLUMNS and not k.startswith("_")}', "columns = {}",
     ["tests/test_reward_styles.py", "-k", "as_trl"]),
    ("a step's reward failures are not said", "trainer.py", "    report.say(run.rank, line)\n", "",
     ["tests/test_reward_styles.py", "-k", "trained"]),
    ("reward workers see every GPU (all on GPU 0)", "rewards/pool.py", "    os.environ.update(env)  # before",
     "    pass  # before", ["tests/test_pool.py", "-k", "gpu"]),
    ("verl's dotted paths get no hint (only the whole key is looked up)", "config.py",
     'for tail in (".".join(parts[i:]) for i in range(len(parts))):', "for tail in (key,):",
     ["tests/test_config.py", "-k", "mapping_page"]),
    ("fp32-out addmm assumed from the overload's presence (torch 2.8-2.9 refuse it on CUDA)", "kernels/fused_linear.py",
     "    except (RuntimeError, TypeError):  # NotImplementedError", "    except ():  # NotImplementedError",
     ["tests/test_fused_linear.py", "-k", "probed"]),
    ("the launcher does not render the chat template file", "trainer.py",
     "        check_chat_template(cfg, rows)  # chat_template_file", "        pass  # chat_template_file",
     ["tests/test_bad_input.py", "-k", "chat_template"]),
    ("samples.jsonl takes the first group's samples first", "report.py",
     "turns = sorted((j, i) for i, g in enumerate(groups) for j in range(len(g.samples)))",
     "turns = [(j, i) for i, g in enumerate(groups) for j in range(len(g.samples))]",
     ["tests/test_reward_styles.py", "-k", "samples"]),
    ("samples.jsonl holds the row's raw prompt", "report.py", '"prompt": run.tok.decode(row["prompt_ids"])',
     '"prompt": row["prompt"]', ["tests/test_reward_styles.py", "-k", "samples"]),
    ("the launcher does not import the reward files", "trainer.py",
     "    check_imports(cfg)  # reward.funcs' files import", "    pass  # reward.funcs' files import",
     ["tests/test_user_rewards.py", "-k", "raises_on_import"]),
    ("reward.model_weights ignored (every reward model weighs 1)", "rewards/models.py",
     "rc.model_weights or [1.0] * len(rc.models)", "[1.0] * len(rc.models)",
     ["tests/test_reward_models.py", "-k", "weighted_sum"]),
    ("sharded reward models without padding forwards (the ranks' forward counts differ)", "rewards/models.py",
     "            batches += [[]] * (all_max(len(batches), self.device) - len(batches))", "            pass",
     ["tests/test_reward_models.py", "-k", "eval_mode and True"]),
    ("held-out reward-model scores all read against the first row's prompt", "trainer.py",
     'held_out([(rows[i // (k + 1)]["prompt"], t)', 'held_out([(rows[0]["prompt"], t)',
     ["tests/test_reward_models.py", "-k", "eval_mode"]),
    ("a reward model's long input keeps its first tokens (the response cut)", "rewards/models.py",
     "return ids[-max_len:], len(ids) > max_len", "return ids[:max_len], len(ids) > max_len",
     ["tests/test_reward_models.py", "-k", "plain_forward"]),
    # PPO with a critic (rewards/critic.py)
    ("GAE's gamma and lambda swapped (delta discounted by lambda)", "rewards/critic.py",
     "delta = r + gamma * V[:, 1:] - V[:, :-1]", "delta = r + lam * V[:, 1:] - V[:, :-1]",
     ["tests/test_critic.py", "tests/test_wiring.py", "-k", "gae"]),
    ("no value clip (v_clip = v)", "rewards/critic.py", "v_clip = old + (v - old).clamp(-clip, clip)", "v_clip = v",
     ["tests/test_critic.py", "tests/test_wiring.py", "-k", "clipped or gae_run"]),
    ("value targets not detached (R = A + the current values)", "rewards/critic.py",
     "terms, more = value_loss_terms(v, cat(old), cat(targets), self.c.cliprange_value)",
     "terms, more = value_loss_terms(v, cat(old), cat(targets) - cat(old) + v, self.c.cliprange_value)",
     ["tests/test_wiring.py", "-k", "gae_run"]),
    ("GAE bootstraps from the last value (V_{T+1} = V_T, not 0)", "rewards/critic.py",
     "        V[i, :len(v)] = v.double()\n",
     "        V[i, :len(v)] = v.double()\n        V[i, len(v)] = float(v[-1]) if len(v) else 0.0\n",
     ["tests/test_critic.py", "tests/test_wiring.py", "-k", "gae"]),
    ("a resume leaves the critic as built (its checkpointed state not loaded)", "trainer.py",
     '            self.advantages.load_state_dict(sharded["critic"])', "            pass",
     ["tests/test_wiring.py", "-k", "rl-gae"]),
    ("PRIME in GAE: the process rewards left out (the outcome alone)", "rewards/critic.py",
     "self.c.gamma, self.c.lam, process)", "self.c.gamma, self.c.lam, None)",
     ["tests/test_wiring.py", "-k", "gae_run"]),
    ("PRIME in GAE: the process rewards at the last token only (summed there)", "rewards/critic.py",
     "            r[i, :len(v)] = token_rewards[i].double()",
     "            r[i, len(v) - 1] = token_rewards[i].double().sum() if len(v) else 0.0",
     ["tests/test_critic.py", "-k", "gae"]),
    ("the critic's checkpoint leaves out PRIME's PRM (a resume starts it over)", "rewards/critic.py",
     '**({"prm": self.prm.state_dict()} if self.prm else {})', "**{}",
     ["tests/test_wiring.py", "-k", "rl-prime-gae"]),
]


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored), plus a link to the venv."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    os.symlink(ROOT / ".venv", dest / ".venv")


def run_mutant(name, path, old, new, selection) -> tuple[str, float]:
    """-> (caught | SURVIVED | stale: ..., seconds)."""
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        tmp = Path(tmp)
        copy_tree(tmp)
        text = (tmp / path).read_text()
        if text.count(old) != 1:
            return f"stale: the text occurs {text.count(old)} times in {path}", 0.0
        (tmp / path).write_text(text.replace(old, new))
        p = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            f"--basetemp={tmp / 'pytest'}", *selection], cwd=tmp, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(tmp)})
        if p.returncode == 5:
            return "stale: the selection collects no test", time.time() - t0
        return ("caught" if p.returncode != 0 else "SURVIVED"), time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="run only these mutants (by name)")
    ap.add_argument("-l", "--list", action="store_true")
    a = ap.parse_args()
    todo = [m for m in MUTANTS if not a.names or m[0] in a.names]
    if a.list:
        print("\n".join(f"{m[0]:48s} {m[1]}" for m in MUTANTS))
        return 0
    results = []
    for m in todo:
        verdict, seconds = run_mutant(*m)
        results.append((m[0], verdict))
        print(f"{verdict:8s} {seconds:6.0f} s  {m[0]}  ({m[1]}; {' '.join(m[4])})", flush=True)
    caught = sum(v == "caught" for _, v in results)
    print(f"\n{caught} of {len(results)} planted bugs caught")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
