# DVM developer tasks. `make demo` and `make test` are all a newcomer needs: both create the
# virtual environment (.venv) on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.dvm-installed
VM_LOG := $(VENV)/cpu-vm-build.log

.PHONY: venv demo test bench clean distclean

venv: $(STAMP)

# DVM's core dependencies first (NumPy, numba: nothing pulls torch), then the CPU VM's one-time
# numba compile starts in the background (log: $(VM_LOG)), niced so that pip keeps its core
# while it installs the rest; a process that needs the VM before it is done waits for it
# (host/startup).
# torch pinned exactly: that picks up the local CPU wheel (an unpinned torch would download the
# CUDA build). Triton (the GPU VM, .[gpu]) pinned too: its tests run in Triton's interpreter mode
# on the CPU (a ~290 MB wheel, the price of testing the GPU VM in CI). Re-runs only when
# pyproject.toml changes.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e .
	@echo "compiling the CPU VM in the background (log: $(VM_LOG))"
	nice -n 10 $(BIN)/python -c "from dvm.vm import cpu; cpu.warm_up(wait_fast=True)" > $(VM_LOG) 2>&1 &
	$(BIN)/pip install torch==2.13.0 triton==3.9.0
	$(BIN)/pip install -e '.[dev,gpu]'
	touch $(STAMP)

demo: venv
	$(BIN)/dvm demo

# pytest exit code 5 means "no tests collected": not a failure here.
test: venv
	$(BIN)/python -m pytest -n 2 tests/; rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

bench: venv
	$(BIN)/dvm bench encode

# build outputs and caches (keeps .venv; `make distclean` removes it too)
clean:
	rm -rf build dist bench-results .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -path ./.git -prune -o -name __pycache__ -type d -prune \
		-exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
