"""A training script written for SageMaker's model parallelism library v2, run by meshtrain.

Nothing here imports meshtrain: it is SMP v2's flow as AWS documents it. ``tsm.init()`` reads the
estimator's ``smdistributed.modelparallel`` parameters, ``tsm.transform`` splits the Hugging Face
Llama over the ``tp`` ranks, the script wraps it in FSDP1 with a transformer auto-wrap policy on
``tsm.tensor_parallel.transformer.TransformerLayer`` (SMP picks the process group and sharding
strategy), checkpoints activations, clips with ``tsm.grad_norm.clip_grad_norm_`` and writes
SMP's sharded checkpoint (one folder per tp rank, written by replica 0 over FSDP's group). With
``--resume-from N`` it loads the checkpoint of step N and goes on from there.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.sagemaker as tsm
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.sagemaker.distributed.checkpoint.state_dict_loader import load
from torch.sagemaker.distributed.checkpoint.state_dict_saver import save
from torch.sagemaker.distributed.checkpoint.state_dict_utils import init_optim_state
from torch.sagemaker.grad_norm import clip_grad_norm_
from torch.sagemaker.tensor_parallel.transformer import TransformerLayer
from torch.sagemaker.utils.process_group_utils import get_global_ranks
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 128


def tiny_config() -> LlamaConfig:
    """Llama's architecture at toy size; README.md says which values a real run uses."""
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, use_cache=False)


def global_batch(step: int, rows: int, seq_len: int) -> torch.Tensor:
    """Step `step`'s whole batch (the same on every rank): counting sequences mod VOCAB."""
    generator = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (rows, 1), generator=generator)
    return (start + torch.arange(seq_len)) % VOCAB


def build(lr: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """SMP's flow: transform, then the script's own FSDP1 call and activation checkpointing."""
    torch.manual_seed(0)  # every rank builds the same weights before they are split
    model = tsm.transform(LlamaForCausalLM(tiny_config()))
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls={TransformerLayer})
    device_id = torch.cuda.current_device() if torch.cuda.is_available() else None
    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=device_id)
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, TransformerLayer))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def checkpoint_dir(root: str, step: int) -> str:
    """AWS's layout: <root>/<name>-<N>steps, plus tp<degree>-<tp rank> with tensor parallelism."""
    path = os.path.join(root, f"llama-{step}steps")
    tp = tsm.state.tensor_parallel_degree
    return os.path.join(path, f"tp{tp}-{tsm.state.tp_rank}") if tp > 1 else path


def save_checkpoint(model, optimizer, root: str, step: int) -> None:
    group = model.process_group
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, optimizer),
                 "total_steps": step}
    if tsm.state.ranker.get_rep_rank(dist.get_rank()) == 0:  # one replica writes
        save(state, checkpoint_id=checkpoint_dir(root, step), process_group=group,
             coordinator_rank=min(get_global_ranks(group)))
    dist.barrier()


def load_checkpoint(model, optimizer, root: str, step: int) -> int:
    init_optim_state(optimizer)
    group = model.process_group
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, optimizer),
                 "total_steps": 0}
        load(state, checkpoint_id=checkpoint_dir(root, step), process_group=group,
             coordinator_rank=min(get_global_ranks(group)))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer,
                                                                state["optimizer"]))
    return state["total_steps"]


def mean_loss(loss: torch.Tensor) -> float:
    """AWS's reduce_loss: the mean over all ranks (tp ranks repeat their dp rank's loss)."""
    value = loss.detach().reshape(1).clone()
    dist.all_reduce(value)
    return float(value) / dist.get_world_size()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-at", type=int, default=3)
    parser.add_argument("--resume-from", type=int, default=-1)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("SM_CHECKPOINT_DIR",
                                                                   "/opt/ml/checkpoints"))
    args, _ = parser.parse_known_args()  # SMP jobs also receive --mp_parameters

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    tsm.init()
    rank, state = dist.get_rank(), tsm.state
    if rank == 0:
        print(f"layout: tp={state.tp_size} x hybrid_shard_degree={state.hybrid_shard_degree}, "
              f"dp_size={state.dp_size}", flush=True)
    model, optimizer = build(args.lr)
    start = 0
    if args.resume_from >= 0:
        start = load_checkpoint(model, optimizer, args.checkpoint_dir, args.resume_from)
        if rank == 0:
            print(f"resumed at step {start} from {args.checkpoint_dir}", flush=True)

    per_rank = args.global_batch // state.dp_size
    steps, losses = [], []
    for step in range(start, args.steps):
        ids = global_batch(step, args.global_batch, args.seq_len)
        ids = ids[state.dp_rank * per_rank:(state.dp_rank + 1) * per_rank]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        steps.append(step)
        losses.append(mean_loss(loss))
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
        if step + 1 == args.save_at:
            save_checkpoint(model, optimizer, args.checkpoint_dir, step + 1)

    if rank == 0:
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
        result = {"steps": steps, "train:loss": losses, "resumed_from": start or None}
        (out / "losses.json").write_text(json.dumps(result))
        print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
