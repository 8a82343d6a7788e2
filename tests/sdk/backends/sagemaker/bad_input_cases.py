"""The catalogue of bad inputs (and valid controls) for test_bad_inputs.py.

Each case is (Estimator arguments, fit arguments, part of the message); arguments may be
callables of the test's Paths, for values that need a real file. Local cases run against
``jobs_dir=<tmp>/jobs``; the SageMaker target's are in bad_input_cases_ml.py (run against
moto, see conftest.py), the command lines in bad_input_cases_cli.py.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sagemaker_moto import ROLE

IMAGE = "pytorch-training:2.5.1-gpu-py311"
TD = {"torch_distributed": {"enabled": True, "processes_per_host": 2}}
ML = {"instance_type": "ml.p4d.24xlarge", "role": ROLE, "image_uri": IMAGE}


def smp(ppn: int = 2, **parameters: Any) -> dict:
    return {"torch_distributed": {"enabled": True, "processes_per_host": ppn},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


def huge_set(paths: Paths) -> set[int]:
    """A value whose repr takes 1.3 million characters (made per test, not at import)."""
    return set(range(200_000))


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


@dataclass(frozen=True)
class Paths:
    """Files a case may point at, made fresh for every test."""

    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def a_file(self) -> Path:
        return self.src / "train.py"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def variant(self, name: str) -> str:
        """A copy of the source dir with one bad entry (`name`)."""
        root = self.root / f"src-{name}"
        root.mkdir()
        (root / "train.py").write_text("print('x')\n")
        if name == "escaping-link":
            (root / "secrets").symlink_to("/etc/passwd")
        elif name == "escaping-dir-link":
            (root / "etc").symlink_to("/etc", target_is_directory=True)
        elif name == "dangling-link":
            (root / "gone").symlink_to(root / "nothing-here")
        elif name == "fifo":
            os.mkfifo(root / "pipe")
        elif name == "socket":
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(str(root / "sock"))
        elif name == "huge":
            with open(root / "weights.bin", "wb") as handle:  # sparse: no disk space used
                handle.truncate(300 * 2**20)
        elif name == "nested-fifo":
            (root / "pkg").mkdir()
            os.mkfifo(root / "pkg" / "pipe")
        return str(root)


def make(paths: Paths, value: Any, depth: int = 0) -> Any:
    """Resolve callables (of Paths) in a case's arguments (to a few levels: deep values are
    the cases' own nesting tests)."""
    if callable(value):
        return value(paths)
    if depth < 6 and isinstance(value, dict):
        return {k: make(paths, v, depth + 1) for k, v in value.items()}
    if depth < 6 and isinstance(value, list):
        return [make(paths, v, depth + 1) for v in value]
    return value


def variant(name: str) -> Any:
    return lambda p: p.variant(name)


def data(p: Paths) -> str:
    return str(p.data)


