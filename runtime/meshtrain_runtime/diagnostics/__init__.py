"""Diagnostics: measurements for tests, calibration and benchmarks (never on the training path)."""
