"""Pipeline-parallel parameters: resolution with pp outermost, and the refusals before launch."""

from __future__ import annotations

import pytest

from meshtrain import ConfigError, Estimator
from meshtrain.contract import parse_smp_parameters, resolve_degrees


def smp(ppn=4, **parameters):
    return {"torch_distributed": {"enabled": True, "processes_per_host": ppn},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


@pytest.mark.parametrize(("parameters", "world", "expected"), [
    ({"pipeline_parallel_degree": 2, "microbatches": 2}, 4, (2, 1, 2, 2, "full_shard")),
    ({"pipeline_parallel_degree": 2, "hybrid_shard_degree": 1, "microbatches": 2}, 4,
     (2, 1, 1, 2, "no_shard")),
    ({"pipeline_parallel_degree": 2, "tensor_parallel_degree": 2, "microbatches": 2}, 4,
     (2, 2, 1, 1, "no_shard")),
    ({"pipeline_parallel_degree": 4, "hybrid_shard_degree": 1, "microbatches": 4}, 8,
     (4, 1, 1, 2, "no_shard")),
])
def test_degrees_resolve_within_each_stage(parameters, world, expected):
    d = resolve_degrees(parse_smp_parameters(parameters), world)
    pp, tp, shard, dp_size, strategy = expected
    assert (d.pipeline_parallel_degree, d.tensor_parallel_degree) == (pp, tp)
    assert (d.hybrid_shard_degree, d.dp_size, d.sharding_strategy) == (shard, dp_size, strategy)
    assert pp * d.replicate_degree * d.hybrid_shard_degree * tp == world


def test_stages_per_rank_defaults_per_schedule():
    assert parse_smp_parameters({}).stages_per_rank == 1
    for schedule, per_rank in (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2),
                               ("ZBVZeroBubble", 2), ("LoopedBFS", 2)):
        params = parse_smp_parameters({"pipeline_parallel_degree": 2, "microbatches": 4,
                                       "pipeline_schedule": schedule})
        assert params.stages_per_rank == per_rank


