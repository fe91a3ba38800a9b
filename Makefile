# Quick start: `make demo` (the CPU demo: SFT warm-up then GRPO with 2 ranks), `make test`.
PY      := .venv/bin/python
TORCHRUN := .venv/bin/torchrun
DEMO    := runs/demo
export VLLM_LOGGING_LEVEL ?= ERROR
export PYTHONWARNINGS ?= ignore

.PHONY: install demo test bench bench-step clean

install: .venv/.installed

# GPU stack when a CUDA GPU is visible, else the pinned CPU stack. Idempotent: re-runs only when
# a requirements file changes.
.venv/.installed: requirements.txt requirements-cpu.txt
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(PY) -m pip install -q -r requirements.txt; \
	else \
	  $(PY) -m pip install -q -r requirements-cpu.txt && \
	  $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	touch $@

# Data + tokenizer + random-init tiny model, SFT warm-up, then GRPO (CoPRIS rollout) on 2 ranks.
demo: install
	$(PY) -m data.arithmetic --out $(DEMO)/data --train 20000 --sft 40000 --eval 1000
	$(PY) -m data.tiny_model --corpus $(DEMO)/data/sft.jsonl --out $(DEMO)/model
	$(TORCHRUN) --nproc_per_node 2 trainer.py --config configs/demo_sft.yaml
	$(TORCHRUN) --nproc_per_node 2 trainer.py --config configs/demo.yaml

# TRITON_ALL_TASKS=1: every shipped Triton solution must score 1.0 (not only one per category).
test: install
	TRITON_ALL_TASKS=1 $(PY) -m pytest -q tests

bench: install
	$(PY) benchmarks/bench_kernels.py

# The demo job's RL step by phase vs a plain step (builds a small demo job under runs/bench_step without runs/demo).
bench-step: install
	$(PY) benchmarks/bench_step.py

clean:
	rm -rf runs