_SOURCE = {
    "entry-none": ({"entry_point": None}, {}, "entry_point must be"),
    "entry-int": ({"entry_point": 123}, {}, "entry_point must be"),
    "entry-empty": ({"entry_point": ""}, {}, "entry_point must be"),
    "entry-typo": ({"entry_point": "trian.py"}, {}, "Did you mean 'train.py'"),
    "entry-typo-in-pkg": ({"entry_point": "pkg/modle.py"}, {}, "Did you mean 'pkg/model.py'"),
    "entry-parent": ({"entry_point": "../train.py"}, {}, "inside source_dir"),
    "entry-absolute": ({"entry_point": "/etc/hostname"}, {}, "inside source_dir"),
    "entry-nul": ({"entry_point": "tr\x00ain.py"}, {}, "entry_point must be"),
    "entry-is-dir": ({"entry_point": "pkg"}, {}, "is not a file in source_dir"),
    "entry-no-source-missing": ({"entry_point": "/no/such/train.py", "source_dir": None}, {},
                                "is not a file in the directory"),
    "source-missing": ({"source_dir": "/no/such/dir"}, {}, "is not a directory"),
    "source-int": ({"source_dir": 5}, {}, "source_dir must be"),
    "source-empty": ({"source_dir": ""}, {}, "source_dir must be"),
    "source-is-file": ({"source_dir": lambda p: str(p.a_file)}, {}, "is not a directory"),
    "source-nul": ({"source_dir": "/tmp/a\x00b"}, {}, "source_dir must be"),
    "source-escaping-link": ({"source_dir": variant("escaping-link")}, {}, "outside"),
    "source-escaping-dir-link": ({"source_dir": variant("escaping-dir-link")}, {}, "outside"),
    "source-dangling-link": ({"source_dir": variant("dangling-link")}, {}, "does not exist"),
    "source-fifo": ({"source_dir": variant("fifo")}, {}, "is a FIFO"),
    "source-nested-fifo": ({"source_dir": variant("nested-fifo")}, {}, "is a FIFO"),
    "source-socket": ({"source_dir": variant("socket")}, {}, "is a socket"),
    "source-huge": ({"source_dir": variant("huge")}, {}, "Biggest: "),
    "shell-entry-torchrun": ({"entry_point": "run.sh", "distribution": TD}, {}, "*.py"),
    "deps-str": ({"dependencies": "lib"}, {}, "dependencies must be a list"),
    "deps-missing": ({"dependencies": ["/no/such/lib"]}, {}, "does not exist"),
    "deps-int": ({"dependencies": [5]}, {}, "is not a path"),
    "deps-same-name": ({"dependencies": [lambda p: str(p.src / "pkg"),
                                         lambda p: str(p.src / "pkg")]}, {}, "same name"),
    "deps-fifo": ({"dependencies": [variant("fifo")]}, {}, "is a FIFO"),
    "deps-escaping-link": ({"dependencies": [variant("escaping-link")]}, {}, "outside"),
    "deps-huge": ({"dependencies": [variant("huge")]}, {}, "Biggest: "),
}

