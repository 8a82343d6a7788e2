"""Expert parallelism (EP): split each MoE layer's experts over ranks, route tokens by all-to-all.

Layout (torchtitan's, see docs/expert-parallel.md): the EP group is carved out of the sharding
group, ``shard = shard_mod_ep x ep`` with ``ep`` innermost, so the expert mesh is
``(replicate, shard_mod_ep, ep)`` over the same ranks as the main ``(replicate, shard, tp)``
mesh. EP ranks are data-parallel ranks: each sees different tokens.

* `apply_expert_parallel` replaces the expert weights of every MoE layer by an
  `ExpertParallelExperts` module that keeps ``num_experts / ep`` experts (a DTensor sharded on
  dim 0 over the ``ep`` axis; the other experts' weights are freed). Its forward sends every
  (token, expert) assignment to the expert's owner with an autograd all-to-all of uneven
  splits, runs the local experts and sends the results back, where they are combined with the
  router's weights. The router and its top-k choice are untouched.
* `shard_experts_with_fsdp` then FSDP-shards those local experts over the ranks that hold the
  same experts (``shard_mod_ep``, and ``replicate`` for HSDP) on dim 1 (dim 0 indexes experts).
  It must run before the block-level ``fully_shard``, which shards everything else over the
  whole ``shard`` axis.
* Router losses are summed over all data-parallel ranks, so they equal a single process's
  losses on the global batch (see `meshtrain_runtime.modules.moe`).
"""

from __future__ import annotations

import re
import sys
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from meshtrain.contract._messages import divisors_text
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.mesh_axes import MeshAxis
from meshtrain_runtime import torch_api
from meshtrain_runtime.modules.moe import (
    GroupedExperts,
    MoE,
    MoEConfig,
    combine_expert_outputs,
    run_experts,
    sort_by_expert,
)
from meshtrain_runtime.modules.moe_routing import install_hf_routing
from meshtrain_runtime.parallel.expert_losses import install_hf_router_losses
from meshtrain_runtime.parallel.expert_tp import (
    TokenSplit,
    gather_rows,
    scatter_rows,
    token_split_from_mesh,
)

EP_AXIS = MeshAxis.EP


