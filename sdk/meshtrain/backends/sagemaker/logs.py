"""CloudWatch Logs of a training job: every host's stream, merged in time order.

SageMaker writes each host's stdout/stderr to the log group ``/aws/sagemaker/TrainingJobs``,
stream ``<job>/algo-<n>-<epoch>``. As the SageMaker SDK does (``session._flush_log_streams``,
``logs.multi_stream_iter``), the reader keeps one position per stream — the last timestamp
printed and how many events with that timestamp were already printed — so that each poll prints
only new events, none twice, and the events of one poll in timestamp order across hosts.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
_HOST = re.compile(r"/(algo-(\d+))(?:-\d+)?$")


@dataclass(frozen=True)
class Position:
    """Where reading a stream resumes: events at `timestamp`, of which `skip` were read."""

    timestamp: int = 0
    skip: int = 0


@dataclass(frozen=True)
class LogEvent:
    """One log line of one host."""

    timestamp: int
    """Milliseconds since the epoch."""
    stream: str
    message: str

    @property
    def host(self) -> str:
        match = _HOST.search(self.stream)
        return match.group(1) if match else self.stream


def stream_order(name: str) -> tuple[int, str]:
    """algo-2 before algo-10 (a plain string sort would not)."""
    match = _HOST.search(name)
    return (int(match.group(2)) if match else 1 << 30, name)


class CloudWatchLogReader:
    """Reads the new log events of one job's streams; `read_new()` returns them merged."""

    def __init__(self, logs_client: Any, job_name: str, instance_count: int) -> None:
        self.client = logs_client
        self.job_name = job_name
        self.instance_count = instance_count
        self.positions: dict[str, Position] = {}

    @property
    def streams(self) -> list[str]:
        return sorted(self.positions, key=stream_order)

    def discover_streams(self) -> None:
        """Find the job's streams (they appear as hosts start writing) until all are known."""
        if len(self.positions) >= self.instance_count:
            return
        names: list[str] = []
        kwargs: dict[str, Any] = {
            "logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{self.job_name}/",
            "orderBy": "LogStreamName", "limit": min(self.instance_count, 50),
        }
        try:
            while True:
                page = self.client.describe_log_streams(**kwargs)
                names += [stream["logStreamName"] for stream in page["logStreams"]]
                if "nextToken" not in page:
                    break
                kwargs.update(nextToken=page["nextToken"], limit=50)
        except ClientError as error:
            # The log group exists only once the account's first job has logged something.
            if error.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
        for name in names:
            self.positions.setdefault(name, Position())

    def _read_stream(self, name: str) -> list[LogEvent]:
        position = self.positions[name]
        kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": name,
                                  "startTime": position.timestamp, "startFromHead": True}
        skip, events = position.skip, []
        while True:
            page = self.client.get_log_events(**kwargs)
            batch = page["events"]
            if not batch:
                return events
            dropped = min(skip, len(batch))
            skip -= dropped
            events += [LogEvent(e["timestamp"], name, e["message"]) for e in batch[dropped:]]
            kwargs["nextToken"] = page["nextForwardToken"]

    def _advance(self, event: LogEvent) -> None:
        position = self.positions[event.stream]
        if position.timestamp == event.timestamp:
            self.positions[event.stream] = Position(event.timestamp, position.skip + 1)
        else:
            self.positions[event.stream] = Position(event.timestamp, 1)

    def read_new(self) -> list[LogEvent]:
        """Every event not read before, of all streams, in time order (ties: algo-1 first)."""
        self.discover_streams()
        per_stream = [self._read_stream(name) for name in self.streams]
        order = {name: index for index, name in enumerate(self.streams)}
        merged = list(heapq.merge(*per_stream,
                                  key=lambda e: (e.timestamp, order[e.stream])))
        for event in merged:
            self._advance(event)
        return merged
