"""Models the pipeline tests split: a GPT-2-style plain module, tiny HF decoders, and plain
models that cannot be split (one per reason transform() refuses)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, HEADS, DEPTH, MAX_SEQ = 64, 24, 4, 4, 16
GPT_TP_PLAN = {"h.*.attn.q": "colwise", "h.*.attn.k": "colwise", "h.*.attn.v": "colwise",
               "h.*.attn.o": "rowwise", "h.*.mlp.fc": "colwise", "h.*.mlp.proj": "rowwise"}
HF_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
           "max_position_embeddings": 32, "tie_word_embeddings": False}


class Attention(nn.Module):
    """Causal self-attention with the mask the model's forward built (heads from the width,
    so a column-parallel q/k/v keeps its share of heads)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.o = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class GPTBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn, self.mlp = Attention(width, heads), MLP(width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 style: learned positions added by indexing the weight, a causal mask built in
    forward, LayerNorm, a biased head; plus what a static split by children would lose: a
    residual around the block list and, between blocks 1 and 2, halving the activations of
    rows whose first token is large (data-dependent values, computed without a branch)."""

    def __init__(self, vocab: int = VOCAB, width: int = WIDTH, depth: int = DEPTH) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(MAX_SEQ, width)
        self.h = nn.ModuleList(GPTBlock(width, HEADS) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.size()
        assert t <= MAX_SEQ, "sequence longer than the position table"
        x = self.wte(idx) + self.wpe.weight[:t]
        mask = torch.ones(t, t, dtype=torch.bool, device=idx.device).tril()
        around = x
        for i, block in enumerate(self.h):
            x = block(x, mask)
            if i == 1:
                x = torch.where(idx[:, :1, None] > VOCAB // 2, x * 0.5, x)
        return self.head(self.ln_f(x + around)).view(b, t, -1)


class NanoBlock(nn.Module):
    """nanoGPT-style: one fused q/k/v projection split in three, heads by view."""

    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.ln_1, self.ln_2 = heads, nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's layout: a ModuleDict, positions from arange, dropout, an assert on the
    length, a sizes-as-arguments factory, an optional targets argument (defined here, not in
    a test module, whose asserts pytest rewrites into ifs)."""

    def __init__(self, vocab: int = 64, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(vocab, width), "wpe": nn.Embedding(32, width),
            "drop": nn.Dropout(0.0), "h": nn.ModuleList(NanoBlock(width) for _ in range(depth)),
            "ln_f": nn.LayerNorm(width)})
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        b, t = idx.size()
        assert t <= 32, f"Cannot forward sequence of length {t}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        x = x * torch.ones(b, t, 1, device=idx.device)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


class HalvesOnABranch(GPT):
    """Halves the activations after block 1 when the first token is large: an if on data."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        mask = torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool).tril()
        for i, block in enumerate(self.h):
            x = block(x, mask)
            if i == 1 and idx[0, 0] > VOCAB // 2:
                x = x * 0.5
        return self.head(x)


class ChecksLengthWithIf(GPT):
    """Refuses long inputs with an if on the shape (an assert would be kept)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[1] > MAX_SEQ:
            raise ValueError("too long")
        return super().forward(idx)


class UsesLen(GPT):
    """len() of a tensor: Python work the tracer cannot record."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe.weight[: len(idx[0])]
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        for block in self.h:
            x = block(x, mask)
        return self.head(x)


class SkipsToHead(GPT):
    """Adds block 0's output to the head's input: a block output used by a later layer."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        mask = torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool).tril()
        first = None
        for i, block in enumerate(self.h):
            x = block(x, mask)
            if i == 0:
                first = x
        return self.head(self.ln_f(x + first))


class SkipsBlock(GPT):
    """Never runs its last block."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        mask = torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool).tril()
        for block in self.h[:-1]:
            x = block(x, mask)
        return self.head(x)


class TwoInputs(GPT):
    """Needs a second input that forward_backward does not pass."""

    def forward(self, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return super().forward(idx + 0 * positions)


class TiedGPT(GPT):
    """GPT-2's tied input embedding and head (the embedding on the first stage, the head on
    the last)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight


UNSPLITTABLE = {
    "data_dependent_branch": (HalvesOnABranch, "data-dependent control flow"),
    "shape_branch": (ChecksLengthWithIf, "branches on the input's shape"),
    "untraceable": (UsesLen, "its forward cannot be traced"),
    "block_output_reused": (SkipsToHead, "a block output used by a later layer"),
    "block_not_called": (SkipsBlock, "never calls block 'h.3'"),
    "two_inputs": (TwoInputs, "takes 2 required inputs (idx, positions)"),
    "tied": (TiedGPT, "ties 'wte.weight' (stage 0"),
}
"""A plain model per reason a split is refused: (class, words of the ConfigError)."""


def build_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT()