class ExpertParallelExperts(nn.Module):
    """This rank's ``num_experts / ep`` experts of one MoE layer, with all-to-all dispatch.

    Same call signature as Hugging Face's ``MixtralExperts`` and meshtrain's `GroupedExperts`:
    ``forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)``,
    where `top_k_index` holds global expert ids. ``gate_up_proj`` ``(E, 2I, H)`` and
    ``down_proj`` ``(E, H, I)`` are DTensors sharded ``Shard(0)`` over `ep_mesh`; each rank
    stores only its slice.
    """

    def __init__(
        self,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
        act_fn: Any,
        ep_mesh: DeviceMesh,
        init_std: float = 0.02,
        token_split: TokenSplit | None = None,
    ) -> None:
        super().__init__()
        # With TP: the tp group this layer's rows are split over before dispatch (else None).
        self.token_split = token_split
        self.init_std = init_std
        self.num_experts = gate_up_proj.shape[0]
        self.ep_degree = ep_mesh.size()
        self.ep_rank = ep_mesh.get_local_rank()
        self.num_local_experts = self.num_experts // self.ep_degree
        self.act_fn = act_fn
        self.ep_mesh = ep_mesh
        # Straight into _parameters: accelerate's init_empty_weights (AWS's SMP scripts run
        # transform under it) patches register_parameter and cannot rebuild a DTensor.
        self._parameters["gate_up_proj"] = self._local_parameter(gate_up_proj)
        self._parameters["down_proj"] = self._local_parameter(down_proj)
        # Split sizes of the latest forward (host lists), for diagnostics and the benchmark.
        self.last_send_splits: list[int] = []
        self.last_recv_splits: list[int] = []
        self.last_local_tokens: list[int] = []

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) on this rank's (FSDP-)local expert weights, from the global RNG.

        For delayed initialisation: Hugging Face's ``_init_weights`` does not know this class.
        """
        for param in (self.gate_up_proj, self.down_proj):
            _local(param).normal_(0.0, self.init_std)

    @property
    def first_expert(self) -> int:
        """Global id of this rank's first expert."""
        return self.ep_rank * self.num_local_experts

    def _local_parameter(self, full: torch.Tensor) -> nn.Parameter:
        start = self.first_expert
        # clone(): a view would keep the whole tensor (all experts) alive.
        local = _local(full.detach())[start : start + self.num_local_experts].clone()
        if not local.is_meta and local.device.type != self.ep_mesh.device_type:
            local = local.to(self.ep_mesh.device_type)  # as distribute_tensor does
        dtensor = DTensor.from_local(local, self.ep_mesh, [Shard(0)], run_check=False)
        return nn.Parameter(dtensor, requires_grad=full.requires_grad)

    def _exchange_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """Tell every rank how many assignments it gets for each of its experts.

        Returns ``(ep, num_local_experts)``: row ``r`` counts what rank ``r`` sends here.
        """
        received = torch_api.all_to_all_single(counts, None, None, self.ep_mesh)
        return torch_api.wait_collective(received).view(self.ep_degree, self.num_local_experts)

    @property
    def token_split_degree(self) -> int:
        """How many tp ranks share (and split) this layer's rows: 1 without TP."""
        return self.token_split.size if self.token_split is not None else 1

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        split = self.token_split
        if split is None:
            return self._dispatch(hidden_states, top_k_index, top_k_weights)
        # TP x EP: each tp rank dispatches only its share of the (replicated) rows.
        start, stop = split.bounds(hidden_states.shape[0])
        out = self._dispatch(
            scatter_rows(hidden_states, split), top_k_index[start:stop],
            scatter_rows(top_k_weights, split),
        )
        return gather_rows(out, split, hidden_states.shape[0])

    def _dispatch(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        order, token_index, counts = sort_by_expert(top_k_index, self.num_experts)
        recv_counts = self._exchange_counts(counts)
        per_rank = counts.view(self.ep_degree, self.num_local_experts)
        # One host sync for all split sizes: all_to_all needs them as Python ints.
        sizes = torch.cat([per_rank.sum(1), recv_counts.sum(1), recv_counts.sum(0)]).tolist()
        ep = self.ep_degree
        send, recv, local = sizes[:ep], sizes[ep : 2 * ep], sizes[2 * ep :]
        self.last_send_splits, self.last_recv_splits, self.last_local_tokens = send, recv, local
        received = torch_api.all_to_all_single_autograd(
            hidden_states[token_index], recv, send, self.ep_mesh
        )
        expert_out = self._run_local_experts(received, recv_counts, local)
        returned = torch_api.all_to_all_single_autograd(expert_out, send, recv, self.ep_mesh)
        return combine_expert_outputs(hidden_states, returned, order, token_index, top_k_weights)

    def _run_local_experts(
        self, received: torch.Tensor, recv_counts: torch.Tensor, local_tokens: list[int]
    ) -> torch.Tensor:
        """Group the received rows (ordered by source rank, then expert) by expert, run, undo."""
        local_ids = torch.arange(self.num_local_experts, device=received.device)
        expert_of_row = local_ids.repeat(self.ep_degree).repeat_interleave(
            recv_counts.reshape(-1), output_size=received.shape[0]
        )
        by_expert = torch.argsort(expert_of_row, stable=True)
        out = run_experts(
            received[by_expert],
            local_tokens,
            _local(self.gate_up_proj),
            _local(self.down_proj),
            self.act_fn,
        )
        return out[torch.argsort(by_expert)]

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, local_experts=[{self.first_expert}, "
            f"{self.first_expert + self.num_local_experts}), ep_degree={self.ep_degree}"
        )


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


# ----------------------------------------------------------------------------- finding MoE layers


def _ep_plan_patterns(model: nn.Module) -> list[str]:
    """Patterns of the fused-experts modules a Hugging Face config's plans name.

    An experts module X is one whose ``X.gate_up_proj`` and ``X.down_proj`` the config's
    ``base_model_ep_plan`` lists (or, where the release declares none, its
    ``base_model_tp_plan``: transformers 5.1-5.12). Found by the keys, not the styles: the
    style names changed between releases (``moe_tp_experts``, ``ep_dispatch_experts``).
    """
    config = getattr(model, "config", None)
    for attribute in ("base_model_ep_plan", "base_model_tp_plan"):
        plan = getattr(config, attribute, None) or {}
        found = [key.removesuffix(".gate_up_proj") for key in plan
                 if key.endswith(".gate_up_proj")
                 and f"{key.removesuffix('.gate_up_proj')}.down_proj" in plan]
        if found:
            return found
    return []


def _matches(name: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        regex = re.escape(pattern).replace(r"\*", r"\d+")
        if re.search(rf"(^|\.){regex}$", name):
            return True
    return False


def _check_fused_layout(name: str, module: nn.Module) -> None:
    """Only Mixtral's layout is handled: [gate; up] concatenated, not transposed, no bias."""
    weights = [getattr(module, attr, None) for attr in ("gate_up_proj", "down_proj")]
    layout_ok = (
        all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in weights)
        and hasattr(module, "act_fn")
        and not getattr(module, "has_bias", False)
        and not getattr(module, "is_transposed", False)
        and getattr(module, "has_gate", True)
        and getattr(module, "is_concatenated", True)
    )
    if not layout_ok:
        raise ConfigError(
            f"expert parallelism supports fused Mixtral-style experts (3-D gate_up_proj "
            f"(E, 2I, H) and down_proj (E, H, I), no bias); {name} ({type(module).__name__}) "
            f"has another layout. Use expert_parallel_degree=1 for this model."
        )


def find_expert_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, experts module) of every MoE layer EP can split.

    Hugging Face models: the experts modules their config's plans name (`_ep_plan_patterns`;
    Mixtral: ``layers.*.mlp.experts``). meshtrain: the ``experts`` of every `MoE` layer.
    """
    patterns = _ep_plan_patterns(model)
    found = []
    for name, module in model.named_modules():
        if isinstance(module, GroupedExperts) or (patterns and _matches(name, patterns)):
            _check_fused_layout(name, module)
            found.append((name, module))
    return found


def expert_parallel_modules(model: nn.Module) -> list[ExpertParallelExperts]:
    """The `ExpertParallelExperts` modules `apply_expert_parallel` installed in `model`."""
    return [m for m in model.modules() if isinstance(m, ExpertParallelExperts)]


# ----------------------------------------------------------------------------- apply


def _resolve_meshes(ep_mesh: DeviceMesh) -> tuple[DeviceMesh, Any]:
    """(the mesh tokens are dispatched over, the group router losses are summed over)."""
    if ep_mesh.ndim == 1:
        return ep_mesh, ep_mesh.get_group()
    names = ep_mesh.mesh_dim_names or ()
    if EP_AXIS not in names:
        raise ConfigError(
            f"apply_expert_parallel got a {ep_mesh.ndim}-D mesh with axes {names}; pass a 1-D "
            f"EP mesh or a mesh with an {EP_AXIS.value!r} axis such as state.expert_mesh "
            f"('replicate', 'shard_mod_ep', 'ep')."
        )
    # Every rank of the expert mesh is a data-parallel rank: router losses use all of them.
    return ep_mesh[EP_AXIS], torch_api.flatten_mesh(ep_mesh).get_group()


def _check_applicable(model: nn.Module, ep_degree: int, with_tp: bool) -> None:
    if expert_parallel_modules(model):
        raise ConfigError(
            f"{type(model).__name__} already has expert parallelism applied; call "
            f"apply_expert_parallel once per model."
        )
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            continue
        if with_tp and _tp_applied(param):
            continue  # tensor parallelism's own parameters (split or replicated over tp)
        raise ConfigError(
            f"expert_parallel_degree={ep_degree} needs a model whose parameters are plain "
            f"tensors (or tensor parallelism's, with tp_mesh= given), but {name} is already a "
            f"DTensor ({param.placements}). With tensor parallelism pass tp_mesh= and leave the "
            f"experts out of the tensor-parallel plan (tp_plan_without_experts); apply expert "
            f"parallelism before FSDP."
        )


def _tp_applied(param: DTensor) -> bool:
    """A DTensor that tensor parallelism made: on a 1-D mesh, not FSDP's."""
    names = param.device_mesh.mesh_dim_names or ("",)
    return param.device_mesh.ndim == 1 and names[0] == MeshAxis.TP.value


