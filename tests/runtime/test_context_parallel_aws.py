"""AWS's SMP v2 shared-scripts with context_parallel_degree=2 through the Estimator (issue 31).

The scripts of tests/runtime/compat/aws_smp_v2 (see its EDITS.md; run as in
compat/test_aws_smp_v2.py: 2 local hosts x 2 processes, the notebooks' hyperparameters at toy
size, gloo, use_smp_implementation=1) with ``context_parallel_degree: 2`` and
``cp_comm_type`` passed to ``tsm.transform``: the script splits each batch for its cp rank
(``get_batch_for_cp_rank``, asserting the local length is max_context_width / cp at batch 0),
logs its global batch in tokens divided by cp, saves SMP's sharded checkpoints and a second job
resumes from the 2-step one.

The data is a tiny on-disk dataset in the scripts' ``gpt_jsonl`` format (compat/token_rows.py),
not their synthetic data: that is reseeded on resume (a resumed step 2 would read the step-0
batch), while ``GPTDataPipeline`` resumes at the checkpoint's ``resume_from_sequence_number``.
So the resumed steps 2-3 read the batches the uninterrupted job read there, from the same
weights, optimizer and scheduler state on the same layout, and their losses must equal the
uninterrupted job's within 1e-6 (bf16 mixed precision on CPU is deterministic: measured equal to
the last bit).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from compat.token_rows import write_token_rows

from meshtrain import Estimator

SCRIPTS = Path(__file__).parent / "compat" / "aws_smp_v2"
STEP = re.compile(
    r"\[algo-1 rank 0\] .*Batch (\d+) Loss: (\S+), .* lr: ([\d.]+), gradnorm: ([\d.]+)"
)
pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]


def hyperparameters(checkpoint_dir: Path, data: Path, resume: Path | None) -> dict:
    hps = {
        "activation_checkpointing": 1, "auto_wrap_policy": "transformer_auto_wrap_policy",
        "backward_fetch_policy": "backward_pre", "beta1": 0.9, "beta2": 0.95, "bf16": 1,
        "checkpoint_dir": str(checkpoint_dir), "checkpoint_freq": 2, "clean_cache": 0,
        "delayed_param": 1, "enable_memory_profiling": 0, "epochs": 100, "fast_validation": 0,
        "forward_prefetch": 1, "fp8": 0, "limit_all_gathers": 1, "logging_freq": 1,
        "lr": 0.01, "lr_decay_iters": 8, "lr_decay_style": "cosine", "max_steps": 4,
        "min_lr": 1e-05, "model_type": "llama_v2", "num_kept_checkpoints": 2, "plateau": 0.0,
        "seed": 12345, "sharding_strategy": "hybrid_shard", "train_batch_size": 2,
        "use_smp_flash_attn": 1, "use_smp_implementation": 1, "val_batch_size": 2,
        "validation_freq": 0, "warmup": 0.0, "weight_decay": 0.2, "zipped_data": 0,
        "use_synthetic_data": 0, "dataset_type": "gpt_jsonl", "training_dir": str(data),
        "distributed_backend": "gloo", "cp_comm_type": "all_gather",
        "hidden_width": 32, "llama_intermediate_size": 64, "max_context_width": 16,
        "num_heads": 4, "num_layers": 2, "vocab_size": 64,
    }
    if resume is not None:
        hps["resume_from_checkpoint"] = str(resume)
    return hps


def run_job(home: Path, checkpoint_dir: Path, data: Path, resume: Path | None = None) -> str:
    estimator = Estimator(
        entry_point="train.py", source_dir=str(SCRIPTS), instance_type="local",
        instance_count=2, hyperparameters=hyperparameters(checkpoint_dir, data, resume),
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "activation_loading_horizon": 2, "context_parallel_degree": 2,
                "hybrid_shard_degree": 2, "sm_activation_offloading": False,
                "tensor_parallel_degree": 1,
            }}},
        },
    )
    estimator.fit(logs=False)
    return (home / "jobs" / estimator.latest_training_job.job_name / "job.log").read_text()


def steps(log: str) -> dict[int, tuple[float, float, float]]:
    return {int(step): (float(loss), float(lr), float(norm))
            for step, loss, lr, norm in STEP.findall(log)}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path / "home"


def test_aws_scripts_train_save_and_resume_with_cp2(home, tmp_path):
    # 2 data-parallel groups x 4 steps x batch 2: every row is read once by the 4-step job
    data = write_token_rows(tmp_path / "data", rows=16, width=16, vocab=64)
    checkpoints = tmp_path / "checkpoints"
    log = run_job(home, checkpoints, data)
    # 4 ranks x 16 tokens x batch 2 / cp 2: the script's own figure, and its batch-0 assertion
    # (local length 16 / cp) passed since the job trained
    assert re.search(r"Global batch size in tokens:\s+64 ", log), log[-3000:]
    first = steps(log)
    assert sorted(first) == [0, 1, 2, 3], first
    assert all(loss < 6 for loss, _, _ in first.values())  # finite, near ln(64) = 4.16
    saved = checkpoints / "llama_v2-2steps"
    assert (saved / ".metadata").is_file()
    assert len(list(saved.glob("*.distcp"))) == 2  # the 2 ranks of the FSDP (shard) group

    log = run_job(home, checkpoints, data, resume=saved)
    resumed = steps(log)
    assert "Loaded model state from disk" in log
    assert "Loaded and sharded optimizer state from disk" in log
    # the script's SkipDataLoader passes over the 2 batches per group the checkpoint counted
    assert "Dataloader skipping 2 sequences" in log, log[-3000:]
    assert sorted(resumed) == [2, 3], resumed
    assert resumed[2][1] == first[2][1] != first[0][1]  # the lr schedule continues
    # same batches, same weights and optimizer state, same layout: bf16 on CPU is deterministic
    for step in (2, 3):
        assert resumed[step][0] == pytest.approx(first[step][0], abs=1e-6), (resumed, first)
        assert resumed[step][2] == pytest.approx(first[step][2], abs=1e-4), (resumed, first)
