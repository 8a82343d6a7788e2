"""TrainingJob handle of an Amazon SageMaker training job."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from meshtrain.backends.sagemaker.display import secondary_status_lines, status_summary
from meshtrain.backends.sagemaker.logs import CloudWatchLogReader, stream_order
from meshtrain.contract.hyperparameters import decode_hyperparameters
from meshtrain.display import make_display
from meshtrain.job import TERMINAL_STATUSES, TrainingJob, reported_interrupt
from meshtrain.job_layout import layout_of_description
from meshtrain.progress import total_steps_from

LOG_TYPES = {True: "All", False: "None", "All": "All", "None": "None", "Training": "All",
             "Rules": "None"}  # the SDK's `logs` values; Debugger rules are not followed


class SageMakerTrainingJob(TrainingJob):
    """A SageMaker training job: DescribeTrainingJob for state, CloudWatch Logs for output.

    `poll_seconds` is the pause between two log reads, `describe_seconds` the least time
    between two DescribeTrainingJob calls (the SDK's 10 s and 30 s, to stay clear of API
    throttling). `sleep`, `clock` and `console` are there for tests and embedding.
    """

    def __init__(
        self,
        job_name: str,
        sagemaker_client: Any,
        logs_client: Any,
        *,
        poll_seconds: float = 10.0,
        describe_seconds: float = 30.0,
        console: Console | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(job_name)
        self.sagemaker_client = sagemaker_client
        self.logs_client = logs_client
        self.poll_seconds, self.describe_seconds = poll_seconds, describe_seconds
        self.console, self.sleep, self.clock = console, sleep, clock

    def describe(self) -> dict[str, Any]:
        """The DescribeTrainingJob response (without ResponseMetadata) and meshtrain's
        "Layout" (meshtrain.job_layout), read from its HyperParameters and ResourceConfig."""
        response = self.sagemaker_client.describe_training_job(TrainingJobName=self.job_name)
        response.pop("ResponseMetadata", None)
        layout = layout_of_description(response)
        return {**response, "Layout": layout} if layout else response

    def log_location(self) -> str:
        return f"CloudWatch log group /aws/sagemaker/TrainingJobs, streams {self.job_name}/*"

    def _reader(self, description: dict[str, Any]) -> CloudWatchLogReader:
        count = description.get("ResourceConfig", {}).get("InstanceCount", 1)
        return CloudWatchLogReader(self.logs_client, self.job_name, count)

    def logs(self) -> None:
        """Print every host's log so far, merged in time order."""
        for event in self._reader(self.describe()).read_new():
            sys.stdout.write(event.message + "\n")
        sys.stdout.flush()

    def stop(self) -> None:
        """Ask SageMaker to stop the job (SIGTERM, then SIGKILL after 120 s); returns at once.

        Checkpoints already synced to S3 and what the hosts wrote before stopping are kept.
        """
        self.sagemaker_client.stop_training_job(TrainingJobName=self.job_name)
        print(f"Stopping training job {self.job_name}.")

    def wait(self, logs: bool | str = True) -> None:
        """Block until the job ends, printing status transitions (and logs); raise on failure.

        `logs` is True/False or the SDK's "All"/"None". A failed job raises
        meshtrain.JobFailedError with SageMaker's FailureReason; a stopped one only says so.
        """
        show_logs = LOG_TYPES.get(logs, "All") == "All"
        display = make_display(self.job_name, console=self.console, header=self.start_line())
        try:
            description = self._follow(display, show_logs)
        except KeyboardInterrupt:
            display.close()
            raise reported_interrupt(
                f"stopped following training job {self.job_name}; it keeps running on "
                f"SageMaker (stop it: meshtrain stop {self.job_name}).") from None
        display.close()
        self._print_billing(description)
        self.raise_for_status(description)

    def _follow(self, display: Any, show_logs: bool) -> dict[str, Any]:
        """The SDK's `logs_for_job` loop: read logs every poll, describe every few polls, and
        after the job turns terminal read the logs one last time."""
        description = self.describe()
        display.tracker.total_steps = total_steps_from(
            decode_hyperparameters(description.get("HyperParameters") or {}))
        for line in secondary_status_lines(description, None):
            display.line(line)
        display.status(status_summary(description))
        reader = self._reader(description) if show_logs else None
        complete = description["TrainingJobStatus"] in TERMINAL_STATUSES
        last_describe = self.clock()
        while True:
            if reader is not None:
                for event in reader.read_new():
                    host = stream_order(event.stream)[0]
                    display.log(event.message, host=host if host < 1 << 30 else None)
            if complete:
                return description
            self.sleep(self.poll_seconds if reader is not None else self.describe_seconds)
            if self.clock() - last_describe < self.describe_seconds:
                continue
            previous, description = description, self.describe()
            last_describe = self.clock()
            for line in secondary_status_lines(description, previous):
                display.line(line)
            display.status(status_summary(description))
            complete = description["TrainingJobStatus"] in TERMINAL_STATUSES

    def _print_billing(self, description: dict[str, Any]) -> None:
        count = description.get("ResourceConfig", {}).get("InstanceCount", 1)
        training = description.get("TrainingTimeInSeconds")
        billable = description.get("BillableTimeInSeconds")
        if training is not None:
            print("Training seconds:", training * count)
        if billable is not None:
            print("Billable seconds:", billable * count)
            if description.get("EnableManagedSpotTraining") and training:
                print(f"Managed Spot Training savings: {(1 - billable / training) * 100:.1f}%")
