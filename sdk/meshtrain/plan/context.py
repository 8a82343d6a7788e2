"""Context parallelism in the plan: attention's bytes per layer by ``cp_comm_type``, the
layouts the runtime refuses, and the longest sequence a layout fits.

Notation, per rank and layer for one micro-batch: ``cp`` ranks share each sequence; a rank holds
``n = b s / cp`` tokens (SMP's load-balanced layout: chunks ``r`` and ``2 cp - 1 - r`` of ``2 cp``
equal chunks); ``c`` bytes per element in the compute dtype; ``a`` attention heads and ``g``
key/value heads per tensor-parallel rank (``heads / tp``); ``d`` the head dim. One rank's k (or
v) is ``K = c n g d`` bytes, its q (or the attention's output) ``Q = c n a d``. The ring and
all-gather attention (meshtrain_runtime.parallel.context) accumulate the gradients of k and v in
float32 and send them so: ``G = 4 n g d`` (``= K`` in fp32 training). Bytes are what one rank
sends, with the ring formulas of meshtrain.plan.comm (``(cp-1)/cp`` of a full message for an
all-gather, a reduce-scatter or an all-to-all).

- ``p2p`` (ring; SMP's default): forward runs cp steps; between two steps every rank sends the
  k and v block it holds to the next rank and receives the previous rank's: ``cp - 1`` sends of
  ``2K``, i.e. the k and v of ``(cp-1)/cp`` of the sequence pass each rank. Backward passes the
  k and v blocks round the ring again (``cp - 1`` sends of ``2K``) and, beside them, the
  gradients dk and dv accumulated for each block; those take one hop more to come home
  (``cp`` sends of ``2G``). Per layer: forward ``2K (cp-1)``, backward
  ``2K (cp-1) + 2G cp``.
- ``all_gather``: forward all-gathers k and v (``(cp-1)/cp x 2K cp = 2K (cp-1)``, the ring's
  volume in one collective). Nothing gathered is kept for backward (it would hold cp x the
  keys and values of a rank), so backward gathers k and v again (``2K (cp-1)``) and then
  reduce-scatters dk and dv to their owners (``2G (cp-1)``). Per layer: forward ``2K (cp-1)``,
  backward ``(2K + 2G)(cp-1)``.
- ``a2a`` (Ulysses): heads are scattered and the sequence gathered by all-to-alls of q, k and v
  before attention and of its output after (4 all-to-alls, ``(cp-1)/cp`` of each); backward
  runs the same four on the gradients (autograd's, in the compute dtype). Per layer: forward
  ``(cp-1)/cp (2Q + 2K)``, backward the same. Every rank must get whole heads: the model's
  heads and key/value heads (Hugging Face models are refused otherwise) and ``a`` divisible by
  cp; where ``g`` is not (tensor parallelism leaves a rank fewer key/value heads than cp), k
  and v are repeated to the ``a`` heads before the exchange, and ``K = Q``.

Full recomputation repeats a checkpointed layer's forward, its collectives included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from meshtrain.contract.errors import ConfigError
from meshtrain.plan.models import ModelSpec

CPCommType = Literal["p2p", "all_gather", "a2a"]
CP_COMM_TYPES: tuple[str, ...] = get_args(CPCommType)
_F32 = 4
MAX_SEQ_LEN = 1 << 24
"""The longest sequence `max_seq_len` tries (16M tokens)."""


@dataclass(frozen=True)
class ContextLayerBytes:
    """Bytes one rank sends per layer for attention under context parallelism."""

    forward: float
    backward: float

    def per_step(self, num_layers: int, recompute: float = 0.0) -> float:
        """Over `num_layers` layers, `recompute` of them fully recomputed (forward again)."""
        return num_layers * ((1.0 + recompute) * self.forward + self.backward)


def context_layer_bytes(model: ModelSpec, *, cp: int, tokens: float, compute_bytes: int,
                        tensor_parallel_degree: int = 1,
                        comm_type: str = "p2p") -> ContextLayerBytes:
    """One layer's attention bytes per rank (see the module docstring); `tokens` is the rank's
    ``b s / cp``."""
    if cp == 1:
        return ContextLayerBytes(0.0, 0.0)
    check_comm_type(comm_type)
    d = model.attention_head_dim
    elements = tokens * model.num_key_value_heads / tensor_parallel_degree * d
    k, g = compute_bytes * elements, max(compute_bytes, _F32) * elements
    q = compute_bytes * tokens * model.num_attention_heads / tensor_parallel_degree * d
    if comm_type == "a2a" and (model.num_key_value_heads // tensor_parallel_degree) % cp:
        k = q  # a tp rank's key/value heads do not split: repeated to the heads first
    if comm_type == "p2p":
        return ContextLayerBytes(2 * k * (cp - 1), 2 * k * (cp - 1) + 2 * g * cp)
    if comm_type == "all_gather":
        return ContextLayerBytes(2 * k * (cp - 1), (2 * k + 2 * g) * (cp - 1))
    each_way = (cp - 1) / cp * (2 * q + 2 * k)
    return ContextLayerBytes(each_way, each_way)


def check_comm_type(comm_type: str) -> None:
    """Refuse a cp_comm_type the runtime does not know."""
    if comm_type not in CP_COMM_TYPES:
        raise ConfigError(f"cp_comm_type={comm_type!r} is not one of "
                          f"{', '.join(map(repr, CP_COMM_TYPES))}.")


def check_context_layout(model: ModelSpec, *, seq_len: int, cp: int,
                         tensor_parallel_degree: int = 1, comm_type: str = "p2p") -> None:
    """Raise ConfigError where the runtime cannot split the sequence or the heads over cp."""
    if cp == 1:
        return
    check_comm_type(comm_type)
    if seq_len % (2 * cp):
        lower = seq_len // (2 * cp) * 2 * cp
        raise ConfigError(
            f"seq_len={seq_len} is not divisible by 2 x context_parallel_degree = {2 * cp}: "
            f"SMP's load-balanced layout cuts each sequence into {2 * cp} equal chunks (rank r "
            f"keeps chunks r and {2 * cp - 1}-r). Use a multiple of {2 * cp}, e.g. "
            f"{max(lower, 2 * cp)} or {lower + 2 * cp}.")
    if comm_type == "a2a":
        _check_a2a_heads(model, cp, tensor_parallel_degree)


def _check_a2a_heads(model: ModelSpec, cp: int, tp: int) -> None:
    """Ulysses scatters whole heads: the model's heads and key/value heads (Hugging Face models
    are refused otherwise) and the attention heads of one tensor-parallel rank divide by cp."""
    per_rank = model.num_attention_heads // tp
    wholes = [("num_attention_heads", model.num_attention_heads),
              ("num_key_value_heads", model.num_key_value_heads)]
    if tp > 1:
        wholes.append((f"num_attention_heads / tensor_parallel_degree {tp}", per_rank))
    for name, heads in wholes:
        if heads % cp:
            raise ConfigError(
                f"cp_comm_type='a2a' scatters whole heads over context_parallel_degree={cp} "
                f"ranks, but {name} = {heads} is not divisible by {cp} ({heads} % {cp} = "
                f"{heads % cp}). Use cp_comm_type='p2p' or 'all_gather', or a "
                f"context_parallel_degree that divides {heads}.")


def max_seq_len(fits: Callable[[int], bool | None], cp: int,
                limit: int = MAX_SEQ_LEN) -> int | None:
    """The longest sequence, a multiple of ``2 cp`` (1 without cp), for which `fits(seq_len)`
    holds: memory grows with the sequence, so a doubling search then a bisection. None when
    fit cannot be judged (no GPU memory), 0 when not even the shortest fits."""
    unit = 2 * cp if cp > 1 else 1
    first = fits(unit)
    if first is None:
        return None
    if not first:
        return 0
    good = 1  # in units
    while good * 2 * unit <= limit and fits(good * 2 * unit):
        good *= 2
    bad = good * 2
    while bad - good > 1:
        middle = (good + bad) // 2
        if middle * unit <= limit and fits(middle * unit):
            good = middle
        else:
            bad = middle
    return good * unit


__all__ = ["CP_COMM_TYPES", "MAX_SEQ_LEN", "CPCommType", "ContextLayerBytes",
           "check_comm_type", "check_context_layout", "context_layer_bytes", "max_seq_len"]
