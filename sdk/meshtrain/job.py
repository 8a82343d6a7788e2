"""TrainingJob: the handle a backend returns for one submitted job."""

from __future__ import annotations

import abc
import contextlib
import io
import sys
from collections.abc import Iterator
from types import TracebackType
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


_REPORTED = "__meshtrain_reported__"
"""Set on a KeyboardInterrupt whose one-line report is already on stderr."""


def reported_interrupt(message: str, *, say: bool = True) -> KeyboardInterrupt:
    """Say `message` on stderr in one line (flushed: through a pipe whose reader Ctrl-C ended,
    stderr still reaches the terminal; `say=False`: the caller has said it) and return the
    KeyboardInterrupt to raise.

    It stays a plain KeyboardInterrupt (a script may catch it; an uncaught one ends Python by
    SIGINT, exit status 130), but it is marked as reported: the `meshtrain` command and an
    uncaught end print nothing more, not a traceback of the client's polling loop.
    """
    if say:
        say_on_stderr(f"meshtrain: {message}\n")
    interrupt = KeyboardInterrupt(message)
    setattr(interrupt, _REPORTED, True)
    if not getattr(sys.excepthook, _REPORTED, False):
        sys.excepthook = _quiet_for_reported(sys.excepthook)
    return interrupt


def say_on_stderr(text: str) -> None:
    """Write `text` to stderr now (a stderr that is gone drops it)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()


def was_reported(error: BaseException) -> bool:
    """Whether `error` is a KeyboardInterrupt reported by `reported_interrupt`."""
    return bool(getattr(error, _REPORTED, False))


def _quiet_for_reported(previous: Any) -> Any:
    def hook(kind: type[BaseException], value: BaseException,
             traceback: TracebackType | None) -> None:
        if not was_reported(value):
            previous(kind, value, traceback)

    setattr(hook, _REPORTED, True)
    return hook


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

    def log_location(self) -> str | None:
        """Where the job's log is kept, in words a user can follow (None: only `meshtrain
        logs` reads it)."""
        return None

    def stop_hint(self) -> str:
        """How to stop the job, as its first line says it."""
        return f"meshtrain stop {self.job_name} (Ctrl-C only stops following it)"

    def start_line(self) -> str:
        """What following a job shows first: its name, where its logs are, how to stop it."""
        where = self.log_location()
        return (f"[meshtrain] job {self.job_name} · logs: meshtrain logs {self.job_name} -f"
                f"{f' ({where})' if where else ''} · stop: {self.stop_hint()}")

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
