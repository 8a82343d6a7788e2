"""The SageMaker TrainingJob handle against moto over HTTP: status transitions driven through
moto's backend objects, two hosts' CloudWatch logs merged in time order, failure, stop, the
live display, and the JobSpec rebuilt for attach()."""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone

import boto3
import pytest
from rich.console import Console
from sagemaker_moto import DEFAULT_BUCKET, ROLE, sagemaker_backend

from meshtrain import Estimator, JobFailedError
from meshtrain.backends.sagemaker import SageMakerBackend
from meshtrain.backends.sagemaker.logs import LOG_GROUP

IMAGE = "pytorch-training:2.5.1-gpu-py311"
SMP = {"torch_distributed": {"enabled": True, "processes_per_host": 8},
       "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
           "hybrid_shard_degree": 8, "tensor_parallel_degree": 2}}}}
NOW_MS = int(time.time() * 1000) - 60_000  # CloudWatch refuses events older than 14 days


def utc(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 1, 2, hour, minute, second, tzinfo=timezone.utc)


def start_job(source, name: str = "follow-me", **arguments):
    estimator = Estimator("train.py", source_dir=str(source), role=ROLE,
                          instance_type="ml.p4d.24xlarge", instance_count=2, image_uri=IMAGE,
                          **arguments)
    job = estimator.fit("s3://training-data-bucket/train", job_name=name, wait=False)
    job.poll_seconds = job.describe_seconds = 0
    return estimator, job


def set_status(name: str, status: str, secondary: str, message: str, at: datetime,
               **extra) -> None:
    """What SageMaker does to the job, done to moto's backend object."""
    job = sagemaker_backend().training_jobs[name]
    if job.secondary_status_transitions and not getattr(job, "_driven", False):
        job.secondary_status_transitions = []  # moto's own canned transition
        job._driven = True
    job.training_job_status, job.secondary_status, job.last_modified_time = status, secondary, at
    job.secondary_status_transitions.append(
        {"Status": secondary, "StartTime": at, "StatusMessage": message})
    for key, value in extra.items():
        setattr(job, key, value)


def put_logs(streams: dict[str, list[tuple[int, str]]]) -> None:
    """Events as the hosts would write them: {host stream: [(ms after NOW_MS, message)]}."""
    logs = boto3.client("logs")
    for stream, events in streams.items():
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=[
            {"timestamp": NOW_MS + offset, "message": message} for offset, message in events])


class Timeline:
    """The job's future: one step per `sleep()` of the waiting loop."""

    def __init__(self, *steps: Callable[[], None]) -> None:
        self.steps = list(steps)
        self.sleeps = 0

    def __call__(self, seconds: float) -> None:
        self.sleeps += 1
        if self.steps:
            self.steps.pop(0)()


HOST_1, HOST_2 = "follow-me/algo-1-1767322800", "follow-me/algo-2-1767322800"


def test_wait_prints_transitions_and_both_hosts_logs_in_time_order(aws, source, capsys):
    _, job = start_job(source)
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    set_status("follow-me", "InProgress", "Starting", "Launching requested ML instances",
               utc(3, 4, 5))
    put_logs({"other-job/algo-1-1": [(0, "not this job")]})

    def training_starts():
        set_status("follow-me", "InProgress", "Downloading", "Downloading the training image",
                   utc(3, 5))
        set_status("follow-me", "InProgress", "Training",
                   "Training image download completed. Training in progress.", utc(3, 5))
        put_logs({HOST_2: [(5, "[algo-2] step 1"), (20, "[algo-2] step 2")],
                  HOST_1: [(0, "[algo-1] step 1"), (10, "[algo-1] step 2"),
                           (20, "[algo-1] step 2 done")]})

    def more_logs():  # same timestamp as an event already printed: printed once, in order
        put_logs({HOST_1: [(20, "[algo-1] late line at the same ms"), (40, "[algo-1] step 3")],
                  HOST_2: [(30, "[algo-2] step 3")]})

    def completes():
        put_logs({HOST_2: [(50, "[algo-2] saved")], HOST_1: [(45, "[algo-1] saved")]})
        set_status("follow-me", "InProgress", "Uploading", "Uploading generated training model",
                   utc(4, 0), training_time_in_seconds=3000, billable_time_in_seconds=2900)
        set_status("follow-me", "Completed", "Completed", "Training job completed", utc(4, 0))

    job.sleep = Timeline(training_starts, more_logs, completes)
    job.wait()
    lines = capsys.readouterr().out.splitlines()
    # the display's last word: how long the client followed the job (issue 35.6)
    ran = [line for line in lines if re.fullmatch(r"\[meshtrain\] follow-me: ran \d+:\d\d:\d\d",
                                                 line)]
    assert len(ran) == 1, lines
    assert [line for line in lines if line not in ran] == [
        "[meshtrain] job follow-me · logs: meshtrain logs follow-me -f (CloudWatch log group "
        "/aws/sagemaker/TrainingJobs, streams follow-me/*) · stop: meshtrain stop follow-me "
        "(Ctrl-C only stops following it)",
        "2026-01-02 03:04:05 Starting - Launching requested ML instances",
        "2026-01-02 03:05:00 Downloading - Downloading the training image",
        "2026-01-02 03:05:00 Training - Training image download completed. Training in progress.",
        "[algo-1] step 1",
        "[algo-2] step 1",
        "[algo-1] step 2",
        "[algo-1] step 2 done",
        "[algo-2] step 2",
        "[algo-1] late line at the same ms",
        "[algo-2] step 3",
        "[algo-1] step 3",
        "2026-01-02 04:00:00 Uploading - Uploading generated training model",
        "2026-01-02 04:00:00 Completed - Training job completed",
        "[algo-1] saved",
        "[algo-2] saved",
        "Training seconds: 6000",
        "Billable seconds: 5800",
    ]
    assert job.model_data == f"s3://{DEFAULT_BUCKET}/follow-me/output/model.tar.gz"


