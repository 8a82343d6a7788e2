# Developer entry points. `make bench`: every CPU benchmark (torchrun on gloo), a few minutes;
# writes benchmarks/results/latest.json and latest.md. BENCH_MACHINE describes the machine.
PYTHON ?= python
BENCH_MACHINE ?= unnamed machine

.PHONY: bench bench-smoke bench-data bench-compile bench-gpu gpu-check gpu-check-smoke gpu-check-bundle

bench:
	$(PYTHON) benchmarks/run_all.py --machine "$(BENCH_MACHINE)"

bench-smoke:
	$(PYTHON) benchmarks/run_all.py --smoke --machine "$(BENCH_MACHINE)"

# the loader alone (issue 40): tokens/s vs DataLoader + DistributedSampler, step time vs in memory
bench-data:
	$(PYTHON) benchmarks/bench_data.py --json benchmarks/results/data.json

# adds full shard, hybrid, tp, tp x hybrid and ep with compile: true (inductor on every rank: several more minutes)
bench-compile:
	$(PYTHON) benchmarks/run_all.py --with-compile --machine "$(BENCH_MACHINE)"

# issue 20's table on one CUDA GPU (transform() vs hand-written, compile, fused AdamW, offloading)
bench-gpu:
	$(PYTHON) benchmarks/gpu_throughput.py --json benchmarks/results/gpu.json

# Every GPU check in one command (< 6 min on an H100): the gpu test tier, the planner against
# the GPU's phase peaks, the fair throughput table, a local_gpu job; see docs/testing.md
GPU_CHECK_OUT ?= benchmarks/results
GPU_CHECK_ARGS ?=
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py --out "$(GPU_CHECK_OUT)" $(GPU_CHECK_ARGS)

# the same on CPU with tiny shapes (CI runs it: tests/benchmarks/test_gpu_check.py)
GPU_CHECK_SMOKE_OUT ?= /tmp/meshtrain-gpu-check-smoke
gpu-check-smoke:
	$(PYTHON) benchmarks/gpu_check.py --smoke --out "$(GPU_CHECK_SMOKE_OUT)" $(GPU_CHECK_ARGS)

# what a lent GPU machine lacks, into .gpu-bundle/ (carried by the device call)
gpu-check-bundle:
	PYTHON=$(PYTHON) bash benchmarks/gpu_check_bundle.sh
