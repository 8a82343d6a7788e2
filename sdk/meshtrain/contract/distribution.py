"""The `distribution` dict: SageMaker's shapes and SMP v2's parameters, validated.

Accepted shapes (SageMaker Python SDK v2, contract §2.1):

    {"torch_distributed": {"enabled": True, "processes_per_host": 4},
     "smdistributed": {"modelparallel": {"enabled": True,
                                         "parameters": {...} | "path/to/params.json"}}}

`processes_per_host` and the keys marked "meshtrain extension" below are not part of SMP v2;
everything else keeps SMP's names, types, defaults and ranges (contract §1.1-1.2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from meshtrain.contract._messages import config_error_from, did_you_mean
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import DEFAULT_REPLICA_GROUP_RESTARTS, FaultTolerance
from meshtrain.contract.pipeline_checks import (
    SINGLE_STAGE_SCHEDULES,
    ZERO_BUBBLE_SCHEDULES,
    check_pipeline,
    default_microbatches,
)

ShardingStrategy = Literal[
    "full_shard", "shard_grad_op", "hybrid_shard", "_hybrid_shard_zero2", "no_shard"
]
MixedPrecision = Literal["bf16", "fp16", "fp32"]
CpCommType = Literal["p2p", "all_gather", "a2a"]
CheckpointingPolicy = Literal["full", "selective"]
CHECKPOINTING_POLICIES: tuple[str, ...] = ("full", "selective")
PipelineSchedule = Literal[
    "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SMPParameters(_Strict):
    """SMP v2 core parameters plus meshtrain's documented extensions."""

    # --- SMP v2 keys (names, types, defaults and ranges as documented by AWS) ---
    hybrid_shard_degree: int = Field(0, ge=0)
    sm_activation_offloading: bool = True
    activation_loading_horizon: int = Field(2, ge=1)
    fsdp_cache_flush_warnings: bool = True
    allow_empty_shards: bool = False
    tensor_parallel_degree: int = Field(1, ge=1)
    context_parallel_degree: int = Field(1, ge=1)
    expert_parallel_degree: int = Field(1, ge=1)
    random_seed: int | None = None
    # --- meshtrain extensions ---
    activation_checkpointing: bool | CheckpointingPolicy = False
    """Checkpoint transformer blocks (every one, or every n-th: see the interval). True or
    "full": a block keeps only its inputs and recomputes everything in backward; "selective"
    (op-level): it also keeps the outputs of its matmuls and fused attention and recomputes
    only the cheap ops between them (norms, activations, rotary embeddings)."""
    activation_checkpointing_interval: int = Field(1, ge=1)
    """With checkpointing on, checkpoint blocks 0, n, 2n, ... (1 = every block)."""
    activation_offloading: bool = False
    """Offload the inputs of checkpointed blocks to host memory (needs checkpointing)."""
    sharding_strategy: ShardingStrategy | None = None
    """FSDP strategy; None derives it from hybrid_shard_degree as SMP does."""
    mixed_precision: MixedPrecision | None = None
    cpu_offload: bool = False
    sequence_parallel: bool = False
    loss_parallel: bool = False
    """With tensor parallelism: keep logits vocab-sharded; the loss runs in torch's
    ``loss_parallel()`` context."""
    compile: bool = False
    """torch.compile each transformer block (after TP/EP and checkpointing, before FSDP2)."""
    fp8: bool = False
    """Float8 training (torchao) on H100-class GPUs; refused with the reason elsewhere."""
    reshard_after_forward: bool | Literal["auto"] = "auto"
    """FSDP groups free their gathered parameters after forward (True: less memory, one more
    all-gather per group in backward) or keep them until backward (False: faster, more memory);
    "auto" follows the sharding strategy (no for no_shard / shard_grad_op)."""
    pipeline_parallel_degree: int = Field(1, ge=1)
    """Pipeline stages' ranks (outermost mesh axis): divides the world size; tp and the sharding
    group are resolved within each stage's world / pp ranks (docs/pipeline-parallel.md)."""
    microbatches: int = Field(1, ge=1)
    """Microbatches per step: the pipeline schedule's; without pipelining, gradient
    accumulation in ``forward_backward``. Unset: the number of pipeline stages
    (``pipeline_parallel_degree x stages_per_rank``, what every schedule accepts), else 1."""
    pipeline_schedule: PipelineSchedule = "1F1B"
    """torch.distributed.pipelining's schedule, named without "Schedule"."""
    pipeline_stages_per_rank: int | None = Field(None, ge=1)
    """Stages (virtual stages) per rank; None: 1 for GPipe/1F1B, 2 for the others."""
    pipeline_split_points: list[int] | None = None
    """Block index at which each stage after the first begins (stages - 1 increasing
    indices); None splits the blocks evenly."""
    cp_comm_type: CpCommType = "p2p"
    """With context_parallel_degree > 1: how attention crosses the cp ranks: "p2p" (a ring of
    key/value sends), "all_gather" (every rank gathers all keys/values) or "a2a" (Ulysses: heads
    scattered by all-to-all). SMP takes it as ``tsm.transform(model, cp_comm_type=...)``; this
    key is a meshtrain extension (``transform(cp_comm_type=...)`` overrides it)."""
    torch_sagemaker_alias: bool = True
    """Ranks of this job can ``import torch.sagemaker`` (SMP v2 scripts run unchanged, see
    docs/smp-compat.md); False leaves the name unresolved."""

    @model_validator(mode="before")
    @classmethod
    def _default_microbatches(cls, data: Any) -> Any:
        """Unset microbatches follow the pipeline: what the chosen schedule needs."""
        if isinstance(data, dict) and data.get("microbatches") is None:
            chosen = default_microbatches(data)
            if chosen is not None:
                return {**data, "microbatches": chosen}
        return data

    @model_validator(mode="after")
    def _check_relations(self) -> SMPParameters:
        self._check_context_vs_shard()
        self._check_context_combinations()
        self._check_expert_and_sequence_parallel()
        self._check_offloading()
        self._check_selective_vs_split_backward()
        self._check_strategy_vs_degree()
        check_pipeline(self)
        return self

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _check_checkpointing_policy(cls, value: Any) -> Any:
        if isinstance(value, bool) or value in CHECKPOINTING_POLICIES:
            return value
        close = did_you_mean(value, CHECKPOINTING_POLICIES) if isinstance(value, str) else ""
        hint = f" ({close.strip().rstrip('?').lower()}?)" if close else ""
        raise ValueError(
            f"activation_checkpointing={value!r} is not a checkpointing policy{hint}. Use True "
            "(or 'full') to recompute whole blocks, 'selective' to keep their matmul and "
            "attention outputs and recompute the rest, or False."
        )

    @property
    def checkpointing_policy(self) -> Literal["none", "full", "selective"]:
        """``activation_checkpointing`` as a policy name ("none" when it is off)."""
        value = self.activation_checkpointing
        if value is True:
            return "full"
        return value or "none"

    @property
    def stages_per_rank(self) -> int:
        """The resolved ``pipeline_stages_per_rank``."""
        if self.pipeline_stages_per_rank is not None:
            return self.pipeline_stages_per_rank
        return 1 if self.pipeline_schedule in SINGLE_STAGE_SCHEDULES else 2

    def _check_expert_and_sequence_parallel(self) -> None:
        ep = self.expert_parallel_degree
        if ep > 1 and self.sequence_parallel:
            raise ValueError(
                f"expert_parallel_degree={ep} with sequence_parallel=True is not supported: "
                "with TP x EP meshtrain splits each tp group's shared tokens itself before "
                "dispatch, and sequence-split tokens would be split twice. Set "
                "sequence_parallel=False."
            )

    def _check_context_vs_shard(self) -> None:
        cp, hsd = self.context_parallel_degree, self.hybrid_shard_degree
        if hsd != 0 and cp > hsd:
            raise ValueError(
                f"context_parallel_degree={cp} > hybrid_shard_degree={hsd}: the context-parallel "
                f"group is carved out of the sharding group. Use hybrid_shard_degree >= {cp} "
                "(or 0 for the largest possible)."
            )

    def _check_context_combinations(self) -> None:
        cp = self.context_parallel_degree
        if cp == 1:
            return
        refusals = {
            "pipeline_parallel_degree": (
                "a pipeline stage sends one microbatch's activations to the next stage, and "
                "this build does not yet split each microbatch's sequence over the cp ranks "
                "inside torch's pipeline schedules (nor weight their losses by token count)"),
            "expert_parallel_degree": (
                "the MoE layers' load-balancing losses are computed from the routing of the "
                "tokens a rank holds, and this build has no parity check of those losses when "
                "a rank holds only chunks of each sequence"),
        }
        for key, why in refusals.items():
            degree = getattr(self, key)
            if degree > 1:
                raise ValueError(
                    f"context_parallel_degree={cp} with {key}={degree} is not supported: {why}. "
                    f"Use one of them (set the other to 1).")
        if self.compile:
            raise ValueError(
                f"compile=True with context_parallel_degree={cp}: every attention call runs "
                "the context-parallel exchange (send/recv, all-gather or all-to-all) between "
                "the cp ranks, which this build does not compile inside a block. Set "
                "compile=False, or context_parallel_degree=1.")

    def _check_offloading(self) -> None:
        if self.activation_offloading and not self.activation_checkpointing:
            raise ValueError(
                "activation_offloading=True offloads the inputs of checkpointed blocks, but "
                "activation_checkpointing is False. Set activation_checkpointing=True as well."
            )

    def _check_selective_vs_split_backward(self) -> None:
        schedule = self.pipeline_schedule
        if (self.checkpointing_policy == "selective" and self.pipeline_parallel_degree > 1
                and schedule in ZERO_BUBBLE_SCHEDULES):
            raise ValueError(
                f"activation_checkpointing='selective' with pipeline_schedule={schedule!r}: "
                "the zero-bubble schedules split each block's backward in two passes (input, "
                "then weight gradients), each recomputing the block, and torch's selective "
                "checkpointing hands its kept outputs to one recompute only. Use "
                "activation_checkpointing=True (it recomputes twice), or '1F1B' / "
                "'Interleaved1F1B'.")

    def _check_strategy_vs_degree(self) -> None:
        strategy, hsd = self.sharding_strategy, self.hybrid_shard_degree
        if strategy == "no_shard" and hsd >= 2:
            raise ValueError(
                f"sharding_strategy='no_shard' contradicts hybrid_shard_degree={hsd} (which "
                "shards parameters). Use hybrid_shard_degree=1, or drop sharding_strategy."
            )
        if strategy is not None and strategy != "no_shard" and hsd == 1:
            raise ValueError(
                    f"sharding_strategy={strategy!r} contradicts hybrid_shard_degree=1 (no "
                    "sharding). Use sharding_strategy='no_shard', or hybrid_shard_degree 0 or >= 2."
                )

    @property
    def tp_size(self) -> int:
        return self.tensor_parallel_degree

    @property
    def ep_size(self) -> int:
        return self.expert_parallel_degree


