"""Paper cuts of the Estimator (issue 11): did-you-mean for keywords and entry points, the
runtime's refusals made at the client by the same functions, degenerate layouts reported once."""

from __future__ import annotations

import pytest

from meshtrain import ConfigError, Estimator
from meshtrain.contract import support
from meshtrain.contract.distribution import SMPParameters
from meshtrain.targets import local_gpu_count


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    (root / "models").mkdir(parents=True)
    (root / "train.py").write_text("print('hello from the job', flush=True)\n")
    (root / "models" / "llama.py").write_text("")
    return root


def smp(ppn=2, **parameters):
    return {"torch_distributed": {"enabled": True, "processes_per_host": ppn},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


@pytest.mark.parametrize(("keyword", "meant"), [
    ("instance_typ", "instance_type"), ("volume_sise", "volume_size"),
    ("hyperparamters", "hyperparameters"), ("output_pth", "output_path"),
    ("checkpoint_s3_url", "checkpoint_s3_uri"), ("max_wiat", "max_wait"),
])
def test_unknown_keyword_suggests_the_estimators_own_argument(source, keyword, meant):
    with pytest.raises(ConfigError) as error:
        Estimator("train.py", source_dir=str(source), **{keyword: 1})
    message = str(error.value)
    assert message.startswith(f"Estimator got an unexpected keyword argument {keyword!r}. "
                              f"Did you mean {meant!r}?")
    assert "not honoured by local jobs" not in message


def test_unknown_keyword_lists_every_target_kinds_options_from_the_table(source, monkeypatch):
    from dataclasses import replace

    from meshtrain import targets

    # a kind added to the table shows in the message with no message edited
    extra = replace(targets.TARGET_KINDS[0], name="example", title="Example Cloud",
                    matches=lambda t: t == "example", options=lambda: frozenset({"zone"}))
    monkeypatch.setattr(targets, "TARGET_KINDS", (*targets.TARGET_KINDS, extra))
    with pytest.raises(ConfigError) as error:
        Estimator("train.py", source_dir=str(source), zzz=1)
    listed = str(error.value).split("backend options: ", 1)[1]
    for title in ("local", "local Docker", "SageMaker", "Kubernetes", "Slurm"):
        assert f"({title})" in listed
    assert "jobs_dir, shm_size, volumes (local Docker)" in listed
    assert "zone (Example Cloud)" in listed


def test_backend_options_still_work(source, tmp_path, capsys):
    jobs = tmp_path / "jobs"
    estimator = Estimator("train.py", source_dir=str(source), jobs_dir=str(jobs))
    assert estimator.backend.jobs_dir == jobs
    remote = Estimator("train.py", source_dir=str(source), instance_type="ml.p4d.24xlarge",
                       subnets=["subnet-1"], security_group_ids=["sg-1"], sagemaker_session=None)
    assert remote.backend_options["subnets"] == ["subnet-1"]
    # a SageMaker notebook run locally: its SageMaker-only arguments are dropped with one line
    local = Estimator("train.py", source_dir=str(source), subnets=["s"], security_group_ids=["g"],
                      sagemaker_session=object(), debugger_hook_config=False)
    assert local.backend_options == {}
    assert capsys.readouterr().err.splitlines() == [
        "meshtrain: local jobs ignore the SageMaker-only argument(s) debugger_hook_config, "
        "sagemaker_session, security_group_ids, subnets."]
    with pytest.raises(ConfigError, match="Kubernetes options, not honoured by local jobs"):
        Estimator("train.py", source_dir=str(source), namespace="team-a")


@pytest.mark.parametrize(("typo", "meant"), [("trian.py", "train.py"),
                                             ("models/lama.py", "models/llama.py"),
                                             ("Train.py", "train.py")])
def test_entry_point_typo_suggests_a_file_in_source_dir(source, typo, meant):
    with pytest.raises(ConfigError, match=f"Did you mean '{meant}'"):
        Estimator(typo, source_dir=str(source))


def test_entry_point_without_match_lists_the_scripts(source):
    with pytest.raises(ConfigError, match=r"Scripts there: models/llama.py, train.py"):
        Estimator("zzzzzz.py", source_dir=str(source))


@pytest.mark.parametrize(("parameters", "tp"), [
    ({"sequence_parallel": True}, 1),
    ({"loss_parallel": True}, 1),
    ({"fp8": True, "tensor_parallel_degree": 2}, 2)])
def test_runtime_refusals_happen_at_the_client_with_the_runtimes_message(source, parameters, tp):
    with pytest.raises(ConfigError) as client:
        Estimator("train.py", source_dir=str(source), instance_type="ml.p5.48xlarge",
                  distribution=smp(ppn=None, **parameters))
    with pytest.raises(ConfigError) as runtime:
        support.check_build_support(SMPParameters(**parameters), tensor_parallel_degree=tp)
    assert str(client.value) == str(runtime.value)


def test_fp8_on_a_local_host_without_gpus(source):
    if local_gpu_count():
        pytest.skip("this machine has GPUs: whether they have float8 tensor cores is the "
                    "runtime's check")
    with pytest.raises(ConfigError, match="float8 tensor cores") as client:
        Estimator("train.py", source_dir=str(source), distribution=smp(fp8=True))
    assert "the ranks run on the CPU" in str(client.value)
    # GPU instances are checked by the runtime (compute capability, torchao): accepted here
    Estimator("train.py", source_dir=str(source), instance_type="ml.p5.48xlarge",
              distribution=smp(ppn=None, fp8=True))


def test_cpu_offload_on_a_local_host_without_gpus(source):
    if local_gpu_count():
        pytest.skip("this machine has GPUs: cpu_offload is valid here")
    with pytest.raises(ConfigError, match="cpu_offload=True moves parameters"):
        Estimator("train.py", source_dir=str(source), distribution=smp(cpu_offload=True))
    # SageMaker GPU instances can offload: not refused there.
    Estimator("train.py", source_dir=str(source), instance_type="ml.p4d.24xlarge",
              distribution=smp(ppn=None, cpu_offload=True))


def test_the_runtime_calls_the_same_check_functions():
    pytest.importorskip("torch")
    from meshtrain_runtime import parallelize
    from meshtrain_runtime.parallel import float8, fsdp

    assert parallelize.check_build_support is support.check_build_support
    assert fsdp.check_cpu_offload is support.check_cpu_offload
    assert float8.check_fp8_device is support.check_fp8_device
    with pytest.raises(ConfigError, match="nothing to offload from"):
        fsdp.resolve_offload_policy(True, "cpu")


def test_a_degenerate_layout_is_noted():
    from meshtrain.contract.degrees import resolve_degrees

    params = SMPParameters(sharding_strategy="hybrid_shard")
    notes = support.degenerate_layout_notes(params, resolve_degrees(params, 2, ranks_per_host=1))
    assert len(notes) == 1 and "resolves to hybrid_shard_degree=1 in world size 2" in notes[0]
    fine = resolve_degrees(params, 4, ranks_per_host=2)
    assert support.degenerate_layout_notes(params, fine) == []


@pytest.mark.multiprocess
def test_fit_reports_a_degenerate_layout_once(source, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    estimator = Estimator("train.py", source_dir=str(source), instance_count=2,
                          distribution=smp(ppn=1, sharding_strategy="hybrid_shard"),
                          jobs_dir=str(tmp_path / "jobs"))
    estimator.fit(job_name="degenerate")
    captured = capsys.readouterr()
    assert captured.err.count("resolves to hybrid_shard_degree=1 in world size 2") == 1
    assert captured.err.startswith("meshtrain: warning: sharding_strategy='hybrid_shard'")
    assert captured.out.count("hello from the job") == 2


@pytest.mark.parametrize(("field", "value"), [("volume_size", "big"), ("tags", [{"Key": 1}]),
                                              ("output_path", 5)])
def test_pydantic_errors_become_config_errors(field, value):
    """The last guard behind the explicit checks: JobSpec's ValidationError, in house style."""
    from pydantic import ValidationError

    from meshtrain.contract._messages import arguments_error_from
    from meshtrain.contract.jobspec import JobSpec

    with pytest.raises(ValidationError) as raw:
        JobSpec(job_name="j", entry_point="t.py", source_dir="/s", **{field: value})
    error = arguments_error_from(raw.value, what="Estimator")
    assert isinstance(error, ConfigError)
    assert str(error).startswith(f"Invalid Estimator argument(s): {field}")
    assert "Pass the type shown" in str(error) and "pydantic" not in str(error)


def test_tensor_parallelism_across_hosts_is_warned_with_the_arithmetic(source):
    """tp 8 on 2 hosts of 4 GPUs runs, but every layer's collectives cross the network."""
    estimator = Estimator("train.py", source_dir=str(source), instance_type="ml.g5.12xlarge",
                          instance_count=2, role="arn:aws:iam::123456789012:role/x",
                          image_uri="x:1", distribution=smp(ppn=None, tensor_parallel_degree=8))
    notes = [note for note in estimator._layout_notes if "spans hosts" in note]
    assert notes == [
        "tensor_parallel_degree=8 spans hosts: each host runs 4 processes, so every "
        "tensor-parallel group of 8 ranks spans 2 hosts, and every layer's all-reduces and "
        "all-gathers cross the network between hosts instead of the links within one (usually "
        "several times slower). Keep tensor_parallel_degree a divisor of 4 and scale across "
        "hosts with hybrid_shard_degree or data parallelism."]


@pytest.mark.parametrize(("hosts", "ppn", "tp", "warned"), [
    (2, 4, 4, False), (2, 2, 2, False), (1, 8, 8, False), (2, 6, 4, True), (4, 2, 8, True)])
def test_tensor_parallel_groups_within_a_host_are_not_warned(source, hosts, ppn, tp, warned):
    config = SMPParameters(tensor_parallel_degree=tp)
    from meshtrain.contract.degrees import resolve_degrees
    from meshtrain.contract.distribution import DistributionConfig
    from meshtrain.estimator_checks import layout_notes

    distribution = DistributionConfig.from_dict(smp(ppn=ppn, tensor_parallel_degree=tp))
    degrees = resolve_degrees(config, hosts * ppn, ranks_per_host=ppn)
    notes = layout_notes(distribution, degrees, ppn)
    assert any("spans hosts" in note for note in notes) == warned
    if warned and tp % ppn:
        assert "straddle hosts" in notes[-1]