_HYPERPARAMETERS = {
    "hps-list": ({"hyperparameters": [1, 2]}, {}, "must be a dict"),
    "hps-str": ({"hyperparameters": "lr=1"}, {}, "must be a dict"),
    "hp-int-key": ({"hyperparameters": {1: 2}}, {}, "non-empty strings"),
    "hp-empty-key": ({"hyperparameters": {"": 1}}, {}, "non-empty strings"),
    "hp-key-equals": ({"hyperparameters": {"a=b": 1}}, {}, "hyperparameter name 'a=b'"),
    "hp-key-newline": ({"hyperparameters": {"a\nb": 1}}, {}, "is invalid"),
    "hp-key-space": ({"hyperparameters": {"learning rate": 1}}, {}, "is invalid"),
    "hp-key-dash": ({"hyperparameters": {"-lr": 1}}, {}, "is invalid"),
    "hp-key-tab": ({"hyperparameters": {"a\tb": 1}}, {}, "is invalid"),
    "hp-key-trailing-newline": ({"hyperparameters": {"lr\n": 1}}, {}, "did you mean 'lr'?"),
    "hp-key-huge": ({"hyperparameters": {"k" * 1_400_000 + "\n": 1}}, {}, "kkk...kkk"),
    "hp-huge-repr": ({"hyperparameters": {"ids": huge_set}}, {},
                     "{0, 1, 2, 3, 4, 5, 6, 7, ...} is not JSON-serialisable"),
    "hp-key-long": ({"hyperparameters": {"k" * 300: 1}}, {}, "is invalid"),
    "hp-key-unicode": ({"hyperparameters": {"läng": 1}}, {}, "is invalid"),
    "hp-nan": ({"hyperparameters": {"lr": float("nan")}}, {}, "not a finite number"),
    "hp-inf": ({"hyperparameters": {"lr": float("inf")}}, {}, "not a finite number"),
    "hp-minus-inf": ({"hyperparameters": {"lr": float("-inf")}}, {}, "not a finite number"),
    "hp-nested-nan": ({"hyperparameters": {"s": [1, {"x": float("nan")}]}}, {},
                      "hyperparameters['s'][1]['x']"),
    "hp-object": ({"hyperparameters": {"f": object()}}, {}, "JSON-serialisable"),
    "hp-set": ({"hyperparameters": {"f": {1, 2}}}, {}, "JSON-serialisable"),
    "hp-bytes": ({"hyperparameters": {"f": b"x"}}, {}, "JSON-serialisable"),
    "hp-complex": ({"hyperparameters": {"f": 1j}}, {}, "JSON-serialisable"),
    "hp-path": ({"hyperparameters": {"f": Path("/tmp")}}, {}, "JSON-serialisable"),
    "hp-deep-40": ({"hyperparameters": {"d": deep(40)}}, {}, "deeper than 32"),
    "hp-deep-100000": ({"hyperparameters": {"d": deep(100_000)}}, {}, "deeper than 32"),
    "hp-nested-int-key": ({"hyperparameters": {"d": {1: "a"}}}, {}, "must be strings"),
    "hp-nul-value": ({"hyperparameters": {"s": "a\x00b"}}, {}, "NUL"),
    "hp-too-big-one": ({"hyperparameters": {"blob": "x" * 100_000}}, {}, "Largest: blob"),
    "hp-too-big-many": ({"hyperparameters": {f"k{i}": "x" * 1000 for i in range(80)}}, {},
                        "MAX_ARG_STRLEN"),
    "hp-reserved-program": ({"hyperparameters": {"sagemaker_program": "x.py"}}, {}, "reserved"),
    "hp-reserved-submit": ({"hyperparameters": {"sagemaker_submit_directory": "/x"}}, {},
                           "reserved"),
    "hp-reserved-job-name": ({"hyperparameters": {"sagemaker_job_name": "x"}}, {}, "reserved"),
    "hp-reserved-region": ({"hyperparameters": {"sagemaker_region": "us-east-1"}}, {},
                           "reserved"),
    "hp-reserved-ppn-no-dist": ({"hyperparameters": {
        "sagemaker_mpi_num_of_processes_per_host": 8}}, {}, "does not set it"),
    "hp-reserved-ppn-differs": ({"distribution": TD, "hyperparameters": {
        "sagemaker_mpi_num_of_processes_per_host": 8}}, {}, "encodes 2"),
    "hp-reserved-mp-no-smp": ({"hyperparameters": {"mp_parameters": {"tensor_parallel_degree":
                                                                      2}}}, {}, "reserved"),
    "hp-reserved-mp-differs": ({"distribution": smp(hybrid_shard_degree=2), "hyperparameters": {
        "mp_parameters": {"hybrid_shard_degree": 1}}}, {}, "reserved"),
    "hp-reserved-td-flag": ({"hyperparameters": {"sagemaker_torch_distributed_enabled": True}},
                            {}, "reserved"),
    "hp-reserved-any": ({"hyperparameters": {"sagemaker_whatever": 1}}, {}, "reserved"),
    "hp-reserved-module": ({"hyperparameters": {"default_user_module_name": "m"}}, {},
                           "reserved"),
}

_CLUSTER = {
    "type-none": ({"instance_type": None}, {}, "instance_type must be"),
    "type-int": ({"instance_type": 5}, {}, "instance_type must be"),
    "type-empty": ({"instance_type": ""}, {}, "instance_type must be"),
    "type-unknown": ({"instance_type": "gpu-box"}, {}, "not a known target"),
    "type-typo": ({"instance_type": "locl"}, {}, "Did you mean 'local'"),
    "type-upper": ({"instance_type": "LOCAL"}, {}, "not a known target"),
    "count-zero": ({"instance_count": 0}, {}, "positive int"),
    "count-negative": ({"instance_count": -1}, {}, "positive int"),
    "count-str": ({"instance_count": "2"}, {}, "positive int"),
    "count-float": ({"instance_count": 2.0}, {}, "positive int"),
    "count-bool": ({"instance_count": True}, {}, "positive int"),
    "count-none": ({"instance_count": None}, {}, "positive int"),
    "count-10000": ({"instance_count": 10_000}, {}, "10000 ranks"),
    "count-million": ({"instance_count": 10**6}, {}, "ranks per core"),
    "ppn-10000": ({"distribution": {"torch_distributed": {"enabled": True,
                                                          "processes_per_host": 10_000}}},
                  {}, "processes_per_host=10000 = 10000 ranks"),
    "hosts-x-ppn": ({"instance_count": 500, "distribution": TD}, {}, "= 1000 ranks"),
    "ppn-zero": ({"distribution": {"torch_distributed": {"enabled": True,
                                                         "processes_per_host": 0}}},
                 {}, "processes_per_host"),
    "ppn-str": ({"distribution": {"torch_distributed": {"enabled": True,
                                                        "processes_per_host": "2"}}},
                {}, "processes_per_host"),
    "ppn-float": ({"distribution": {"torch_distributed": {"enabled": True,
                                                          "processes_per_host": 1.5}}},
                  {}, "processes_per_host"),
    "ppn-without-torchrun": ({"distribution": {"torch_distributed": {"processes_per_host": 2}}},
                             {}, "torch_distributed is not enabled: without torchrun"),
    "ppn-torchrun-disabled": ({"distribution": {"torch_distributed": {
        "enabled": False, "processes_per_host": 4}}}, {}, "'enabled': True, 'processes_per_host'"
                                                          ": 4"),
    "local-gpu-hosts": ({"instance_type": "local_gpu", "instance_count": 2}, {},
                        "instance_count=1"),
}

