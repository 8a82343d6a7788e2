"""A job's layout as describe()["Layout"], `meshtrain describe` and `meshtrain list --wide` show
it (meshtrain.job_layout), from a JobSpec and from a SageMaker DescribeTrainingJob; the plural
of hosts and processes in messages; the one-line Ctrl-C report."""

from __future__ import annotations

import argparse
import sys

import pytest

from meshtrain import Estimator
from meshtrain.cli_list import list_jobs
from meshtrain.cli_views import describe_job
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.job import reported_interrupt, was_reported
from meshtrain.job_layout import layout_brief, layout_of_description, layout_of_spec, layout_rows

TP_EP = {"torch_distributed": {"enabled": True, "processes_per_host": 2},
         "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
             "tensor_parallel_degree": 2, "expert_parallel_degree": 2,
             "hybrid_shard_degree": 1}}}}


def spec(**fields) -> JobSpec:
    return JobSpec(**{"job_name": "mixtral-ep-1", "entry_point": "train.py",
                      "source_dir": "/home/me/mixtral", "instance_count": 2,
                      "distribution": TP_EP, **fields})


def test_the_layout_of_a_spec_resolves_degrees_and_axes():
    layout = layout_of_spec(spec())
    assert layout == {
        "EntryPoint": "train.py", "SourceDir": "/home/me/mixtral", "InstanceCount": 2,
        "ProcessesPerHost": 2, "WorldSize": 4, "Distribution": "smdistributed.modelparallel",
        "Degrees": {"pipeline_parallel_degree": 1, "replicate_degree": 2,
                    "hybrid_shard_degree": 1, "tensor_parallel_degree": 2,
                    "context_parallel_degree": 1, "expert_parallel_degree": 2,
                    "sharding_strategy": "no_shard"},
        "MeshAxes": {"pp": 1, "replicate": 2, "shard": 1, "tp": 2},
        "Mesh": "pp 1 x replicate 2 x shard 1 x tp 2 (ep 2 within shard x tp)"}
    assert layout_rows(layout) == [
        ("Script", "train.py (source: /home/me/mixtral)"),
        ("Hosts", "2 hosts x 2 processes = 4 ranks; smdistributed.modelparallel"),
        ("Layout", "pp 1 x replicate 2 x shard 1 x tp 2 (ep 2 within shard x tp); no_shard")]
    assert layout_brief(layout) == "2x2 replicate2·tp2·ep2"
    plain = layout_of_spec(spec(distribution=None, instance_count=1))
    assert plain["ProcessesPerHost"] == 1 and plain["Distribution"] == "none"
    assert "Degrees" not in plain and layout_brief(plain) == "1x1" and layout_brief(None) == "-"


def test_a_sagemaker_description_gives_the_same_layout_with_the_instances_gpus():
    sent = spec(instance_type="ml.p4d.24xlarge", distribution={
        "torch_distributed": {"enabled": True},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 8, "tensor_parallel_degree": 2}}}})
    description = {"HyperParameters": sent.container_hyperparameters(
        "s3://bucket/mixtral-ep-1/source/sourcedir.tar.gz"),
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2}}
    layout = layout_of_description(description)
    assert layout["ProcessesPerHost"] == 8 and layout["WorldSize"] == 16  # 8 GPUs per p4d
    assert layout["SourceDir"] == "s3://bucket/mixtral-ep-1/source/sourcedir.tar.gz"
    assert layout["MeshAxes"] == {"pp": 1, "replicate": 1, "shard": 8, "tp": 2}
    assert layout_of_description({"ResourceConfig": {}}) is None


def test_describe_prints_the_layout_rows(capsys):
    describe_job({"TrainingJobName": "mixtral-ep-1", "TrainingJobStatus": "Completed",
                  "ResourceConfig": {"InstanceType": "local", "InstanceCount": 2},
                  "Layout": layout_of_spec(spec())})
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:6] == [
        "Instances: 2 x local", "Script:    train.py (source: /home/me/mixtral)",
        "Hosts:     2 hosts x 2 processes = 4 ranks; smdistributed.modelparallel",
        "Layout:    pp 1 x replicate 2 x shard 1 x tp 2 (ep 2 within shard x tp); no_shard"]


def test_list_has_a_script_column_and_a_wide_view(monkeypatch, capsys):
    rows = [{"TrainingJobName": "mixtral-ep-1", "TrainingJobStatus": "Failed",
             "CreationTime": 0.0, "TrainingEndTime": 65.0, "Layout": layout_of_spec(spec()),
             "FailureReason": "AlgorithmError: " + "x" * 100},
            {"TrainingJobName": "remote", "TrainingJobStatus": "InProgress",
             "CreationTime": 1.0}]  # a SageMaker listing row: no layout
    monkeypatch.setattr("meshtrain.cli_list._summaries", lambda *_: rows)
    args = argparse.Namespace(backend="local", sagemaker=False, kubernetes=False, max=50,
                              jobs_dir=None, region=None, namespace=None, kubeconfig=None,
                              kube_context=None, wide=False)
    assert list_jobs(args) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert narrow[0].split() == ["NAME", "STATUS", "CREATED", "DURATION", "SCRIPT", "REASON"]
    assert narrow[1].split()[5:7] == ["train.py", "AlgorithmError:"]  # CREATED: 2 words
    assert narrow[1].endswith("x...") and narrow[2].split()[-1] == "-"
    args.wide = True
    assert list_jobs(args) == 0
    wide = capsys.readouterr().out.splitlines()
    assert wide[0].split()[4:] == ["SCRIPT", "LAYOUT", "SOURCE", "REASON"]
    assert wide[1].split()[5:9] == ["train.py", "2x2", "replicate2·tp2·ep2", "/home/me/mixtral"]
    assert wide[1].endswith("x" * 100)  # the reason whole
    assert wide[2].split()[-3:] == ["-", "-", "-"]


def test_messages_count_one_host_as_one_host(tmp_path):
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ConfigError, match=r"world size 2 \(1 host x 2 processes\)\."):
        Estimator("train.py", source_dir=str(tmp_path), distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "tensor_parallel_degree": 3}}}})


def test_a_reported_interrupt_is_one_line_and_no_traceback(capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *error: seen.append(error[1]))
    interrupt = reported_interrupt("Ctrl-C: stopped job j.")
    assert isinstance(interrupt, KeyboardInterrupt) and was_reported(interrupt)
    assert capsys.readouterr().err == "meshtrain: Ctrl-C: stopped job j.\n"
    sys.excepthook(KeyboardInterrupt, interrupt, None)  # an uncaught end: nothing more
    other = KeyboardInterrupt()
    sys.excepthook(KeyboardInterrupt, other, None)  # any other exception: as before
    assert seen == [other] and not was_reported(other)
    reported_interrupt("again", say=False)  # the hook is installed once
    assert capsys.readouterr().err == ""
    sys.excepthook(KeyboardInterrupt, other, None)
    assert seen == [other, other]