class TorchDistributed(_Strict):
    enabled: bool = False
    processes_per_host: int | None = Field(None, ge=1)
    """meshtrain extension: processes per host (default: GPUs on the host, else 1)."""
    max_restarts: int = Field(0, ge=0)
    """meshtrain extension: times every host of a job is restarted after a failure (a new
    rendezvous, the same job, the same /opt/ml). Honoured by local jobs (the supervisor) and
    on Kubernetes (elasticPolicy.maxRestarts); SageMaker refuses a non-zero value. With
    ``fault_tolerance`` it counts per replica group and defaults to
    ``DEFAULT_REPLICA_GROUP_RESTARTS`` (docs/fault-tolerance.md)."""
    stop_grace_seconds: int = Field(120, ge=0)
    """meshtrain extension: on a stop (stop(), Ctrl-C, max_run, SIGTERM to a host) the ranks get
    SIGTERM and this long to save and exit before SIGKILL (SageMaker's figure, 120 s). Local
    jobs honour it."""
    hang_timeout: int | None = Field(None, ge=1)
    """meshtrain extension: seconds without progress (a completed collective, backward pass or
    optimizer step; start-up has its own allowance, docs/local-jobs.md) after which every rank
    dumps its stack and the job fails naming the rank the others wait for."""
    fault_tolerance: FaultTolerance | None = None
    """meshtrain extension: replica groups that fail alone and heal from a live peer
    (docs/fault-tolerance.md); checked against the cluster by
    ``meshtrain.contract.fault_tolerance_checks.check_fault_tolerance``."""

    @model_validator(mode="before")
    @classmethod
    def _replica_groups_restart_by_default(cls, data: Any) -> Any:
        """A fault-tolerant job without max_restarts gets a restart budget per group: a failed
        group then comes back by itself (the others never wait for it)."""
        if (isinstance(data, dict) and data.get("fault_tolerance") is not None
                and "max_restarts" not in data):
            return {**data, "max_restarts": DEFAULT_REPLICA_GROUP_RESTARTS}
        return data


