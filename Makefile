# Developer entry points. `make bench`: every CPU benchmark (torchrun on gloo), a few minutes;
# writes benchmarks/results/latest.json and latest.md. BENCH_MACHINE describes the machine.
PYTHON ?= python
BENCH_MACHINE ?= unnamed machine

.PHONY: bench bench-smoke

bench:
	$(PYTHON) benchmarks/run_all.py --machine "$(BENCH_MACHINE)"

bench-smoke:
	$(PYTHON) benchmarks/run_all.py --smoke --machine "$(BENCH_MACHINE)"
