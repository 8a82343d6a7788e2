"""``TransformerLayer``: the FSDP auto-wrap / checkpointing class of a transformed model.

SMP replaces Hugging Face blocks with its own ``TransformerLayer``; meshtrain keeps the Hugging
Face modules and marks the blocks ``tsm.transform`` found. ``isinstance(block, TransformerLayer)``
is True for those marked blocks, so ``transformer_auto_wrap_policy(transformer_layer_cls=
{TransformerLayer})`` and ``check_fn=lambda m: isinstance(m, TransformerLayer)`` work unchanged.
"""

from __future__ import annotations

from typing import Any

from meshtrain_runtime.compat.smp._transform import BLOCK_MARK


class _MarkedBlock(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        # the instance's own attribute: FSDP / checkpoint wrappers forward getattr to the block
        return getattr(instance, "__dict__", {}).get(BLOCK_MARK) is True

    def __subclasscheck__(cls, subclass: type) -> bool:
        return type.__subclasscheck__(cls, subclass)


class TransformerLayer(metaclass=_MarkedBlock):
    """Matches (isinstance) every transformer block that ``tsm.transform`` converted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "torch.sagemaker.tensor_parallel.transformer.TransformerLayer is not built directly "
            "in meshtrain: tsm.transform keeps the Hugging Face blocks and marks them, and "
            "isinstance(block, TransformerLayer) is True for those."
        )


__all__ = ["TransformerLayer"]