def _check_whole_experts(name: str, experts: nn.Module) -> None:
    """Experts split by tensor parallelism cannot be split over EP ranks as well."""
    for attr in ("gate_up_proj", "down_proj"):
        weight = getattr(experts, attr)
        if isinstance(weight, DTensor) and not all(p.is_replicate() for p in weight.placements):
            raise ConfigError(
                f"{name}.{attr} is split by tensor parallelism ({weight.placements}); with "
                f"expert parallelism the experts stay whole (no TP inside experts). Leave them "
                f"out of tp_plan (tp_plan_without_experts(model) drops the HF plan's expert "
                f"entries)."
            )


def _check_divisible(name: str, num_experts: int, ep_degree: int) -> None:
    if num_experts % ep_degree:
        raise ConfigError(
            f"expert_parallel_degree={ep_degree} does not divide num_experts={num_experts} of "
            f"{name}: each EP rank holds num_experts / expert_parallel_degree = {num_experts} / "
            f"{ep_degree} = {num_experts / ep_degree:.2f} experts. Use expert_parallel_degree "
            f"{divisors_text(num_experts)} (it must also divide hybrid_shard_degree)."
        )


def _init_std(model: nn.Module, experts: nn.Module) -> float:
    """The std the experts were initialised with: theirs, or the HF config's initializer_range."""
    std = getattr(experts, "init_std", None)
    if std is None:
        std = getattr(getattr(model, "config", None), "initializer_range", None)
    return float(std) if std else 0.02


