"""AWS's public SMP v2 example scripts (aws_smp_v2/, see its EDITS.md) run through the Estimator.

As in AWS's notebooks: `train.py` from their shared-scripts folder, the distribution enabling
``smdistributed.modelparallel`` with the notebooks' parameters, their hyperparameters (a tiny
Llama v2: 2 layers, hidden 32, vocab 64, 16 tokens; gloo), 2 local hosts x 2
processes. Each layout trains 4 steps saving SMP's sharded checkpoints every 2 steps, then a
second job resumes from the 2-step checkpoint, as the notebooks' "Resume training" cell does.
Their MoE path runs too: a tiny Mixtral (model_type mixtral, moe=1, use_smp_implementation=1,
their MoE defaults) with its experts split over expert_parallel_degree=2; the job log carries the
runtime's line saying so. (That FSDP1 + EP trains exactly as one process is shown by
test_smp_multiprocess.py::test_fsdp1_with_expert_parallelism_matches_one_process.)

The data is a tiny on-disk dataset in the scripts' ``gpt_jsonl`` format (token_rows.py), not
their synthetic data, which is reseeded on resume; ``GPTDataPipeline`` resumes at the
checkpoint's ``resume_from_sequence_number``. What shows the resumed job continues the first:
its log says it loaded the model, then the optimizer, and skipped the batches already read; its
first step is step 2 with the learning rate the first job had at step 2 (the scheduler's state);
and its losses at steps 2 and 3 equal the first job's (1e-6; the same batches, state and layout,
and bf16 mixed precision on CPU is deterministic: measured equal to the last bit).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from token_rows import write_token_rows

from meshtrain import Estimator

SCRIPTS = Path(__file__).parent / "aws_smp_v2"
STEP = re.compile(
    r"\[algo-1 rank 0\] .*Batch (\d+) Loss: (\S+), .* lr: ([\d.]+), gradnorm: ([\d.]+)"
)
pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]

MODEL = {  # the notebooks' model_configs entry, at toy size
    "hidden_width": 32, "llama_intermediate_size": 64, "max_context_width": 16,
    "num_heads": 4, "num_layers": 2, "vocab_size": 64,
}


def hyperparameters(checkpoint_dir: Path, data: Path, resume: Path | None,
                    moe: bool = False) -> dict:
    """The notebooks' hyperparameters; toy sizes, `data` on disk, gloo, a short lr schedule.

    `moe`: their MoE path (model_type mixtral, moe=1, their MoE defaults: top-2, sinkhorn,
    all-to-all dispatcher) with 4 experts per layer instead of 8 (toy size).
    """
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
        "distributed_backend": "gloo", **MODEL,
    }
    if moe:
        hps.update(model_type="mixtral", moe=1, num_local_experts=4, num_key_value_heads=4,
                   intermediate_size=64)
    if resume is not None:
        hps["resume_from_checkpoint"] = str(resume)
    return hps


def run_job(home: Path, tp: int, checkpoint_dir: Path, data: Path,
            resume: Path | None = None, ep: int = 1) -> str:
    """One job on 2 hosts x 2 processes (the MoE path when `ep` > 1); returns its merged log."""
    # EP: FSDP1 shards over the ranks holding the same experts (SMP writes one checkpoint folder
    # per ep rank over that group), so the ep ranks are carved out of 4-way sharding.
    extra = {"expert_parallel_degree": ep, "hybrid_shard_degree": 4} if ep > 1 else {}
    estimator = Estimator(
        entry_point="train.py", source_dir=str(SCRIPTS), instance_type="local",
        instance_count=2, hyperparameters=hyperparameters(checkpoint_dir, data, resume, moe=ep > 1),
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "activation_loading_horizon": 2, "context_parallel_degree": 1,
                "hybrid_shard_degree": 2, "sm_activation_offloading": False,
                "tensor_parallel_degree": tp, **extra,
            }}},
        },
    )
    estimator.fit(logs=False)
    return (home / "jobs" / estimator.latest_training_job.job_name / "job.log").read_text()


def steps(log: str) -> dict[int, tuple[float, float, float]]:
    """step -> (loss, lr, grad norm) from rank 0's `Batch N Loss: ...` lines."""
    return {int(step): (float(loss), float(lr), float(norm))
            for step, loss, lr, norm in STEP.findall(log)}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path / "home"


@pytest.mark.parametrize(("tp", "ep", "folders"), [
    (2, 1, ["tp2-0", "tp2-1"]),  # tp=2 x hybrid 2: SMP writes one checkpoint folder per tp rank
    # hybrid 2 without tp (one folder) runs in test_context_parallel_aws.py, with cp 2 carved out
    # of its shard group: the same tp=1 path of the scripts, two jobs fewer in the suite
    # their MoE path (mixtral, moe=1, use_smp_implementation=1), experts split over ep=2: one
    # folder per ep rank, each written by the 2 ranks that hold the same experts
    (1, 2, ["ep2-0", "ep2-1"]),
])
def test_aws_scripts_train_save_and_resume(home, tmp_path, tp, ep, folders):
    checkpoints = tmp_path / "checkpoints"
    model_type = "mixtral" if ep > 1 else "llama_v2"
    # up to 4 data-parallel groups (ep=2: the scripts divide only by tp x cp) x 4 steps x 2
    data = write_token_rows(tmp_path / "data", rows=32, width=MODEL["max_context_width"],
                            vocab=MODEL["vocab_size"])
    log = run_job(home, tp, checkpoints, data, ep=ep)
    first = steps(log)
    assert sorted(first) == [0, 1, 2, 3], first
    if ep > 1:  # the runtime's evidence that tsm.transform split the experts
        assert "meshtrain: experts split over ep=2: 2 of 4 per rank in 2 MoE layers" in log
    for step in (2, 4):
        saved = checkpoints / f"{model_type}-{step}steps"
        for folder in [saved / f for f in folders] or [saved]:
            assert (folder / ".metadata").is_file(), sorted(p.name for p in saved.iterdir())
            assert len(list(folder.glob("*.distcp"))) == 2  # the 2 ranks of the FSDP group
        assert sorted(p.name for p in saved.iterdir()) == (folders or sorted(
            p.name for p in saved.iterdir() if p.name == ".metadata" or p.suffix == ".distcp"))

    log = run_job(home, tp, checkpoints, data, resume=checkpoints / f"{model_type}-2steps",
                  ep=ep)
    resumed = steps(log)
    assert "Loaded model state from disk" in log
    assert "Loaded and sharded optimizer state from disk" in log
    assert "Loaded state from disk: epoch 0, start_train_path_index 0" in log
    assert sorted(resumed) == [2, 3], resumed  # total_steps came back from the checkpoint
    assert "Dataloader skipping 2 sequences" in log  # the 2 batches the checkpoint counted
    assert resumed[2][1] == first[2][1] != first[0][1]  # the lr schedule continues
    for step in (2, 3):  # the uninterrupted job's losses, on the same batches
        assert resumed[step][0] == pytest.approx(first[step][0], abs=1e-6), (resumed, first)
        assert resumed[step][2] == pytest.approx(first[step][2], abs=1e-4), (resumed, first)
