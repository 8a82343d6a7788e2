"""TrainingJob: the handle a backend returns for one submitted job."""

from __future__ import annotations

import abc
import contextlib
import io
from collections.abc import Iterator
from typing import Any

from meshtrain.contract.errors import JobFailedError

TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
LIMIT_STATUSES = ("MaxRuntimeExceeded", "MaxWaitTimeExceeded")


def stop_reason(description: dict[str, Any]) -> str:
    """': MaxRuntimeExceeded ...' when a limit stopped the job (SageMaker says it in
    SecondaryStatus, local jobs in FailureReason), else ''."""
    reason = description.get("FailureReason")
    if reason:
        return f": {reason}"
    secondary = description.get("SecondaryStatus")
    if secondary in LIMIT_STATUSES:
        limit = description.get("StoppingCondition", {}).get("MaxRuntimeInSeconds")
        return f": {secondary}" + (f" (max_run={limit}s)" if limit else "")
    return ""


class TrainingJob(abc.ABC):
    """A submitted training job. `describe()` returns a DescribeTrainingJob-shaped dict."""

    def __init__(self, job_name: str) -> None:
        self.job_name = job_name

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """The job's state, shaped like SageMaker's DescribeTrainingJob response."""

    @abc.abstractmethod
    def wait(self, logs: bool = True) -> None:
        """Block until the job ends (printing logs if asked); raise JobFailedError on failure."""

    @abc.abstractmethod
    def logs(self) -> None:
        """Print the job's logs so far."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the job; outputs and checkpoints already written are kept."""

    @property
    def name(self) -> str:
        return self.job_name

    def end_leftover_processes(self) -> int:
        """End processes an ended job left behind; how many. Only local jobs can have any."""
        return 0

    def check_owner(self, action: str) -> None:
        """ConfigError unless this user may `action` (stop, remove) the job. Jobs on this
        machine check their owner; a remote service (SageMaker, Kubernetes) decides itself."""
        return None

    def log_lines(self) -> Iterator[str]:
        """The job's log so far, line by line (what `logs()` prints; backends may stream it)."""
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            self.logs()
        yield from buffer.getvalue().splitlines()

    def debug_log_lines(self) -> Iterator[str]:
        """Output kept out of the job log for its volume (a fault-tolerant job's torchft
        lines, per replica group); none where a backend keeps no such file."""
        return iter(())

    @property
    def status(self) -> str:
        return self.describe()["TrainingJobStatus"]

    @property
    def model_data(self) -> str | None:
        """Where model.tar.gz is (or will be) written."""
        return self.describe().get("ModelArtifacts", {}).get("S3ModelArtifacts")

    def raise_for_status(self, description: dict[str, Any] | None = None) -> None:
        """Raise JobFailedError when the job failed; a stopped job only warns (as the SDK does)."""
        description = description or self.describe()
        status = description["TrainingJobStatus"]
        if status == "Failed":
            reason = description.get("FailureReason", "(no failure reason recorded)")
            raise JobFailedError(self.job_name, reason)
        if status == "Stopped":  # not an error, as in the SageMaker SDK: say why it stopped
            print(f"Training job {self.job_name} was stopped{stop_reason(description)}.")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.job_name!r})"
