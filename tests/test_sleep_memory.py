"""LoRA on CUDA makes the engine sleep at level 1, which backs its bf16 weights up in pinned host memory on every
rank: the presets that do so state the host RAM they need, and the run checks MemAvailable at start and stops with
one line when the host cannot hold the backups (config.sleep_backup_problem). CUDA and the host are stood in."""
import json
import re
import struct
from pathlib import Path

import pytest
import torch
import yaml

import config
import trainer

ROOT = Path(__file__).resolve().parents[1]
# the Qwen2.5-32B shape grpo_32b_lora.yaml's comment describes
QWEN_32B = dict(hidden_size=5120, num_hidden_layers=64, intermediate_size=27648, num_attention_heads=40,
                num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False)


def header_only_checkpoint(folder: Path, arch: dict) -> Path:
    """config.json and a model.safetensors holding only the header of a bf16 model of `arch` (its shapes, from a
    meta-device build): what checkpoint_numel reads, without 65 GB of data."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    qcfg = Qwen2Config(**arch)
    with torch.device("meta"):
        m = Qwen2ForCausalLM(qcfg)
    header, offset = {}, 0
    for name, p in m.named_parameters():
        header[name] = {"dtype": "BF16", "shape": list(p.shape), "data_offsets": [offset, offset + 2 * p.numel()]}
        offset += 2 * p.numel()
    folder.mkdir(parents=True, exist_ok=True)
    qcfg.save_pretrained(folder)
    blob = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
    return folder


def test_level_1_presets_state_the_host_ram_the_check_asks_for(tmp_path):
    """Every GPU preset with LoRA says `Host RAM: N GB` for its ranks, and that is what the start check computes from
    a checkpoint of the model's shape (to 1 GB): it passes at N GB available and stops 2 GB below."""
    presets = [p for p in sorted((ROOT / "configs").glob("*.yaml")) if not p.name.startswith("demo")
               and (yaml.safe_load(p.read_text()).get("lora") or {}).get("rank", 0) > 0]
    assert [p.name for p in presets] == ["grpo_32b_lora.yaml"]
    model = header_only_checkpoint(tmp_path / "model", QWEN_32B)
    for preset in presets:
        text = preset.read_text()
        stated = int(re.search(r"^# Host RAM: (\d+) GB available \((\d+) ranks", text, re.M)[1]) * 1e9
        ranks = int(re.search(r"--nproc_per_node (\d+)", text)[1])
        cfg = trainer.Config()
        config._apply(cfg, "engine", yaml.safe_load(text).get("engine", {}), from_cli=False)
        config._apply(cfg, "lora", yaml.safe_load(text)["lora"], from_cli=False)
        cfg.model_path = str(model)
        assert config.sleep_backup_problem(cfg, ranks, stated + 1e9) is None, preset
        problem = config.sleep_backup_problem(cfg, ranks, stated - 2e9)
        assert problem and f"{ranks} ranks x 65.5 GB" in problem and "\n" not in problem, problem
        assert "CUDA-graph memory the sleep also copies are not counted" in problem, problem  # a lower bound


def run_main(argv, monkeypatch, available_gb: float, cuda: bool = True) -> tuple[int, str]:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(config, "host_available_bytes", lambda: int(available_gb * 1e9))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    try:
        cfg = trainer.load_config(argv, world=4)
        return 0, repr(cfg.lora)
    except config.ConfigError as e:
        return 2, str(e)


def test_run_stops_at_start_when_the_host_cannot_hold_the_backups(tiny, tmp_path, monkeypatch):
    """A LoRA run of the tiny model's shape made 1.5B-like: 4 ranks on one host need 4 x the engine's bf16 weights;
    short of that, load_config (run by the launcher before any rank starts, and by every rank) raises one line;
    with room, engine tensor parallel, no LoRA or no CUDA, it passes."""
    model = header_only_checkpoint(tmp_path / "model", dict(hidden_size=1536, num_hidden_layers=28,
                                                            intermediate_size=8960, num_attention_heads=12,
                                                            num_key_value_heads=2, vocab_size=151936,
                                                            tie_word_embeddings=True))
    base = ["--config", "configs/demo_lora.yaml", f"--model_path={model}",
            f"--train_data={tiny / 'data' / 'rl_train.jsonl'}", f"--eval_data={tiny / 'data' / 'eval.jsonl'}",
            "--max_prompt_len=64", "--max_response_len=64"]
    numel = config.checkpoint_numel(str(model))
    assert 1.5e9 < numel < 1.6e9, numel  # Qwen2.5-1.5B: 1.54B
    need_gb = 4 * numel * 2 / 1e9
    rc, msg = run_main(base, monkeypatch, need_gb - 1)
    assert rc == 2 and "\n" not in msg and f"4 ranks x {numel * 2 / 1e9:.1f} GB = {need_gb:.1f} GB" in msg, msg
    assert "lora.rank=16" in msg and "engine.tensor_parallel_size=2" in msg and "MemAvailable" in msg, msg
    assert run_main(base, monkeypatch, need_gb + 1)[0] == 0
    assert run_main(base + ["--engine.tensor_parallel_size=2"], monkeypatch, need_gb / 2 + 1)[0] == 0
    assert run_main(base + ["--lora.rank=0"], monkeypatch, 1)[0] == 0
    assert run_main(base, monkeypatch, 1, cuda=False)[0] == 0


def test_a_broken_safetensors_header_is_one_line(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}")
    with pytest.raises(config.ConfigError, match=r"model.safetensors: not a readable safetensors header"):
        config.checkpoint_numel(str(tmp_path))