@pytest.mark.parametrize(("parameters", "world", "quoted"), [
    ({"pipeline_parallel_degree": 3, "microbatches": 4}, 4,
     "pipeline_parallel_degree=3 does not divide world size 4. Use 1, 2 or 4"),
    ({"pipeline_parallel_degree": 2, "tensor_parallel_degree": 4, "microbatches": 4}, 4,
     "tensor_parallel_degree=4 does not divide one stage's 2 ranks (world size 4 / "
     "pipeline_parallel_degree=2)"),
    ({"pipeline_parallel_degree": 2, "hybrid_shard_degree": 4, "microbatches": 4}, 4,
     "hybrid_shard_degree=4 does not divide the data-parallel size 2"),
    ({"pipeline_parallel_degree": 4, "microbatches": 3}, 4,
     "microbatches=3 and 4 stages: torch says \"Number of microbatches must be greater than or "
     "equal to the number of stages\". Use microbatches >= 4"),
    ({"pipeline_parallel_degree": 2, "microbatches": 5, "pipeline_schedule": "Interleaved1F1B"},
     4, "multiple of the number of rounds max(1, 5 // 2) = 2"),
    ({"pipeline_parallel_degree": 2, "microbatches": 4, "pipeline_schedule": "ZBVZeroBubble",
      "pipeline_stages_per_rank": 3}, 4, "ZBV requires exactly 2 stages per rank"),
    ({"pipeline_parallel_degree": 2, "microbatches": 4, "pipeline_schedule": "Interleaved1F1B",
      "pipeline_stages_per_rank": 1}, 4, "interleaves several stages per rank"),
    ({"pipeline_parallel_degree": 2, "microbatches": 4, "pipeline_stages_per_rank": 2}, 4,
     "pipeline_schedule='1F1B' runs one stage per rank"),
    ({"pipeline_parallel_degree": 2, "microbatches": 4, "pipeline_split_points": [2, 3]}, 4,
     "gives 3 stages, but pipeline_parallel_degree=2 x pipeline_stages_per_rank=1 = 2 stages"),
    ({"pipeline_parallel_degree": 2, "microbatches": 4, "pipeline_schedule": "Interleaved1F1B",
      "pipeline_split_points": [2, 2, 3]}, 4, "strictly increasing"),
    ({"pipeline_parallel_degree": 2, "microbatches": 4, "compile": True,
      "pipeline_schedule": "ZBVZeroBubble"}, 4, "torch refuses compiled stages"),
    ({"pipeline_parallel_degree": 2, "microbatches": 4, "activation_checkpointing": True,
      "activation_offloading": True}, 4, "which no pipeline stage runs"),
    ({"pipeline_parallel_degree": 2, "microbatches": 4, "tensor_parallel_degree": 2,
      "sequence_parallel": True}, 4, "sequence_parallel=True with pipeline_parallel_degree=2"),
    ({"pipeline_split_points": [2]}, 4, "pipeline_parallel_degree=1"),
    ({"pipeline_schedule": "Looped"}, 4, "pipeline_schedule"),
])
def test_bad_pipeline_parameters_are_refused_with_the_arithmetic(parameters, world, quoted):
    with pytest.raises(ConfigError) as error:
        resolve_degrees(parse_smp_parameters(parameters), world)
    assert quoted in str(error.value)


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, 1), ({"microbatches": 3}, 3),
    ({"pipeline_parallel_degree": 2}, 2), ({"pipeline_parallel_degree": 4}, 4),
    ({"pipeline_parallel_degree": 2, "pipeline_schedule": "GPipe"}, 2),
    ({"pipeline_parallel_degree": 2, "pipeline_schedule": "Interleaved1F1B"}, 4),
    ({"pipeline_parallel_degree": 4, "pipeline_schedule": "Interleaved1F1B",
      "pipeline_stages_per_rank": 3}, 12),
    ({"pipeline_parallel_degree": 2, "pipeline_schedule": "ZBVZeroBubble"}, 4),
    ({"pipeline_parallel_degree": 2, "pipeline_schedule": "LoopedBFS"}, 4),
    ({"pipeline_parallel_degree": 2, "microbatches": None}, 2),
])
def test_microbatches_default_to_what_the_schedule_needs(parameters, expected):
    """Unset: one microbatch per stage (pp x stages per rank), which every schedule's rule
    accepts; without pipelining 1 (no accumulation)."""
    params = parse_smp_parameters(parameters)
    assert params.microbatches == expected
    resolve_degrees(params, 4 * params.pipeline_parallel_degree)  # and nothing refuses it


def test_pipeline_refusals_end_in_one_period():
    """The contract adds the period a message lacks, and no second one (it used to end "..")."""
    for parameters in ({"pipeline_parallel_degree": 2, "microbatches": 1},
                       {"pipeline_parallel_degree": 2, "microbatches": 5,
                        "pipeline_schedule": "Interleaved1F1B"},
                       {"pipeline_parallel_degree": 0}):
        with pytest.raises(ConfigError) as error:
            parse_smp_parameters(parameters)
        message = str(error.value)
        assert message.endswith(".") and not message.endswith(".."), message


def test_the_estimator_refuses_before_launch(tmp_path):
    (tmp_path / "train.py").write_text("print('never runs')\n")
    jobs = tmp_path / "jobs"
    with pytest.raises(ConfigError, match=r"Use microbatches >= 2, or leave it unset"):
        Estimator("train.py", source_dir=str(tmp_path), instance_count=2, jobs_dir=str(jobs),
                  distribution=smp(ppn=2, pipeline_parallel_degree=2, microbatches=1))
    with pytest.raises(ConfigError, match="pipeline_parallel_degree=4 does not divide world "
                                          r"size 2 \(1 host x 2 processes\)"):
        Estimator("train.py", source_dir=str(tmp_path), jobs_dir=str(jobs),
                  distribution=smp(ppn=2, pipeline_parallel_degree=4, microbatches=4))
    assert not jobs.exists()
    Estimator("train.py", source_dir=str(tmp_path), instance_count=2, jobs_dir=str(jobs),
              distribution=smp(ppn=2, pipeline_parallel_degree=2))  # microbatches: default