class ModelParallel(_Strict):
    enabled: bool = False
    parameters: SMPParameters = SMPParameters()


class SMDistributed(_Strict):
    modelparallel: ModelParallel | None = None


_UNSUPPORTED_SHAPES = {
    "mpi": "MPI launching is not run by meshtrain; use {'torch_distributed': {'enabled': True}}",
    "pytorchddp": "use {'torch_distributed': {'enabled': True}} (torchrun runs DDP scripts as is)",
    "parameter_server": "parameter servers are a TensorFlow strategy; use torch_distributed",
    "pytorchxla": "XLA is not supported; use torch_distributed",
    "multi_worker_mirrored_strategy": "a TensorFlow strategy; use torch_distributed",
    "instance_groups": "heterogeneous clusters are not supported yet; use one instance type",
}
_UNSUPPORTED_SMDISTRIBUTED = {
    "dataparallel": "SMDDP is not run by meshtrain; use {'torch_distributed': {'enabled': True}}, "
    "whose collectives (NCCL/gloo) serve data parallelism",
}


class DistributionConfig(_Strict):
    """A validated `distribution` dict. Build it with `DistributionConfig.from_dict`."""

    torch_distributed: TorchDistributed = TorchDistributed()
    smdistributed: SMDistributed | None = None
    _raw_parameters: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _smp_needs_torchrun(self) -> DistributionConfig:
        if self.model_parallel_enabled and not self.torch_distributed.enabled:
            raise ValueError(
                "smdistributed.modelparallel (SMP v2) runs under torchrun: add "
                "'torch_distributed': {'enabled': True} to the distribution"
            )
        return self

    @classmethod
    def from_dict(cls, distribution: Any, *, base_dir: Path | None = None) -> DistributionConfig:
        """Validate a SageMaker-style distribution dict; every problem is a ConfigError."""
        if distribution is None:
            return cls()
        if not isinstance(distribution, dict):
            raise ConfigError(
                f"distribution must be a dict, got {type(distribution).__name__}. Example: "
                "{'torch_distributed': {'enabled': True}}"
            )
        _reject_unsupported_shapes(distribution)
        data, raw_parameters = _load_parameters(distribution, base_dir)
        try:
            config = cls.model_validate(data)
        except ValidationError as error:
            raise config_error_from(error, prefix="distribution", known_keys=_KNOWN_KEYS) from None
        config._raw_parameters = raw_parameters
        return config

    def to_dict(self) -> dict[str, Any]:
        """The distribution dict this config was built from (SMP parameters as given, defaults
        left out): what `from_dict` reads back to an equal config, and what JSON carries."""
        torch_distributed = self.torch_distributed.model_dump(exclude_defaults=True)
        if self.torch_distributed.fault_tolerance is not None:  # its default depends on it
            torch_distributed["max_restarts"] = self.torch_distributed.max_restarts
        out: dict[str, Any] = {"torch_distributed": torch_distributed}
        if self.smdistributed is not None:
            smd: dict[str, Any] = {}
            mp = self.smdistributed.modelparallel
            if mp is not None:
                smd["modelparallel"] = {"enabled": mp.enabled, "parameters": self.raw_parameters}
            out["smdistributed"] = smd
        return out

    @property
    def raw_parameters(self) -> dict[str, Any]:
        """The SMP parameters exactly as given: what SageMaker sends as `mp_parameters`."""
        return dict(self._raw_parameters)

    @property
    def model_parallel_enabled(self) -> bool:
        mp = self.smdistributed.modelparallel if self.smdistributed else None
        return bool(mp and mp.enabled)

    @property
    def smp(self) -> SMPParameters:
        """SMP parameters in force (defaults when model parallelism is not enabled)."""
        if self.model_parallel_enabled:
            return self.smdistributed.modelparallel.parameters  # type: ignore[union-attr]
        return SMPParameters()

    def processes_per_host(self, num_gpus: int) -> int:
        """Processes torchrun starts per host: the explicit value, else GPUs, else 1."""
        if self.torch_distributed.processes_per_host:
            return self.torch_distributed.processes_per_host
        return max(num_gpus, 1) if self.torch_distributed.enabled else 1


