# One virtual environment at .venv/ serves the demo, the tests and the benches.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
DEMO   := demo-data
JOBS   := flextrain-jobs
# pytest-xdist workers for `make test`: much of an end-to-end test is waiting (process starts, rendezvous,
# a job's other processes), so two share the 2-core machine CI runs on (tests/conftest.py groups them).
TEST_WORKERS ?= 2

.PHONY: venv demo test proto bench lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: the CPU wheel; never let a resolver pick a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,tensorflow]'
	touch $(STAMP)

# --overwrite: a second `make demo` moves the first run's job directory aside instead of being refused.
demo: $(STAMP)
	$(VENV)/bin/flextrain data digits --out $(DEMO)
	$(VENV)/bin/flextrain train --model-def model_zoo/digits_torch.py:Model \
		--training-data $(DEMO)/train --validation-data $(DEMO)/validation \
		--workers 2 --epochs 8 --global-batch-size 64 --max-micro-batch 32 --lr 0.1 \
		--job-dir $(JOBS)/digits-demo --overwrite

test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

proto: $(STAMP)
	$(PY) -m flextrain.proto.build

# Every bench at its smoke size (~4 min): fails only if one crashes; the figures are in bench/README.md.
bench: $(STAMP)
	$(PY) bench/smoke.py

clean:
	rm -rf $(DEMO) $(JOBS) .pytest_cache
