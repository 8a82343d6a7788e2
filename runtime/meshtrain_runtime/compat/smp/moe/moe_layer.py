"""``torch.sagemaker.moe.moe_layer.MoELayer``: matches the MoE layers after ``tsm.transform``.

``isinstance(m, MoELayer)`` is True for meshtrain's ``MoE`` layers and for a Hugging Face MoE
block whose experts expert parallelism replaced, so AWS's ``check_fn`` (activation
checkpointing of MoE layers) selects them.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from meshtrain_runtime.modules.moe import MoE
from meshtrain_runtime.parallel.expert import ExpertParallelExperts


class _MoELayerMeta(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        if isinstance(instance, MoE):
            return True
        return isinstance(instance, nn.Module) and any(
            isinstance(child, ExpertParallelExperts) for child in instance.children()
        )


class MoELayer(metaclass=_MoELayerMeta):
    """Matches (isinstance) every MoE layer of a transformed model; not built directly."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "MoELayer is not built directly in meshtrain: tsm.transform(model, config=MoEConfig"
            "(...)) converts the model's MoE blocks, and isinstance(block, MoELayer) is True."
        )


__all__ = ["MoELayer"]