def _reject_unsupported_shapes(distribution: dict) -> None:
    for key, advice in _UNSUPPORTED_SHAPES.items():
        if key in distribution:
            raise ConfigError(f"distribution[{key!r}] is not supported by meshtrain: {advice}.")
    smd = distribution.get("smdistributed")
    if smd is not None and not isinstance(smd, dict):
        raise ConfigError("distribution['smdistributed'] must be a dict such as "
                          "{'modelparallel': {'enabled': True, 'parameters': {...}}}")
    for key, advice in _UNSUPPORTED_SMDISTRIBUTED.items():
        if smd and key in smd:
            raise ConfigError(
                f"distribution['smdistributed'][{key!r}] is not supported by meshtrain: {advice}."
            )


def _load_parameters(distribution: dict, base_dir: Path | None) -> tuple[dict, dict]:
    """Resolve `parameters` given as a JSON file path; return (data, raw parameters)."""
    smd = distribution.get("smdistributed") or {}
    mp = smd.get("modelparallel") if isinstance(smd, dict) else None
    if not isinstance(mp, dict) or "parameters" not in mp:
        return distribution, {}
    params = mp["parameters"]
    if isinstance(params, str | Path):
        params = read_parameters_file(Path(params) if base_dir is None else base_dir / params,
                                      what="distribution.smdistributed.modelparallel.parameters")
    if not isinstance(params, dict):
        raise ConfigError(
            "distribution.smdistributed.modelparallel.parameters must be a dict or a path to a "
            f"JSON file, got {type(params).__name__}"
        )
    data = {**distribution, "smdistributed": {**smd, "modelparallel": {**mp, "parameters": params}}}
    return data, dict(params)