def test_logs_prints_everything_so_far_merged(aws, source, capsys):
    _, job = start_job(source)
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    put_logs({HOST_2: [(1, "b1"), (3, "b2")], HOST_1: [(0, "a1"), (2, "a2"), (3, "a3")]})
    job.logs()
    assert capsys.readouterr().out.splitlines() == ["a1", "b1", "a2", "a3", "b2"]


def test_failed_job_raises_with_the_failure_reason(aws, source, capsys):
    _, job = start_job(source, name="will-fail")
    set_status("will-fail", "InProgress", "Training", "Training in progress.", utc(5, 0))
    reason = 'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "OOM on rank 3"'
    job.sleep = Timeline(lambda: set_status("will-fail", "Failed", "Failed",
                                            "Training job failed", utc(5, 1),
                                            failure_reason=reason))
    with pytest.raises(JobFailedError) as error:
        job.wait(logs=False)
    assert error.value.reason == reason
    assert error.value.job_name == "will-fail"
    assert "2026-01-02 05:01:00 Failed - Training job failed" in capsys.readouterr().out


def test_stop_is_sent_and_a_stopped_job_does_not_raise(aws, source, stop_training_job, capsys):
    _, job = start_job(source, name="stop-me")
    set_status("stop-me", "InProgress", "Training", "Training in progress.", utc(6, 0))
    job.stop()
    assert stop_training_job == ["stop-me"]
    assert aws.find("SageMaker.StopTrainingJob")[0].json() == {"TrainingJobName": "stop-me"}
    assert job.status == "Stopping"
    job.sleep = Timeline(lambda: set_status("stop-me", "Stopped", "Stopped",
                                            "Training job stopped", utc(6, 2)))
    job.wait(logs=False)
    out = capsys.readouterr().out
    assert "2026-01-02 06:02:00 Stopped - Training job stopped" in out
    assert "Training job stop-me was stopped." in out


def test_live_display_on_a_terminal(aws, source):
    _, job = start_job(source, name="live")
    set_status("live", "InProgress", "Training", "Training in progress.", utc(7, 0))
    screen = io.StringIO()
    job.console = Console(file=screen, force_terminal=True, width=160, color_system=None)
    job.sleep = Timeline(lambda: set_status("live", "Completed", "Completed",
                                            "Training job completed", utc(7, 30)))
    job.wait(logs=False)
    text = screen.getvalue()
    assert "live: InProgress / Training - Training in progress." in text  # the live line
    assert "2026-01-02 07:30:00 Completed - Training job completed" in text
    assert "\x1b[" in text  # drawn with terminal control sequences, not plain lines


def test_load_spec_rebuilds_the_job_and_resubmits_from_s3(aws, source):
    estimator, _ = start_job(
        source, name="attach-me", distribution=SMP,
        hyperparameters={"epochs": 2},
        checkpoint_s3_uri="s3://ckpt-bucket/run", checkpoint_local_path="/opt/ml/checkpoints",
        use_spot_instances=True, max_run=3600, max_wait=7200, volume_size=100,
        container_log_level=10)
    backend = SageMakerBackend()
    spec = backend.load_spec("attach-me")
    original = estimator.build_spec("s3://training-data-bucket/train", job_name="attach-me")
    same = ("job_name", "entry_point", "distribution", "instance_type", "instance_count",
            "inputs", "input_content_types", "checkpoint_s3_uri", "checkpoint_local_path",
            "max_run", "max_wait", "use_spot_instances", "volume_size", "input_mode",
            "image_uri", "role", "container_log_level")
    assert {k: getattr(spec, k) for k in same} == {k: getattr(original, k) for k in same}
    assert spec.hyperparameters == {"epochs": 2}  # mp_parameters went back into distribution
    assert spec.source_dir == f"s3://{DEFAULT_BUCKET}/attach-me/source/sourcedir.tar.gz"
    assert spec.output_path == f"s3://{DEFAULT_BUCKET}/"
    assert backend.attach("attach-me").describe()["TrainingJobName"] == "attach-me"

    aws.requests.clear()
    backend.submit(spec.model_copy(update={"job_name": "attach-me-again"}))
    assert not any(op.startswith("S3 PUT") for op in aws.operations())  # code reused from S3
    (create,) = aws.find("SageMaker.CreateTrainingJob")
    assert create.json()["HyperParameters"]["sagemaker_submit_directory"] == (
        f'"s3://{DEFAULT_BUCKET}/attach-me/source/sourcedir.tar.gz"')


def test_attach_to_a_missing_job_is_a_config_error(aws):
    from meshtrain import ConfigError

    with pytest.raises(ConfigError, match="no SageMaker training job named 'ghost'"):
        SageMakerBackend().attach("ghost")
