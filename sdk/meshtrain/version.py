"""The client's version and where its package lies: a module below everything, so that
backends (image tags, the code they ship to hosts) need not import `meshtrain` itself."""

from pathlib import Path

__version__ = "0.1.0"
CLIENT_PACKAGE = Path(__file__).resolve().parent
"""The `meshtrain` package directory (what Docker mounts and SageMaker ships beside a job)."""