_DISTRIBUTION = {
    "dist-str": ({"distribution": "torchrun"}, {}, "distribution must be a dict"),
    "dist-list": ({"distribution": [1]}, {}, "distribution must be a dict"),
    "dist-mpi": ({"distribution": {"mpi": {"enabled": True}}}, {}, "torch_distributed"),
    "dist-ddp": ({"distribution": {"pytorchddp": {"enabled": True}}}, {}, "torch_distributed"),
    "dist-smddp": ({"distribution": {"smdistributed": {"dataparallel": {"enabled": True}}}},
                   {}, "SMDDP"),
    "dist-enabled-str": ({"distribution": {"torch_distributed": {"enabled": "yes"}}}, {},
                         "torch_distributed.enabled"),
    "dist-key-typo": ({"distribution": {"torch_distributed": {"enabld": True}}}, {},
                      "Did you mean 'enabled'"),
    "dist-top-typo": ({"distribution": {"torch_distributd": {"enabled": True}}}, {},
                      "Did you mean 'torch_distributed'"),
    "dist-smp-no-torchrun": ({"distribution": {"smdistributed": {"modelparallel": {
        "enabled": True}}}}, {}, "runs under torchrun"),
    "dist-smd-not-dict": ({"distribution": {"smdistributed": 1}}, {}, "must be a dict"),
    "smp-typo": ({"distribution": smp(tensor_paralel_degree=2)}, {}, "Did you mean"),
    "smp-tp-3": ({"instance_count": 2, "distribution": smp(tensor_parallel_degree=3)}, {},
                 "tensor_parallel_degree=3 does not divide world size 4 (2 hosts x 2 processes)"),
    "smp-hsd-3": ({"distribution": smp(hybrid_shard_degree=3)}, {}, "does not divide"),
    "smp-tp-str": ({"distribution": smp(tensor_parallel_degree="2")}, {},
                   "tensor_parallel_degree"),
    "smp-cp-3": ({"distribution": smp(context_parallel_degree=3)}, {},
                 "context_parallel_degree=3 must divide the resolved hybrid_shard_degree=2 "
                 "(world size 2"),
    "smp-cp-hsd": ({"instance_count": 2, "distribution": smp(context_parallel_degree=2,
                                                             hybrid_shard_degree=1)}, {},
                   "context_parallel_degree=2 > hybrid_shard_degree=1"),
    "smp-cp-comm": ({"distribution": smp(context_parallel_degree=2, cp_comm_type="ring")}, {},
                    "cp_comm_type"),
    "smp-cp-pp": ({"instance_count": 2, "distribution": smp(context_parallel_degree=2,
                                                            pipeline_parallel_degree=2,
                                                            microbatches=2)}, {},
                  "context_parallel_degree=2 with pipeline_parallel_degree=2"),
    "smp-cp-ep": ({"distribution": smp(context_parallel_degree=2, expert_parallel_degree=2)},
                  {}, "context_parallel_degree=2 with expert_parallel_degree=2"),
    "smp-sp-no-tp": ({"distribution": smp(sequence_parallel=True)}, {}, "sequence_parallel=True"),
    "smp-lp-no-tp": ({"distribution": smp(loss_parallel=True)}, {}, "loss_parallel=True"),
    "smp-ep-and-tp": ({"instance_count": 2, "distribution": smp(tensor_parallel_degree=2,
                                                                expert_parallel_degree=3)},
                      {}, "expert_parallel_degree=3 must divide"),
    "smp-offload-no-ac": ({"distribution": smp(activation_offloading=True)}, {},
                          "activation_checkpointing"),
    "smp-precision": ({"distribution": smp(mixed_precision="int8")}, {}, "mixed_precision"),
    "smp-strategy": ({"distribution": smp(sharding_strategy="zero3")}, {}, "sharding_strategy"),
    "smp-no-shard-hsd": ({"distribution": smp(sharding_strategy="no_shard",
                                              hybrid_shard_degree=2)}, {}, "contradicts"),
    "smp-params-list": ({"distribution": {**TD, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": [1]}}}}, {}, "must be a dict or a path"),
    "smp-params-missing-file": ({"distribution": {**TD, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": "/no/such.json"}}}}, {}, "not an existing file"),
    "smp-params-not-json": ({"distribution": {**TD, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": lambda p: str(p.a_file)}}}}, {}, "cannot parse"),
    "smp-ep-3": ({"distribution": smp(expert_parallel_degree=3)}, {}, "expert_parallel_degree"),
}

_VALUES = {
    "env-list": ({"environment": ["A=1"]}, {}, "environment must be a dict"),
    "env-digit-name": ({"environment": {"1X": "a"}}, {}, "environment variable name"),
    "env-equals-name": ({"environment": {"A=B": "a"}}, {}, "environment variable name"),
    "env-name-trailing-newline": ({"environment": {"HOME_DIR\n": "a"}}, {},
                                  "did you mean 'HOME_DIR'?"),
    "env-huge-value": ({"environment": {"X": lambda p: list(range(200_000))}}, {},
                       "[0, 1, 2, 3, 4, 5, 6, 7, ...]"),
    "env-empty-name": ({"environment": {"": "a"}}, {}, "environment variable name"),
    "env-int-name": ({"environment": {1: "a"}}, {}, "environment variable name"),
    "env-int-value": ({"environment": {"X": 1}}, {}, "must be a string"),
    "env-none-value": ({"environment": {"X": None}}, {}, "must be a string"),
    "env-nul-value": ({"environment": {"X": "a\x00b"}}, {}, "NUL"),
    "env-too-big": ({"environment": {f"V{i}": "x" * 10_000 for i in range(20)}}, {},
                    "environment takes"),
    "max-run-zero": ({"max_run": 0}, {}, "max_run must be"),
    "max-run-negative": ({"max_run": -5}, {}, "max_run must be"),
    "max-run-str": ({"max_run": "3600"}, {}, "max_run must be"),
    "max-run-float": ({"max_run": 1.5}, {}, "max_run must be"),
    "max-run-bool": ({"max_run": True}, {}, "max_run must be"),
    "max-wait-short": ({"max_run": 100, "max_wait": 50}, {}, "max_wait=50"),
    "max-wait-str": ({"max_wait": "x"}, {}, "max_wait='x'"),
    "max-wait-local": ({"max_wait": 100_000}, {}, "not supported by local jobs"),
    "spot-str": ({"use_spot_instances": "yes"}, {}, "use_spot_instances must be"),
    "spot-no-wait": ({"use_spot_instances": True}, {}, "needs max_wait"),
    "volume-str": ({"volume_size": "30"}, {}, "volume_size must be"),
    "volume-negative": ({"volume_size": -1}, {}, "volume_size must be"),
    "volume-float": ({"volume_size": 1.5}, {}, "volume_size must be"),
    "volume-none": ({"volume_size": None}, {}, "volume_size must be"),
    "volume-huge": ({"volume_size": 10**9}, {}, "volume_size must be"),
    "input-mode-stream": ({"input_mode": "Stream"}, {}, "input_mode='Stream'"),
    "input-mode-lower": ({"input_mode": "file"}, {}, "input_mode='file'"),
    "input-mode-none": ({"input_mode": None}, {}, "input_mode=None"),
    "log-level-str": ({"container_log_level": "INFO"}, {}, "container_log_level"),
    "log-level-negative": ({"container_log_level": -1}, {}, "container_log_level"),
    "log-level-100": ({"container_log_level": 100}, {}, "container_log_level"),
    "preflight-str": ({"preflight": "yes"}, {}, "preflight must be"),
    "plan-options-str": ({"plan_options": "x"}, {}, "plan_options must be a dict"),
    "base-name-space": ({"base_job_name": "my job"}, {}, "base_job_name="),
    "base-name-equals": ({"base_job_name": "a=b"}, {}, "base_job_name="),
    "base-name-newline": ({"base_job_name": "a\nb"}, {}, "base_job_name="),
    "base-name-trailing-newline": ({"base_job_name": "llama-run\n"}, {},
                                   "did you mean 'llama-run'?"),
    "base-name-dash": ({"base_job_name": "-x"}, {}, "base_job_name="),
    "base-name-long": ({"base_job_name": "x" * 70}, {}, "base_job_name="),
    "base-name-int": ({"base_job_name": 5}, {}, "base_job_name="),
    "tags-str": ({"tags": "team=nlp"}, {}, "tags must be a list"),
    "tags-lower-keys": ({"tags": [{"key": "team", "value": "nlp"}]}, {}, "must be {'Key'"),
    "tags-int-key": ({"tags": [{"Key": 5, "Value": "v"}]}, {}, "one-line string"),
    "tags-empty-key": ({"tags": [{"Key": "", "Value": "v"}]}, {}, "one-line string"),
    "tags-long-key": ({"tags": [{"Key": "k" * 129, "Value": "v"}]}, {}, "1-128"),
    "tags-newline": ({"tags": [{"Key": "k", "Value": "a\nb"}]}, {}, "one-line string"),
    "tags-item-int": ({"tags": [5]}, {}, "must be {'Key'"),
    "metrics-no-regex": ({"metric_definitions": [{"Name": "loss"}]}, {}, "must be {'Name'"),
    "metrics-bad-regex": ({"metric_definitions": [{"Name": "loss", "Regex": "loss=(["}]}, {},
                          "Regex is not valid"),
    "metrics-no-group": ({"metric_definitions": [{"Name": "loss", "Regex": "loss=[0-9]+"}]}, {},
                         "capture group"),
    "metrics-str": ({"metric_definitions": "loss"}, {}, "metric_definitions must be a list"),
    "metrics-empty-name": ({"metric_definitions": [{"Name": "", "Regex": "l=(.*)"}]}, {},
                           "one-line string"),
    "role-int": ({"role": 5}, {}, "role must be"),
    "role-empty": ({"role": ""}, {}, "role must be"),
    "image-newline": ({"image_uri": "a\nb"}, {}, "image_uri must be"),
    "framework-version-int": ({"framework_version": 2}, {}, "framework_version must be"),
    "py-version-int": ({"py_version": 3}, {}, "py_version must be"),
}

_PATHS = {
    "output-int": ({"output_path": 5}, {}, "output_path must be"),
    "output-empty": ({"output_path": ""}, {}, "output_path must be"),
    "output-newline": ({"output_path": "/tmp/a\nb"}, {}, "output_path must be"),
    "output-under-file": ({"output_path": lambda p: str(p.a_file / "out")}, {},
                          "is not a directory"),
    "output-is-file": ({"output_path": lambda p: str(p.a_file)}, {}, "is not a directory"),
    "output-unwritable": ({"output_path": "/proc/1/out"}, {}, "not writable"),
    "output-ftp": ({"output_path": "ftp://files.example.com/out"}, {},
                   "no backend reads or writes ftp:// URIs"),
    "checkpoint-ftp": ({"checkpoint_s3_uri": "ftp://files.example.com/ckpt"}, {},
                       "no backend reads or writes ftp:// URIs"),
    # local jobs upload to / download from S3 (s3_staging.py): the URIs are still checked first
    "output-s3-local": ({"output_path": "s3://b/out"}, {}, "not a valid S3 bucket name"),
    "checkpoint-under-file": ({"checkpoint_local_path": lambda p: str(p.a_file / "c")}, {},
                              "is not a directory"),
    "checkpoint-unwritable": ({"checkpoint_local_path": "/proc/1/ckpt"}, {}, "not writable"),
    "checkpoint-int": ({"checkpoint_local_path": 5}, {}, "checkpoint_local_path must be"),
    "checkpoint-s3-local": ({"checkpoint_s3_uri": "s3://b/ckpt"}, {},
                            "not a valid S3 bucket name"),
}

_KEYWORDS = {
    "kw-instance-typ": ({"instance_typ": "local"}, {}, "Did you mean 'instance_type'"),
    "kw-volume-sise": ({"volume_sise": 30}, {}, "Did you mean 'volume_size'"),
    "kw-hyperparameter": ({"hyperparameter": {}}, {}, "Did you mean 'hyperparameters'"),
    "kw-distrbution": ({"distrbution": TD}, {}, "Did you mean 'distribution'"),
    "kw-max-runtime": ({"max_runtime": 5}, {}, "Did you mean 'max_run'"),
    "kw-entrypoint": ({"entrypoint": "train.py"}, {}, "Did you mean 'entry_point'"),
    "kw-nonsense": ({"zzz": 1}, {}, "unexpected keyword argument 'zzz'"),
    # SageMaker-only arguments are ignored locally (a notebook runs as it is); Kubernetes' are not
    "kw-namespace-local": ({"namespace": "team-a"}, {}, "not honoured by local jobs"),
    "kw-kube-context-local": ({"kube_context": "prod"}, {}, "not honoured by local jobs"),
    "kw-jobs-dir-int": ({"jobs_dir": 5}, {}, "jobs_dir must be"),
    "kw-jobs-dir-under-file": ({"jobs_dir": lambda p: str(p.a_file / "jobs")}, {},
                               "is not a directory"),
}

_FIT = {
    "inputs-int": ({}, {"inputs": 5}, "expected a path or URI"),
    "channel-dot": ({}, {"inputs": {".": data}}, "input channel name '.'"),
    "channel-dotdot": ({}, {"inputs": {"..": data}}, "input channel name '..'"),
    "channel-slash": ({}, {"inputs": {"a/b": data}}, "is invalid"),
    "channel-empty": ({}, {"inputs": {"": data}}, "is invalid"),
    "channel-long": ({}, {"inputs": {"c" * 65: data}}, "is invalid"),
    "channel-int": ({}, {"inputs": {5: data}}, "is invalid"),
    "channel-newline": ({}, {"inputs": {"a\nb": data}}, "is invalid"),
    "channel-trailing-newline": ({}, {"inputs": {"train\n": data}}, "did you mean 'train'?"),
    "channel-case-collision": ({}, {"inputs": {"train": data, "TRAIN": data}}, "both become"),
    "channel-value-int": ({}, {"inputs": {"train": 5}}, "expected a path or URI"),
    "channel-uri-int": ({}, {"inputs": {"train": {"uri": 5}}}, "expected a path or URI"),
    "channel-missing": ({}, {"inputs": {"train": "/no/such/data"}}, "does not exist"),
    "channel-s3-local": ({}, {"inputs": {"train": "s3://b/k"}}, "not a valid S3 bucket name"),
    "channel-nul": ({}, {"inputs": {"train": "/tmp/a\x00b"}}, "not a usable path"),
    "channel-empty-path": ({}, {"inputs": {"train": ""}}, "not a usable path"),
    "channel-content-type-int": ({}, {"inputs": {"train": {"uri": data, "content_type": 5}}},
                                 "content_type must be"),
    "job-name-space": ({}, {"job_name": "my job"}, "not a valid SageMaker job name"),
    "job-name-equals": ({}, {"job_name": "a=b"}, "not a valid SageMaker job name"),
    "job-name-newline": ({}, {"job_name": "a\nb"}, "not a valid SageMaker job name"),
    "job-name-trailing-newline": ({}, {"job_name": "run-1\n"}, "did you mean 'run-1'?"),
    "job-name-long": ({}, {"job_name": "a" * 64}, "not a valid SageMaker job name"),
    "job-name-empty": ({}, {"job_name": ""}, "not a valid SageMaker job name"),
    "job-name-int": ({}, {"job_name": 5}, "not a valid SageMaker job name"),
    "job-name-dotdot": ({}, {"job_name": ".."}, "not a valid SageMaker job name"),
    "fit-wait-str": ({}, {"wait": "no"}, "take True or False"),
    "fit-logs-str": ({}, {"logs": "All"}, "take True or False"),
}



def ft(groups: Any = 2, *, hosts: int = 2, **parameters: Any) -> dict:
    """2 hosts x 2 processes with torch_distributed.fault_tolerance (issue 36)."""
    options = groups if isinstance(groups, dict) else {"replica_groups": groups}
    distribution = smp(**({"hybrid_shard_degree": 2} | parameters))
    distribution["torch_distributed"]["fault_tolerance"] = options
    return {"instance_count": hosts, "distribution": distribution}


_FAULT_TOLERANCE = {
    "ft-no-smp": ({"instance_count": 2, "distribution": {"torch_distributed": {
        "enabled": True, "fault_tolerance": {"replica_groups": 2}}}}, {},
        "smdistributed.modelparallel is not enabled"),
    "ft-groups-3": (ft(3), {}, "replica_groups=3 does not divide instance_count=2"),
    "ft-one-group": (ft(1), {}, "replica_groups: Input should be greater than or equal to 2"),
    "ft-min-over": (ft({"replica_groups": 2, "min_replica_groups": 3}), {},
                    "min_replica_groups=3 > replica_groups=2"),
    "ft-key-typo": (ft({"replica_group": 2}), {}, "Did you mean 'replica_groups'"),
    "ft-hsd-4": (ft(2, hybrid_shard_degree=4), {},
                 "1 host(s) x 2 processes = 2 ranks, but the resolved hybrid_shard_degree is 4"),
    "ft-tp": (ft(2, hybrid_shard_degree=1, tensor_parallel_degree=2), {},
              "with tensor_parallel_degree=2: fault-tolerant replica groups run hybrid sharding "
              "only"),
}

LOCAL_CASES = {**_SOURCE, **_HYPERPARAMETERS, **_CLUSTER, **_DISTRIBUTION, **_VALUES, **_PATHS,
               **_KEYWORDS, **_FIT, **_FAULT_TOLERANCE}

# Valid arguments that must pass every check (Estimator + build_spec + backend.validate).
CONTROLS = {
    "plain": ({}, {}),
    "reserved-ppn-equal": ({"distribution": TD, "hyperparameters": {
        "sagemaker_mpi_num_of_processes_per_host": 2}}, {}),
    "reserved-mp-equal": ({"distribution": smp(hybrid_shard_degree=2), "hyperparameters": {
        "mp_parameters": {"hybrid_shard_degree": 2}}}, {}),
    "hp-depth-32": ({"hyperparameters": {"d": deep(31)}}, {}),
    "hp-nan-as-text": ({"hyperparameters": {"lr": "nan", "name-with.dots": 1}}, {}),
    "hp-near-limit": ({"hyperparameters": {"blob": "x" * 60_000}}, {}),
    "channels": ({}, {"inputs": {"train.v1": data, "val-2": {"uri": data,
                                                             "content_type": "text/csv"}}}),
    "paths-to-create": ({"output_path": lambda p: str(p.root / "new" / "out"),
                         "checkpoint_local_path": lambda p: str(p.root / "ckpt")}, {}),
    "internal-link": ({"source_dir": lambda p: str(p.src)}, {}),
    "two-ranks": ({"distribution": {"torch_distributed": {"enabled": True,
                                                               "processes_per_host": 2}}}, {}),
    "tags-metrics": ({"tags": [{"Key": "team", "Value": ""}],
                      "metric_definitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}]}, {}),
    "jobs-dir-new": ({"jobs_dir": lambda p: str(p.root / "elsewhere" / "jobs")}, {}),
    "hybrid-shard": ({"instance_count": 2, "distribution": smp(sharding_strategy="hybrid_shard")},
                     {}),
    "context-parallel": ({"instance_count": 2, "distribution": smp(
        context_parallel_degree=2, cp_comm_type="a2a", tensor_parallel_degree=2)}, {}),
}
