# Quick start: `make demo` (the CPU demo: SFT warm-up then GRPO with 2 ranks), `make test`.
PY      := .venv/bin/python
DEMO    := runs/demo
# Ranks for the demo: 2 on a CPU machine or with 2+ GPUs, 1 with a single GPU (one rank per GPU). Override:
# make demo NPROC=1
NPROC   ?= $(shell n=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$$n" = 1 ] && echo 1 || echo 2)

.PHONY: install sandbox demo demo-tools test test-slow test-all mutants bench bench-step bench-vs-trl real-shape gpu-wheels \
	clean

install: .venv/.installed sandbox

# bubblewrap: the reward sandbox's isolation (rewards/sandbox.py). Without it the code and Triton rewards score 0
# (reason no_sandbox) and the trainer stops at start unless sandbox_opt_out is set. apt-get as root or with
# passwordless sudo; otherwise this says what to install.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then SUDO=; \
	  elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
	  else echo "make install: bubblewrap (bwrap) is missing and can't be installed from here: install the" \
	    "package bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap); until then code and Triton" \
	    "rewards score 0 (reason no_sandbox)" >&2; exit 0; fi; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; }

# GPU stack when a CUDA GPU is visible, else the pinned CPU stack. Idempotent: re-runs only when
# a requirements file changes. pip shows each package as it goes (a first install takes a few minutes).
.venv/.installed: requirements.txt requirements-cpu.txt
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "make install: the GPU stack (requirements.txt) into .venv"; \
	  $(PY) -m pip install -r requirements.txt; \
	else \
	  echo "make install: the CPU stack (requirements-cpu.txt) into .venv"; \
	  $(PY) -m pip install -r requirements-cpu.txt; \
	fi
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec  # built for another torch; nothing here uses them
	touch $@
	@echo "make install: done; activate the venv with: source .venv/bin/activate"

# Data + tokenizer + random-init tiny model, SFT warm-up, then GRPO (CoPRIS rollout) on 2 ranks. A rerun replaces
# the previous demo run (--overwrite=true); elsewhere a used run_dir is refused.
demo: install
	$(PY) -m data.arithmetic --out $(DEMO)/data --train 20000 --sft 40000 --eval 1000
	$(PY) -m data.tiny_model --corpus $(DEMO)/data/sft.jsonl --out $(DEMO)/model
	$(PY) trainer.py --nproc_per_node $(NPROC) --config configs/demo_sft.yaml --overwrite=true
	$(PY) trainer.py --nproc_per_node $(NPROC) --config configs/demo.yaml --overwrite=true

# Tools demo (docs/tools.md): the tokenizer gets the tool-call tokens, SFT on demonstrations of which 30% call the
# calculator, then GRPO with the calculator environment and, beside it, the same RL run without the tool.
TOOLS   := runs/demo_tools
demo-tools: install
	$(PY) -m data.arithmetic --tools --out $(TOOLS)/data --train 20000 --sft 20000 --eval 500
	$(PY) -m data.tiny_model --tools --corpus $(TOOLS)/data/sft.jsonl --out $(TOOLS)/model
	$(PY) trainer.py --nproc_per_node $(NPROC) --config configs/demo_tools_sft.yaml --overwrite=true
	$(PY) trainer.py --nproc_per_node $(NPROC) --config configs/demo_tools.yaml --overwrite=true
	$(PY) trainer.py --nproc_per_node $(NPROC) --config configs/demo_tools.yaml --overwrite=true \
	  --train_data=$(TOOLS)/data/rl_plain.jsonl --eval_data=$(TOOLS)/data/eval_plain.jsonl --run_dir=$(TOOLS)/rl_plain

# The quick loop (about 10 min quiet, 14 under load): every test but those marked slow. test-slow: the slow ones
# (about 25 min quiet: resume of PRIME/LoRA/TP runs, signals, end to end, LoRA, every shipped Triton solution). CI runs
# both; test-all: one go.
test: install
	$(PY) -m pytest -q tests -m "not slow"

test-slow: install
	$(PY) -m pytest -q tests -m slow

test-all: install
	$(PY) -m pytest -q tests

# Planted bugs (tests/mutations/run.py): each must make its tests fail. Not part of make test (about 13 min).
mutants: install
	$(PY) tests/mutations/run.py

bench: install
	$(PY) benchmarks/bench_kernels.py

# A Qwen2.5-0.5B-shaped model (random weights, V=151936) through SFT, GRPO with CoPRIS and the vLLM engine on 1
# process and 2 ranks, a resume that must continue identically, export and one request to the served export; seconds
# and peak memory per phase (benchmarks/real_shape.py, docs/speed.md). About 10 min on 2 cores; the 2-rank pieces
# peak at 11 GiB per rank (22 GiB free needed), the 1-process one at 15 GiB. It leaves 52 GB under runs/real_shape
# (0.5B checkpoints with Adam state): make clean removes it. Whole command, 2026-12-04: 513 s, resume identical.
real-shape: install
	$(PY) benchmarks/real_shape.py

# The demo job's RL step by phase vs a plain step (builds a small demo job under runs/bench_step without runs/demo).
bench-step: install
	$(PY) benchmarks/bench_step.py

# Ours against TRL's GRPOTrainer on the identical job, one process each, on the CPU (docs/speed.md's table: the demo
# job synchronous and with CoPRIS, the 0.5B shape with responses of 32 and 256 tokens; about 30 min). TRL runs in a
# venv of its own, never in the project's requirements, with the project's torch, transformers and accelerate pins.
TRL_PINS := trl==1.16.0 torch==2.13.0 transformers==5.19.0 accelerate==1.15.0
.venv-trl/.installed:
	test -x .venv-trl/bin/python || python3 -m venv .venv-trl
	.venv-trl/bin/python -m pip install -q $(TRL_PINS)
	touch $@

bench-vs-trl: install .venv-trl/.installed
	$(PY) benchmarks/vs_trl.py --shape demo
	$(PY) benchmarks/vs_trl.py --shape demo --copris --sides ours
	$(PY) benchmarks/vs_trl.py --shape 0.5b --response_len 32 --steps 3
	$(PY) benchmarks/vs_trl.py --shape 0.5b --response_len 256 --steps 2

# Wheels for the lent GPU machine (benchmarks/gpu_check.sh installs those its image lacks; it has no registry):
# Python 3.12, x86-64. The pinned packages the project imports that such an image may lack, math-verify's and
# pytest's own dependencies (the check's tests phase runs pytest), greenlet (the Triton reward's schedules) and
# Liger-Kernel, which the optional kernel benchmark compares against. Into .whl/ (ignored by git), about 5 MB.
GPU_WHEELS := $(shell grep -E '^(peft|accelerate|pytest|pyyaml|tqdm|math-verify|greenlet)==' requirements.txt) \
	latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 liger-kernel==0.8.5 \
	iniconfig==2.3.1 pluggy==1.7.0 packaging==26.4 pygments==2.21.0
gpu-wheels:
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl \
	  $(foreach p,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1,--platform $(p)_x86_64) \
	  $(GPU_WHEELS)

clean:
	rm -rf runs
