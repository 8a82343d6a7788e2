# Developer entry points. `make bench`: every CPU benchmark (torchrun on gloo), a few minutes;
# writes benchmarks/results/latest.json and latest.md. BENCH_MACHINE describes the machine.
PYTHON ?= python
BENCH_MACHINE ?= unnamed machine

.PHONY: bench bench-smoke bench-compile bench-gpu

bench:
	$(PYTHON) benchmarks/run_all.py --machine "$(BENCH_MACHINE)"

bench-smoke:
	$(PYTHON) benchmarks/run_all.py --smoke --machine "$(BENCH_MACHINE)"

# adds full shard, hybrid, tp, tp x hybrid and ep with compile: true (inductor on every rank: several more minutes)
bench-compile:
	$(PYTHON) benchmarks/run_all.py --with-compile --machine "$(BENCH_MACHINE)"

# issue 20's table on one CUDA GPU (transform() vs hand-written, compile, fused AdamW, offloading)
bench-gpu:
	$(PYTHON) benchmarks/gpu_throughput.py --json benchmarks/results/gpu.json
