"""Fails on every attempt, saying which (MESHTRAIN_ATTEMPT)."""

import os

raise RuntimeError(f"attempt {os.environ['MESHTRAIN_ATTEMPT']} lost its data (on purpose)")
