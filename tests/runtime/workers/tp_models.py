"""Tiny models, batches and training loops shared by the tensor-parallel workers.

Every rank builds the same model from the same seed; the single-process reference is trained
on every rank in the same launch (no extra process start-up), then compared with the parallel
run of a copy of the same initial weights on the same global batch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

VOCAB = 96
SEQ = 8
LOCAL_BATCH = 2
STEPS = 3
LR = 1e-2


class CustomAttention(nn.Module):
    """Reshapes with ``self.num_heads`` (which TP must turn into the per-rank count)."""

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=True) for _ in range(3))
        self.out = nn.Linear(dim, dim, bias=True)
        self.attn_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-1, -2)) / self.head_dim**0.5
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        probs = self.attn_drop(scores.masked_fill(~causal, float("-inf")).softmax(-1))
        y = (probs @ v).transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.out(y)


class CustomBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, dropout: float, resid_dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CustomAttention(dim, num_heads, dropout)
        self.ff = nn.Sequential()
        self.ff.up = nn.Linear(dim, 4 * dim)
        self.ff.act = nn.GELU()
        self.ff.down = nn.Linear(4 * dim, dim)
        self.resid_drop = nn.Dropout(resid_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.resid_drop(self.attn(self.ln1(x)))
        return x + self.ff(self.ln2(x))


class CustomLM(nn.Module):
    """A GPT-like model with no HF config: it needs a user plan."""

    def __init__(self, dim: int = 32, num_heads: int = 4, layers: int = 2,
                 dropout: float = 0.0, resid_dropout: float = 0.0,
                 checkpoint: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(
            CustomBlock(dim, num_heads, dropout, resid_dropout) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.checkpoint = checkpoint

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))


CUSTOM_PLAN = {
    "embed": "rowwise",
    "blocks.*.attn.q": "colwise",
    "blocks.*.attn.k": "colwise",
    "blocks.*.attn.v": "colwise",
    "blocks.*.attn.out": "rowwise",
    "blocks.*.ff.up": "colwise",
    "blocks.*.ff.down": "rowwise",
    "head": "colwise_gather_output",
}


class PlainBlock(nn.Module):
    """Issue 35's block: norm -> up -> down in one module (no attention or MLP submodule), so
    the block itself is the tensor-parallel region and its norm lies inside it. With
    `norm_between` the norm runs between up and down instead (a plan error TP must catch)."""

    def __init__(self, dim: int, norm_between: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim if norm_between else dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.norm_between = norm_between

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_between:
            return x + self.down(self.norm(F.gelu(self.up(x))))
        return x + self.down(F.gelu(self.up(self.norm(x))))


class PlainLM(nn.Module):
    """Embedding, PlainBlocks, final norm, head: a user's own model with no HF config."""

    def __init__(self, dim: int = 32, layers: int = 2, norm_between: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleList(PlainBlock(dim, norm_between) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


# docs/tensor-parallel.md's worked example: the norm inside the block says 'replicate'
PLAIN_PLAN = {
    "embed": "rowwise",
    "layers.*.norm": "replicate",
    "layers.*.up": "colwise",
    "layers.*.down": "rowwise",
    "head": "colwise_gather_output",
}
# the least a user writes: the norm before the colwise projection is found and replicated
PLAIN_MIN_PLAN = {"layers.*.up": "colwise", "layers.*.down": "rowwise"}


def plan_for(kind: str) -> dict[str, str] | None:
    """The tp_plan a case passes (None: the HF config's own)."""
    return {"custom": CUSTOM_PLAN, "plain": PLAIN_PLAN, "plain_min": PLAIN_MIN_PLAN}.get(kind)


def build_model(kind: str) -> nn.Module:
    """A tiny model of `kind` (llama, llama_tied, qwen2, neox, mixtral, custom, plain,
    plain_min).

    Initialised from seed 0, so identical on every rank.
    """
    from transformers import (
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=VOCAB,
                 max_position_embeddings=64, num_attention_heads=4)
    if kind in ("llama", "llama_tied"):
        config = LlamaConfig(**{**small, "num_attention_heads": 8}, num_key_value_heads=4,
                             tie_word_embeddings=kind == "llama_tied")
        return LlamaForCausalLM(config)
    if kind == "qwen2":  # q/k/v biases: split with their projections
        return Qwen2ForCausalLM(Qwen2Config(**small, num_key_value_heads=2))
    if kind == "neox":
        return GPTNeoXForCausalLM(GPTNeoXConfig(**small))
    if kind == "mixtral":
        config = MixtralConfig(**small, num_key_value_heads=2, num_local_experts=4,
                               num_experts_per_tok=2)
        return MixtralForCausalLM(config)
    if kind == "custom":
        return CustomLM()
    if kind in ("plain", "plain_min"):
        return PlainLM()
    raise ValueError(kind)


def global_batch(dp_degree: int, step: int) -> torch.Tensor:
    """The global batch of `step`: dp_degree x LOCAL_BATCH sequences, the same on all ranks.

    Every step sees the same batch, so a falling loss shows that the model trains.
    """
    del step
    generator = torch.Generator().manual_seed(100)
    return torch.randint(0, VOCAB, (dp_degree * LOCAL_BATCH, SEQ), generator=generator)


def causal_lm_loss(model: nn.Module, ids: torch.Tensor, parallel_loss: bool) -> torch.Tensor:
    """Next-token cross entropy; with `parallel_loss` on vocab-split DTensor logits."""
    out = model(ids) if isinstance(model, CustomLM | PlainLM) else model(input_ids=ids)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    shifted, targets = logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
    if parallel_loss:
        with loss_parallel():
            return F.cross_entropy(shifted, targets)
    return F.cross_entropy(shifted, targets)


def backward(loss: torch.Tensor, parallel_loss: bool) -> None:
    if parallel_loss:
        with loss_parallel():
            loss.backward()
    else:
        loss.backward()


def train(model: nn.Module, batch_of: Callable[[int], torch.Tensor], *,
          parallel_loss: bool = False) -> list[float]:
    """STEPS AdamW steps (torch defaults: foreach); returns the global loss of each step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        loss = causal_lm_loss(model, batch_of(step), parallel_loss)
        backward(loss, parallel_loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(_global_mean(loss))
    return losses


def _global_mean(loss: torch.Tensor) -> float:
    value = loss.detach()
    if isinstance(value, DTensor):
        value = value.full_tensor()
    if dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)  # tp ranks hold equal values: mean over ranks = mean over dp
        value /= dist.get_world_size()
    return float(value)


def reference_losses(kind: str, dp_degree: int, parallel_loss: bool = False) -> list[float]:
    """The single-process run: the whole global batch on one unsplit copy of the model."""
    model = build_model(kind)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        loss = causal_lm_loss(model, global_batch(dp_degree, step), False)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The repeated layers (FSDP units), as transform's block finder would pick them."""
    if isinstance(model, CustomLM):
        return list(model.blocks)
    if isinstance(model, PlainLM):
        return list(model.layers)
    return list(model.base_model.layers)


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
