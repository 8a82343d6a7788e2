"""The SageMaker target's bad inputs for test_bad_inputs.py, run against moto (see conftest.py):
(Estimator arguments beside ``ML``, fit arguments, part of the message), as in
bad_input_cases.py."""

from __future__ import annotations

from bad_input_cases import deep, huge_set, smp, variant

ML_CASES = {
    "ml-count-zero": ({"instance_count": 0}, {}, "positive int"),
    "ml-hp-nan": ({"hyperparameters": {"lr": float("nan")}}, {}, "not a finite number"),
    "ml-hp-deep": ({"hyperparameters": {"d": deep(10_000)}}, {}, "deeper than 32"),
    "ml-hp-reserved": ({"hyperparameters": {"mp_parameters": {}}}, {}, "reserved"),
    "ml-hp-key-equals": ({"hyperparameters": {"a=b": 1}}, {}, "is invalid"),
    "ml-hp-key-newline": ({"hyperparameters": {"lr\n": 1}}, {}, "did you mean 'lr'?"),
    "ml-hp-huge-repr": ({"hyperparameters": {"ids": huge_set}}, {},
                        "is not JSON-serialisable"),
    "ml-env-name-newline": ({"environment": {"X\n": "1"}}, {}, "did you mean 'X'?"),
    "ml-job-name-newline": ({}, {"job_name": "valid-name\n"}, "did you mean 'valid-name'?"),
    "ml-base-name-newline": ({"base_job_name": "nightly\n"}, {"job_name": None},
                             "did you mean 'nightly'?"),
    "ml-channel-newline": ({}, {"inputs": {"train\n": "s3://bucket/data"}},
                           "did you mean 'train'?"),
    "ml-output-ftp": ({"output_path": "ftp://files.example.com/out"}, {}, "ftp:// URIs"),
    "ml-ppn-no-torchrun": ({"distribution": {"torch_distributed": {"processes_per_host": 8}}},
                           {}, "torch_distributed is not enabled"),
    "ml-source-link": ({"source_dir": variant("escaping-link")}, {}, "outside"),
    "ml-source-fifo": ({"source_dir": variant("fifo")}, {}, "is a FIFO"),
    "ml-source-huge": ({"source_dir": variant("huge")}, {}, "Biggest: "),
    "ml-volume-str": ({"volume_size": "30"}, {}, "volume_size must be"),
    "ml-tags": ({"tags": [{"Key": 5, "Value": "v"}]}, {}, "one-line string"),
    "ml-role-int": ({"role": 5}, {}, "role must be"),
    "ml-instance-typ": ({"instance_typ": "ml.p4d.24xlarge"}, {}, "Did you mean 'instance_type'"),
    "ml-subnet-typo": ({"subnet": ["s-1"]}, {}, "Did you mean 'subnets'"),
    "ml-jobs-dir": ({"jobs_dir": "/tmp/x"}, {},
                    "local / local Docker options, not honoured by SageMaker jobs"),
    "ml-channel-dotdot": ({}, {"inputs": {"..": "s3://bucket/data"}}, "'..'"),
    "ml-cp": ({"distribution": smp(ppn=None, context_parallel_degree=3)}, {},
              "context_parallel_degree=3 must divide the resolved hybrid_shard_degree=8"),
    "ml-sp": ({"distribution": smp(ppn=None, sequence_parallel=True)}, {},
              "sequence_parallel=True"),
    "ml-max-run": ({"max_run": 0}, {}, "max_run must be"),
    "ml-entry-typo": ({"entry_point": "trian.py"}, {}, "Did you mean 'train.py'"),
    "ml-env-nul": ({"environment": {"X": "\x00"}}, {}, "NUL"),
    "ml-max-restarts": ({"distribution": {"torch_distributed": {"enabled": True,
                                                                "max_restarts": 2}}}, {},
                        "SageMaker jobs are not restarted"),
    "ml-stop-grace": ({"distribution": {"torch_distributed": {"enabled": True,
                                                              "stop_grace_seconds": 300}}}, {},
                      "SageMaker sends SIGKILL 120 s after SIGTERM"),
    "ml-fault-tolerance": ({"instance_count": 2, "distribution": {
        "torch_distributed": {"enabled": True, "fault_tolerance": {"replica_groups": 2}},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 8}}}}}, {},
        "fault_tolerance (replica_groups=2) is not run on SageMaker: a SageMaker training job "
        "restarts or fails as a whole"),
}
