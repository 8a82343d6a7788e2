"""The model, loss and sample record of the loader's layout runs (workers/data_layouts.py), also
imported by tests/runtime/test_data_layouts.py for its one-process reference."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build() -> torch.nn.Module:
    """A tiny Llama over UTF-8 bytes (257 ids), the same weights on every call (seed 0)."""
    config = LlamaConfig(vocab_size=257, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False, use_cache=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def samples(inputs: torch.Tensor, targets: torch.Tensor) -> list[list[int]]:
    """The whole samples of a batch: the inputs and each row's last target."""
    return torch.cat([inputs, targets[:, -1:]], dim=1).tolist()
