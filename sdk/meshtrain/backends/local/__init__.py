"""Local processes: one detached supervisor per job runs every host's bootstrap on this machine."""

from meshtrain.backends.local.backend import LocalBackend, LocalTrainingJob

__all__ = ["LocalBackend", "LocalTrainingJob"]
