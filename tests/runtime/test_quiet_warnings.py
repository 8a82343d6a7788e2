"""The runtime's warning filters are narrow: the TP modules' view warning only, DTensor's
advice on all-gathers only (quiet.py, pinned against the installed torch's own message)."""

from __future__ import annotations

import warnings

from torch import nn

from meshtrain_runtime.parallel.quiet import (
    REDISTRIBUTE_LOGGER,
    quiet_gather_order_advice,
    quiet_tensor_parallel_view_warnings,
)

VIEW = ("FSDP2-wrapped module ({}) returned a view tensor. An in-place op on this view (e.g., "
        "`x += y`) will silently drop the pre-backward hook")


class Head(nn.Linear):
    pass


def test_only_the_named_modules_view_warning_is_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_tensor_parallel_view_warnings([nn.Embedding(4, 2), Head(2, 4), None])
        warnings.warn(VIEW.format("FSDPEmbedding"), UserWarning, stacklevel=1)
        warnings.warn(VIEW.format("FSDPHead"), UserWarning, stacklevel=1)
        warnings.warn(VIEW.format("FSDPLinear"), UserWarning, stacklevel=1)  # not wrapped
        warnings.warn("FSDPEmbedding did something else", UserWarning, stacklevel=1)
    assert [str(w.message)[:40] for w in caught] == [VIEW.format("FSDPLinear")[:40],
                                                     "FSDPEmbedding did something else"]


# Issue 35: transformers imports torchao whenever it is installed; on every rank of every HF job
# torchao 0.18 printed "Failed to load ..._C_mxfp8..." and torch 2.13 its Enum deprecation.
HF_SCRIPT = """
from transformers import LlamaConfig, LlamaForCausalLM
LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, vocab_size=64))
import logging
logging.getLogger("torchao").warning("Failed to build something else")  # still shown
print("built")
"""


def test_a_rank_building_an_hf_model_prints_no_torchao_import_noise(tmp_path):
    import subprocess
    import sys

    from ci_guards import import_or_skip

    import_or_skip("torchao")  # the noise needs torchao installed (the dev and fp8 extras)
    script = tmp_path / "build_llama.py"
    script.write_text(HF_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "meshtrain_runtime.host.rank_entry",
                           str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "built" in done.stdout
    assert "Failed to load" not in done.stderr, done.stderr
    assert "Enum subclass" not in done.stderr, done.stderr
    assert "Failed to build something else" in done.stderr  # the filter is narrow


def test_only_dtensors_all_gather_advice_is_dropped(single_process_runtime, caplog):
    """torch's own function logs the advice (the guard: its message and argument order are
    what the filter reads); an all-gather's is dropped, an all-reduce's is kept."""
    import logging

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, _redistribute

    single_process_runtime.init()
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("shard_mod_ep", "ep"))
    quiet_gather_order_advice()
    quiet_gather_order_advice()  # idempotent: one filter
    logger = logging.getLogger(REDISTRIBUTE_LOGGER)
    assert len([f for f in logger.filters if type(f).__name__ == "_DropExactGatherAdvice"]) == 1
    caplog.set_level(logging.WARNING, logger=REDISTRIBUTE_LOGGER)
    for dims, comm in (((1, 0), "all_gather"), ((0, 1), "all_reduce")):  # torch warns once
        _redistribute._warn_flatten_optimization_not_possible(  # per (mesh, dims, reason)
            mesh, dims, (Shard(0), Shard(0)), (Replicate(), Replicate()), 2, comm,
            "non_ascending_mesh_dims")
    advice = [r.getMessage() for r in caplog.records if r.name == REDISTRIBUTE_LOGGER]
    assert len(advice) == 1 and "2 sequential all_reduce operations" in advice[0], advice
    assert "This is suboptimal" in advice[0]
