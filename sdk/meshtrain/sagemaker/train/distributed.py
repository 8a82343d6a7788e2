"""`sagemaker.train.distributed`: `Torchrun`, `SMP` and `MPI`, as SDK v3 (3.27.0) has them.

```python
# from sagemaker.train.distributed import Torchrun, SMP
from meshtrain.sagemaker.train.distributed import Torchrun, SMP

distributed = Torchrun(process_count_per_node=8, smp=SMP(hybrid_shard_degree=8))
```

`SMP` takes the SDK's nine SMP v2 fields, in the SDK's order, and meshtrain's own parameters
after them (`activation_checkpointing`, `pipeline_parallel_degree`, `compile`, ...: the
extensions of `meshtrain.contract.SMPParameters`, docs/distribution.md). Every field is
optional; the set ones go to the job as the hyperparameter ``mp_parameters`` (a JSON object in
declaration order), which `meshtrain_runtime.init()` reads. `MPI` jobs start their processes
with torchrun (`process_count_per_node` on every host): see docs/sagemaker-v3.md.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import create_model

from meshtrain.contract.distribution import SMPParameters
from meshtrain.sagemaker.train._base import BaseConfig

MP_PARAMETERS = "mp_parameters"


class _SMPv2(BaseConfig):
    """The SDK's nine SMP v2 fields, every one optional (None: SMP's default)."""

    hybrid_shard_degree: int | None = None
    sm_activation_offloading: bool | None = None
    activation_loading_horizon: int | None = None
    fsdp_cache_flush_warnings: bool | None = None
    allow_empty_shards: bool | None = None
    tensor_parallel_degree: int | None = None
    context_parallel_degree: int | None = None
    expert_parallel_degree: int | None = None
    random_seed: int | None = None


def _extension_fields() -> dict[str, Any]:
    """meshtrain's SMP parameters beyond the nine, optional, from their one home
    (`SMPParameters`): the runtime validates their values and relations."""
    return {name: (Optional[info.annotation], None)  # noqa: UP045 (a runtime annotation)
            for name, info in SMPParameters.model_fields.items()
            if name not in _SMPv2.model_fields}


_SMPFields = create_model("_SMPFields", __base__=_SMPv2, **_extension_fields())


class SMP(_SMPFields):
    """SageMaker model parallelism v2 parameters (`sagemaker.train.distributed.SMP`), plus
    meshtrain's own; unset fields take SMP's (and meshtrain's) defaults in the job."""

    def parameters(self) -> dict[str, Any]:
        """The set fields, in declaration order (the SDK's ``model_dump(exclude_none=True)``)."""
        return self.model_dump(exclude_none=True)

    def _to_mp_hyperparameters(self) -> dict[str, str]:
        """``{"mp_parameters": "<JSON>"}``, the hyperparameter the SDK adds for SMP."""
        return {MP_PARAMETERS: json.dumps(self.parameters())}


class DistributedConfig(BaseConfig):
    """Base of the distributed launchers (`Torchrun`, `MPI`)."""

    process_count_per_node: int | None = None

    def driver_config(self) -> dict[str, Any]:
        """The launcher as the SDK's distributed.json holds it (SM_DISTRIBUTED_CONFIG): every
        field, SMP's nine included when unset; meshtrain's SMP parameters only when set."""
        config = self.model_dump()
        if isinstance(config.get("smp"), dict):
            config["smp"] = {key: value for key, value in config["smp"].items()
                             if key in _SMPv2.model_fields or value is not None}
        return config

    def distribution(self) -> dict[str, Any]:
        """meshtrain's `distribution` dict for this launcher (torchrun on every host)."""
        torch_distributed: dict[str, Any] = {"enabled": True}
        if self.process_count_per_node is not None:
            torch_distributed["processes_per_host"] = self.process_count_per_node
        return {"torch_distributed": torch_distributed}


class Torchrun(DistributedConfig):
    """torchrun on every host: `process_count_per_node` processes (default: the host's GPUs,
    else 1), with SMP v2 parameters in `smp`."""

    smp: SMP | None = None

    def distribution(self) -> dict[str, Any]:
        distribution = super().distribution()
        if self.smp is not None:
            distribution["smdistributed"] = {"modelparallel": {
                "enabled": True, "parameters": self.smp.parameters()}}
        return distribution


class MPI(DistributedConfig):
    """`mpirun` in the SDK's drivers; meshtrain starts `process_count_per_node` processes on
    every host with torchrun (RANK, WORLD_SIZE, LOCAL_RANK; no OMPI_* variables), so
    `mpi_additional_options` have nothing to apply to and are refused when set."""

    mpi_additional_options: list[str] | None = None


__all__ = ["MPI", "SMP", "DistributedConfig", "Torchrun"]
