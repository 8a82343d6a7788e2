"""``torch.sagemaker.moe.moe_config.MoEConfig``: SMP's signature, meshtrain's MoE.

Every SMP field is accepted by name and either honoured or refused with the reason:

| field                     | SMP default | here |
| smp_moe                   | True        | True honoured (meshtrain's MoE layer); False refused |
| random_seed               | 12345       | honoured (expert init seed) |
| moe_load_balancing        | "sinkhorn"  | "sinkhorn", "aux_loss", "none" honoured; "balanced"
|                           |             | refused (no published definition) |
| global_token_shuffle      | False       | False honoured; True refused (dispatch is dropless) |
| moe_all_to_all_dispatcher | True        | True honoured; False (all-gather) refused |
| moe_aux_loss_coeff        | 0.001       | honoured |
| moe_z_loss_coeff          | 0.001       | honoured |
| use_cpu_initialization    | False       | accepted: weights initialise where the model lives |

SMP's default balancing is "sinkhorn": experts chosen by Sinkhorn-normalised routing while
training, no load-balancing loss added (Megatron-Core's router; see docs/expert-parallel.md).
"""

from __future__ import annotations

from meshtrain_runtime.modules.moe import MoEConfig as _RuntimeMoEConfig


def MoEConfig(
    smp_moe: bool = True,
    random_seed: int = 12345,
    moe_load_balancing: str = "sinkhorn",
    global_token_shuffle: bool = False,
    moe_all_to_all_dispatcher: bool = True,
    moe_aux_loss_coeff: float = 0.001,
    moe_z_loss_coeff: float = 0.001,
    use_cpu_initialization: bool = False,
) -> _RuntimeMoEConfig:
    """Build meshtrain's `MoEConfig` from SMP's arguments (see the module table)."""
    del use_cpu_initialization  # where rank 0 built its weights does not change the result
    return _RuntimeMoEConfig(
        smp_moe=smp_moe,
        random_seed=random_seed,
        moe_load_balancing=moe_load_balancing,
        global_token_shuffle=global_token_shuffle,
        moe_all_to_all_dispatcher=moe_all_to_all_dispatcher,
        moe_aux_loss_coeff=moe_aux_loss_coeff,
        moe_z_loss_coeff=moe_z_loss_coeff,
    )


__all__ = ["MoEConfig"]
