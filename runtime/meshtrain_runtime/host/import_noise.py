"""Log lines that importing torchao prints on every rank, dropped with their reason.

Transformers imports torchao whenever it is installed (its quantizer registry), so every
Hugging Face job with torchao present (the dev extra, the fp8 extra) printed, per rank:

- ``Failed to load .../torchao/_C_mxfp8.cpython-310-...so`` and ``_C_cutlass_90a.abi3.so``:
  torchao 0.18's optional CUDA kernels (MX formats, CUTLASS for sm90), built for another Python
  or absent on a CPU machine; torchao goes on without them and meshtrain uses none of them
  (fp8 uses torchao.float8, plain torch ops and torch._scaled_mm);
- ``<enum 'KernelPreference'> is an Enum subclass and is now natively supported by
  torch.compile ...``: torchao registers its config enums as pytree constants, which torch 2.13
  deprecates; harmless until a torchao release stops doing it.

No torchao release built for torch 2.13 could be installed here to check whether a pin would do
instead, so the two messages are filtered, narrowly, on the two loggers that emit them; every
other torchao or torch message still shows. Nothing is imported: a filter on a logger name works
before the logger's module exists, so the rank wrapper installs it before the script runs.
"""

from __future__ import annotations

import logging
import re

_NOISE = {
    "torchao": re.compile(r"^Failed to load .*torchao/_C\w*\.\S*\.so"),
    "torch.utils._pytree": re.compile(
        r"is an Enum subclass and is now natively supported by torch\.compile"
    ),
}


class _DropMatching(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def drop_log_lines(logger_name: str, pattern: re.Pattern[str]) -> None:
    """Drop the records of logger `logger_name` whose message matches `pattern` (idempotent)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _DropMatching) and f.pattern == pattern for f in logger.filters):
        logger.addFilter(_DropMatching(pattern))


def quiet_torchao_import() -> None:
    """Drop the torchao import messages above (idempotent)."""
    for name, pattern in _NOISE.items():
        drop_log_lines(name, pattern)
