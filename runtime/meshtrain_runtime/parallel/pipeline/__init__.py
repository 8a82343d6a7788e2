"""Pipeline parallelism: split a model into stages by its blocks, run by torch's schedules.

`plan_pipeline` cuts the model's block list into ``pp x stages_per_rank`` stages (evenly, or at
``pipeline_split_points``) and refuses, on every rank, a model that cannot be split;
`build_pipeline` returns the `PipelineModule` of this rank's stages. Every stage runs the
model's OWN code: Hugging Face decoder LMs through their public forward (``inputs_embeds``
into the stages after the first, `hf.py`); any other model through its forward traced once
with torch.fx and cut at the block boundaries (`trace.py`, `graph.py`), so what happens
around and between the blocks goes with them. torch.distributed.pipelining's schedules run the
stages: see `meshtrain_runtime.step`.
"""

from meshtrain_runtime.parallel.pipeline.split import (
    PipelinePlan,
    build_pipeline,
    check_pipeline_request,
    plan_pipeline,
)
from meshtrain_runtime.parallel.pipeline.stages import (
    PipelineModule,
    PipelineStageModule,
    local_stage_indices,
    stage_bounds,
)

__all__ = ["PipelineModule", "PipelinePlan", "PipelineStageModule", "build_pipeline",
           "check_pipeline_request", "local_stage_indices", "plan_pipeline", "stage_bounds"]