def read_parameters_file(path: Path, *, what: str) -> dict:
    """A JSON file of SMP parameters as a dict; `what` names the argument in errors."""
    if not path.is_file():
        raise ConfigError(
            f"{what}: {str(path)!r} is not an existing file. Pass a dict or the path to a JSON "
            "file of SMP parameters."
        )
    try:
        loaded = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"{what}: cannot parse {str(path)!r} as a JSON file of SMP parameters: {error}"
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{what}: {str(path)!r} must hold a JSON object of SMP parameters")
    return loaded


def parse_smp_parameters(parameters: Any) -> SMPParameters:
    """Validate a bare SMP parameters dict (as `init(config)` or `mp_parameters` carry it)."""
    if not isinstance(parameters, dict):
        raise ConfigError(
            f"SMP parameters must be a dict, got {type(parameters).__name__}: {parameters!r}"
        )
    try:
        return SMPParameters.model_validate(parameters)
    except ValidationError as error:
        raise config_error_from(error, prefix="parameters", known_keys=_KNOWN_KEYS_BARE) from None


def known_smp_keys() -> list[str]:
    return sorted(SMPParameters.model_fields)


_KNOWN_KEYS = {
    "": ["torch_distributed", "smdistributed"],
    "torch_distributed": list(TorchDistributed.model_fields),
    "torch_distributed.fault_tolerance": list(FaultTolerance.model_fields),
    "smdistributed": ["modelparallel"],
    "smdistributed.modelparallel": list(ModelParallel.model_fields),
    "smdistributed.modelparallel.parameters": list(SMPParameters.model_fields),
}
_KNOWN_KEYS_BARE = {"": list(SMPParameters.model_fields)}

__all__ = [
    "CHECKPOINTING_POLICIES",
    "CheckpointingPolicy",
    "DistributionConfig",
    "ModelParallel",
    "SMDistributed",
    "SMPParameters",
    "TorchDistributed",
    "did_you_mean",
    "known_smp_keys",
    "parse_smp_parameters",
    "read_parameters_file",
]