def _hf_routers(model: nn.Module, targets: list[tuple[str, nn.Module]]) -> list[nn.Module]:
    """The top-k routers beside Hugging Face experts (Mixtral's ``mlp.gate``)."""
    routers = []
    for name, _ in targets:
        gate = getattr(model.get_submodule(name.rpartition(".")[0]), "gate", None)
        if isinstance(gate, nn.Module) and hasattr(gate, "top_k"):
            routers.append(gate)
    return routers


def _replace_experts(
    model: nn.Module, targets: list[tuple[str, nn.Module]], dispatch_mesh: DeviceMesh,
    token_split: TokenSplit | None,
) -> None:
    for name, experts in targets:
        parent_name, _, attr = name.rpartition(".")
        replacement = ExpertParallelExperts(
            experts.gate_up_proj, experts.down_proj, experts.act_fn, dispatch_mesh,
            init_std=_init_std(model, experts), token_split=token_split,
        )
        # The old module (all experts) is dropped here: only this rank's slice stays alive.
        setattr(model.get_submodule(parent_name), attr, replacement)


def apply_expert_parallel(
    model: nn.Module,
    ep_mesh: DeviceMesh,
    *,
    moe_config: MoEConfig | None = None,
    tp_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Split the experts of every MoE layer in `model` over `ep_mesh`; returns `model`.

    Args:
        model: a Hugging Face MoE model whose config declares ``base_model_ep_plan`` with fused
            3-D experts (``MixtralForCausalLM``, ``MixtralModel``), or any model with meshtrain
            `MoE` layers. Every rank must hold identical weights (same seed or checkpoint);
            each keeps ``num_experts / ep`` experts and frees the rest.
        ep_mesh: a 1-D mesh of the EP group, or a mesh with an ``"ep"`` axis such as
            ``state.expert_mesh`` (``replicate, shard_mod_ep, ep``). Tokens move over the
            ``ep`` axis; router losses are summed over all ranks of the mesh (the
            data-parallel ranks), or over the 1-D mesh when that is all there is.
        moe_config: coefficients and load balancing. None keeps Hugging Face's
            ``router_aux_loss_coef`` and no z-loss for HF models, and each `MoE` layer's own
            config. ``moe_load_balancing="sinkhorn"`` also makes HF routers pick experts by
            Sinkhorn-normalised routing over each rank's own tokens.
        tp_mesh: with tensor parallelism (applied first, experts left out of its plan: see
            `meshtrain_runtime.parallel.expert_tp.tp_plan_without_experts`), the 1-D ``tp``
            mesh: each tp rank dispatches only its share of the rows (no token is routed
            twice) and the results are gathered back over tp. The EP group is then folded
            over shard x tp ranks (``state.expert_mesh``).

    The router losses of an HF model come out of its forward as usual: pass
    ``output_router_logits=True`` (or set it in the config) and ``outputs.aux_loss`` is the
    global-batch load-balancing loss, ``outputs.z_loss`` the router z-loss, and
    ``outputs.loss`` includes both with their coefficients. For `MoE` layers see
    `meshtrain_runtime.modules.moe.moe_aux_loss`.

    Raises:
        ConfigError: no MoE layer, experts not divisible by the EP degree, parameters that are
            already DTensors (tensor parallelism or FSDP applied first), or a mesh without an
            ``"ep"`` axis.
    """
    dispatch_mesh, loss_group = _resolve_meshes(ep_mesh)
    ep_degree = dispatch_mesh.size()
    _check_applicable(model, ep_degree, with_tp=tp_mesh is not None)
    targets = find_expert_modules(model)
    if not targets:
        plan = _ep_plan_patterns(model)
        raise ConfigError(
            f"expert_parallel_degree={ep_degree} but {type(model).__name__} has no "
            f"mixture-of-experts layers: no module matches its config's base_model_ep_plan "
            f"({plan or 'none declared'}) and it has no meshtrain_runtime.modules.moe.MoE layer. "
            f"Use expert_parallel_degree=1, or build the model with MoE layers."
        )
    for name, experts in targets:
        _check_divisible(name, experts.gate_up_proj.shape[0], ep_degree)
        _check_whole_experts(name, experts)
    _replace_experts(model, targets, dispatch_mesh, token_split_from_mesh(tp_mesh))
    if torch.distributed.get_rank() == 0:  # evidence in the job log that experts were split
        total = targets[0][1].gate_up_proj.shape[0]
        print(f"meshtrain: experts split over ep={ep_degree}: {total // ep_degree} of {total} "
              f"per rank in {len(targets)} MoE layers", file=sys.stderr, flush=True)
    if moe_config is not None:
        install_hf_routing(_hf_routers(model, targets), moe_config.moe_load_balancing)
    for layer in (m for m in model.modules() if isinstance(m, MoE)):
        layer.aux_loss_group = loss_group
        if moe_config is not None:
            layer.config = moe_config
    install_hf_router_losses(model, loss_group, moe_config)
    return model


# ----------------------------------------------------------------------------- FSDP of experts


def _expert_placement(shard_size: int, param: nn.Parameter) -> Shard:
    # dim 0 indexes experts (already split by EP); dim 1 if it divides evenly, as torchtitan.
    return Shard(1) if param.shape[1] % shard_size == 0 else Shard(0)


def _check_expert_fsdp_mesh(ep_mesh: DeviceMesh, expert_fsdp_mesh: DeviceMesh) -> None:
    import torch.distributed as dist

    fsdp_ranks = sorted(expert_fsdp_mesh.mesh.flatten().tolist())
    ep_ranks = sorted(ep_mesh.mesh.flatten().tolist())
    if set(fsdp_ranks) & set(ep_ranks) != {dist.get_rank()}:
        raise ConfigError(
            f"expert_fsdp_mesh ranks {fsdp_ranks} overlap this rank's EP group {ep_ranks}: "
            f"expert parameters must be sharded over ranks that hold the same experts, one per "
            f"EP group. Pass state.expert_mesh['replicate', 'shard_mod_ep'] (or "
            f"['shard_mod_ep']), whose size is hybrid_shard_degree / expert_parallel_degree."
        )


def shard_experts_with_fsdp(
    model: nn.Module, expert_fsdp_mesh: DeviceMesh, **fully_shard_kwargs: Any
) -> nn.Module:
    """FSDP2-shard the local experts of every EP layer over `expert_fsdp_mesh`; returns `model`.

    Call after `apply_expert_parallel` and BEFORE the block-level ``fully_shard`` calls (FSDP
    leaves parameters already owned by a nested ``fully_shard`` alone, so the blocks then shard
    only the non-expert parameters over the full shard axis).

    `expert_fsdp_mesh` holds the ranks with the same experts: ``state.expert_mesh[
    "replicate", "shard_mod_ep"]`` (HSDP) or ``["shard_mod_ep"]``. Expert weights are sharded
    on dim 1 (dim 0 indexes experts) when it divides evenly, else on dim 0. Gradients are
    divided by the full data-parallel size ``expert_fsdp_mesh.size() * ep``, not by the FSDP
    group size: each expert's gradient already sums the tokens of its whole EP group.
    `fully_shard_kwargs` (``reshard_after_forward``, ``mp_policy``, ...) go to ``fully_shard``.
    """
    from torch.distributed.fsdp import fully_shard

    modules = expert_parallel_modules(model)
    if not modules:
        raise ConfigError(
            f"{type(model).__name__} has no expert-parallel layers: call "
            f"apply_expert_parallel before shard_experts_with_fsdp."
        )
    shard_size = expert_fsdp_mesh.size(expert_fsdp_mesh.ndim - 1)
    placement = partial(_expert_placement, shard_size)
    for module in modules:
        _check_expert_fsdp_mesh(module.ep_mesh, expert_fsdp_mesh)
        fully_shard(
            module, mesh=expert_fsdp_mesh, shard_placement_fn=placement, **fully_shard_kwargs
        )
        # the data-parallel size: with TP the EP group also spans tp ranks, which share rows.
        factor = expert_fsdp_mesh.size() * module.ep_degree // module.token_split_degree
        module.set_gradient_divide_factor(float(factor))
        if expert_fsdp_mesh.device_type == "cpu" and shard_size > 1:
            # gloo has no PREMUL_SUM: sum, then divide. (Not with one shard: FSDP would divide
            # twice on its single-rank path.)
            module.set_force_sum_reduction_for_comms(True)
    return model
