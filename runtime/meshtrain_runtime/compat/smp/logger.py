"""``torch.sagemaker.logger.get_logger``."""

from __future__ import annotations

import logging


def get_logger(name: str = "torch.sagemaker") -> logging.Logger:
    """A logger that prints INFO and above to stderr (one handler, added once)."""
    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


__all__ = ["get_logger"]
