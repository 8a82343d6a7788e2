"""Models, data, a training loop and tensor accounting shared by the HSDP worker scripts."""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.data import TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

import meshtrain_runtime as mr

VOCAB = 128
SEQ = 16
GLOBAL_BATCH = 8
STEPS = 5
LR = 1e-3


def llama_config(
    hidden: int = 64, layers: int = 2, vocab: int = VOCAB, pad_token_id: int | None = None
) -> LlamaConfig:
    return LlamaConfig(
        pad_token_id=pad_token_id,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=64,
    )


def build_llama(seed: int = 0, **config: Any) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(**config))


class Block(nn.Module):
    """A pre-norm residual MLP block: repeated in an nn.ModuleList, like a transformer layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """A custom (non-HF) language model: embedding, ModuleList of blocks, norm, head."""

    def __init__(self, vocab: int = VOCAB, width: int = 51, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build_custom(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM()


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, mean over tokens (HF computes the same with labels)."""
    if isinstance(model, LlamaForCausalLM):
        return model(input_ids=tokens, labels=tokens).loss
    logits = model(tokens[:, :-1])
    targets = tokens[:, 1:].reshape(-1)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets)


def dataset(seed: int = 1234) -> torch.Tensor:
    """STEPS global batches of token rows; step k uses rows [k*B, (k+1)*B)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (STEPS * GLOBAL_BATCH, SEQ), generator=generator)


def local_rows(tokens: torch.Tensor, dp_rank: int, dp_size: int) -> torch.Tensor:
    subset = mr.shard_dataset(TensorDataset(tokens), dp_rank=dp_rank, dp_size=dp_size)
    return torch.stack([subset[i][0] for i in range(len(subset))])


def train(
    model: nn.Module,
    rows: torch.Tensor,
    *,
    dp_size: int,
    clip: float | None = None,
    clip_fn: Any = None,
    on_last_step: Any = None,
) -> dict[str, list[float]]:
    """AdamW for STEPS steps on `rows` (this rank's rows); losses are global means."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    batch = rows.size(0) // STEPS
    losses: list[float] = []
    norms: list[float] = []
    for step in range(STEPS):
        loss = loss_of(model, rows[step * batch : (step + 1) * batch])
        loss.backward()
        if clip is not None:
            norms.append(float(clip_fn(model, clip)))
        optimizer.step()
        if on_last_step is not None and step == STEPS - 1:
            on_last_step(model, optimizer)
        optimizer.zero_grad()
        losses.append(global_mean(loss.detach(), dp_size))
    return {"losses": losses, "norms": norms}


def global_mean(value: torch.Tensor, dp_size: int) -> float:
    if dp_size == 1 or not dist.is_initialized():
        return float(value)
    total = value.clone()
    dist.all_reduce(total)
    return float(total) / dp_size


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def memory_accounting(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Per-rank bytes of parameters, gradients and Adam moments vs the unsharded totals."""
    params = list(model.parameters())
    moments = [
        state[key]
        for state in optimizer.state.values()
        for key in ("exp_avg", "exp_avg_sq")
    ]
    return {
        "param_total": sum(p.numel() * p.element_size() for p in params),
        "param_local": _bytes(params),
        "param_storage": sum(_local(p).untyped_storage().nbytes() for p in params),
        "grad_local": _bytes([p.grad for p in params if p.grad is not None]),
        "adam_local": _bytes(moments),
        "padding_bound": padding_bound(params),
    }


def padding_bound(params: list[torch.Tensor]) -> int:
    """Most bytes a rank can hold above an exact 1/shard share (ceil-chunking on dim 0)."""
    extra = 0
    for p in params:
        if not isinstance(p, DTensor) or "shard" not in (p.device_mesh.mesh_dim_names or ()):
            continue
        shard = p.device_mesh.size(p.device_mesh.mesh_dim_names.index("shard"))
        rows, row_bytes = p.shape[0], p.numel() // max(p.shape[0], 1) * p.element_size()
        extra += (-(-rows // shard) - rows / shard) * row_bytes
    return int(extra)


def placements_summary(model: nn.Module) -> dict[str, Any]:
    layouts = set()
    plain = []
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor):
            plain.append(name)
            continue
        mesh = p.device_mesh
        layouts.add(
            (
                tuple(mesh.mesh_dim_names),
                tuple(mesh.shape),
                tuple(str(pl) for pl in p.placements),
            )
        )
    return {"layouts": sorted(layouts), "plain": plain}


class StorageTracker(TorchDispatchMode):
    """Peak bytes of live non-meta storages created by ops run inside the mode.

    Storages are tracked by weak reference, so the peak counts what was alive at once (a
    parameter materialised whole would show up as its full size).
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {_storage_ptr(t) for t in tree_flatten((args, kwargs))[0] if _is_tensor(t)}
        for tensor in tree_flatten(out)[0]:
            if not _is_tensor(tensor) or _local(tensor).is_meta:
                continue
            storage = _local(tensor).untyped_storage()
            if storage.data_ptr() and storage.data_ptr() not in seen:
                self._live[storage.data_ptr()] = (weakref.ref(storage), storage.nbytes())
        alive = {ptr: item for ptr, item in self._live.items() if item[0]() is not None}
        self._live = alive
        self.peak = max(self.peak, sum(size for _, size in alive.values()))
        return out


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _storage_ptr(tensor: torch.Tensor) -> int:
    local = _local(tensor)
    return 0 if local.is_meta else local.untyped_storage().data_ptr()
