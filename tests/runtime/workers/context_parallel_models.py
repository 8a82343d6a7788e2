"""Tiny models, data and single-process references of the context-parallel parity worker."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB, SEQ, GLOBAL_BATCH, STEPS, LR = 64, 16, 4, 3, 1e-2
HEAD_DIM = 8
IGNORED = 5  # way (b): the first targets of every row are -100 (all in chunk 0 of 2 x cp)
SDPA_TP_PLAN = {"layers.*.q": "colwise", "layers.*.k": "colwise", "layers.*.v": "colwise",
                "layers.*.o": "rowwise", "layers.*.up": "colwise", "layers.*.down": "rowwise"}


class SdpaBlock(nn.Module):
    """Pre-norm block whose attention is a plain F.scaled_dot_product_attention call."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        b, s, _ = h.shape
        q, k, v = (p(h).view(b, s, -1, HEAD_DIM).transpose(1, 2) for p in (self.q, self.k, self.v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attention.transpose(1, 2).reshape(b, s, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class SdpaLM(nn.Module):
    def __init__(self, width: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.layers = nn.ModuleList(SdpaBlock(width) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


OTHER_HF = ("mistral", "qwen2", "gpt_neox")  # way (b) in one layout: rotary + GQA families
_SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": VOCAB, "max_position_embeddings": 64,
          "tie_word_embeddings": False, "attn_implementation": "sdpa"}


def build_other_hf(name: str, sliding_window: int = 4096) -> nn.Module:
    torch.manual_seed(0)
    if name == "mistral":  # a window longer than the sequence: plain causal attention
        return MistralForCausalLM(MistralConfig(**_SIZES, num_key_value_heads=2,
                                                sliding_window=sliding_window))
    if name == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**_SIZES, num_key_value_heads=2))
    return GPTNeoXForCausalLM(GPTNeoXConfig(**_SIZES))


def build(name: str) -> nn.Module:
    if name in OTHER_HF:
        return build_other_hf(name)
    torch.manual_seed(0)
    if name.startswith("llama"):  # "llama2": 2 heads (a2a at cp4 cannot scatter them)
        heads = 2 if name == "llama2" else 4
        return LlamaForCausalLM(LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=heads,
            num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
            tie_word_embeddings=False, attn_implementation="sdpa"))
    return SdpaLM()


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def data() -> torch.Tensor:
    """STEPS global batches of SEQ + 1 tokens (inputs [:-1], targets [1:])."""
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (STEPS * GLOBAL_BATCH, SEQ + 1), generator=generator)


def batch(step: int) -> torch.Tensor:
    return data()[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]


def targets_b(rows: torch.Tensor) -> torch.Tensor:
    """Way (b)'s targets: shifted, with the first IGNORED of every row ignored (-100)."""
    targets = rows[:, 1:].clone()
    targets[:, :IGNORED] = -100
    return targets


def logits_of(output: object) -> torch.Tensor:
    return getattr(output, "logits", output)


def hf_labels_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """HF's own loss: labels= the inputs, shifted by the model (across the whole sequence)."""
    return model(input_ids=ids, labels=ids).loss


def reference(name: str, way: str) -> list[float]:
    """One process, the whole global batch per step, fp32, AdamW."""
    model = build(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    step_loss: Callable[[torch.Tensor], torch.Tensor]
    if way == "a" and name == "llama":
        def step_loss(rows: torch.Tensor) -> torch.Tensor:
            return hf_labels_loss(model, rows[:, :-1])
    elif way == "a":
        def step_loss(rows: torch.Tensor) -> torch.Tensor:
            return loss_fn(logits_of(model(rows[:, :-1])), rows[:, 1:])
    else:
        def step_loss(rows: torch.Tensor) -> torch.Tensor:
            return loss_fn(logits_of(model(rows[:, :-1])), targets_b(rows))
    losses = []
    for step in range(STEPS):
        loss = step_loss(batch(step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
