# `make demo` and `make test` set up everything on a fresh Debian machine.
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= cpu,test

.PHONY: demo test test-cluster setup system-deps train clean

demo: setup
	$(PY) tools/demo.py

test: setup
	$(VENV)/bin/pytest

# The Spark standalone cluster test (master + two workers + a daemon each, ~2-3 minutes).
test-cluster: setup
	$(VENV)/bin/pytest -m cluster tests/spark_jobs

setup: system-deps $(VENV)/.installed

system-deps:
	@tools/system-deps.sh

# Reinstalled whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[$(EXTRAS)]'
	touch $@

# Retrains the example model (needs the `train` extra: torch, onnx, mlxtend).
train: system-deps
	$(VENV)/bin/pip install -q -e '.[$(EXTRAS),train]'
	$(PY) tools/train_mnist.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info spark-warehouse demo-output
