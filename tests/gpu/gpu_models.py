"""The tiny Llama of the `gpu` tier and the training loop its cases compare (see conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Shape:
    """The tiny Llama of a case: bigger on a GPU (float8 needs dims that are multiples of 16)."""

    hidden: int
    intermediate: int
    vocab: int
    seq_len: int
    batch: int
    layers: int = 2


GPU_SHAPE = Shape(hidden=256, intermediate=512, vocab=512, seq_len=128, batch=4)
CPU_SHAPE = Shape(hidden=64, intermediate=128, vocab=128, seq_len=32, batch=2)


def build_llama(shape: Shape, device: torch.device, *, seed: int = 0,
                **overrides: Any) -> nn.Module:
    """A tiny HF Llama from `seed` (fp32, SDPA, no cache), in training mode on `device`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=shape.vocab,
                         max_position_embeddings=shape.seq_len, tie_word_embeddings=False,
                         attn_implementation="sdpa", use_cache=False, **overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        return LlamaForCausalLM(config).train()


def token_ids(shape: Shape, device: torch.device, *, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, shape.vocab, (shape.batch, shape.seq_len), device=device,
                         generator=generator)


@dataclass
class Run:
    """What `train` returns: the losses of each step and the model's full weights after them."""

    losses: list[float]
    weights: dict[str, torch.Tensor]
    model: nn.Module


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local part, which on a world of one is the whole tensor (read without a
    collective: cpu_offload keeps the shards in host memory, which NCCL cannot gather)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    assert local.shape == tensor.shape, "the gpu tier runs on a world of one"
    return local


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, fp32, on the CPU."""
    return {name: whole(param).detach().float().cpu() for name, param in model.named_parameters()}


def train(runtime: Any, params: dict[str, Any], shape: Shape, device: torch.device, *,
          steps: int = 3, fused: bool | None = None,
          step_fn: Callable[..., float] | None = None,
          on_model: Callable[[nn.Module], Any] | None = None) -> Run:
    """init(params) and transform() a fresh tiny Llama, then `steps` AdamW steps on one batch
    (`step_fn(model, optimizer, ids)` instead of the plain step; `on_model(model)` first)."""
    runtime.reset()
    runtime.init(params)
    model = runtime.transform(build_llama(shape, device))
    if on_model is not None:
        on_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    ids = token_ids(shape, device)
    losses = []
    for _ in range(steps):
        if step_fn is not None:
            losses.append(step_fn(model, optimizer, ids))
            continue
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return Run(losses, full_weights(model), model)


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


class LlamaStage(nn.Module):
    """Blocks of an HF Llama as one pipeline stage: the first stage embeds token ids, the last
    ends with the final norm and the head; each computes its own rotary embeddings."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module], *, first: bool,
                 last: bool) -> None:
        super().__init__()
        inner = model.model
        self.embed = inner.embed_tokens if first else None
        self.layers = nn.ModuleList(blocks)
        self.rotary = inner.rotary_emb
        self.norm, self.head = (inner.norm, model.lm_head) if last else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x) if self.embed is not None else x
        positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
        rotary = self.rotary(hidden, positions)
        for layer in self.layers:
            out = layer(hidden, position_embeddings=rotary, attention_mask=None)
            hidden = out[0] if isinstance(out, tuple) else out
        return self.head(self.norm(hidden)) if self.head is not None else hidden
