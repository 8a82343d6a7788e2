"""The planner's encoder-decoder models against a tiny HF T5 and BART built by `transform()`
(one process).

One process resolves to ``no_shard`` (FSDP2 over a shard group of one): `transform()` wraps every
block (T5Block; BartEncoderLayer, BartDecoderLayer) as its own FSDP group
(``_no_split_modules``), the tied ``shared`` embedding and head (and BART's positional
embeddings and embedding norms) stay in the root. fp32, no dropout, batch 2, encoder 24 tokens,
decoder 16.
Measured, for ``reshard_after_forward`` "auto" (no_shard keeps every group gathered) and true:

- the saved activations of a transformed model's step (the runtime's SavedActivationMeter)
  against `activation_bytes` (exact: the HF model saves the same tensors under FSDP2);
- the peak bytes above the step's start per phase (PhaseMemoryMeter, torch's profiler memory
  events) of a second step after ``zero_grad(set_to_none=True)`` against `phase_memory` for
  CPU ranks, within PHASE_BOUND.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.plan import Training, activation_bytes, resolve_model
from meshtrain.plan.phases import PHASES, phase_memory

B, S_ENC, S_DEC = 2, 24, 16
PHASE_BOUND = 0.10


def _config(family: str) -> Any:
    from transformers import BartConfig, T5Config

    if family == "bart":
        return BartConfig(d_model=64, encoder_ffn_dim=160, decoder_ffn_dim=160,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_layers=2,
                          decoder_layers=2, vocab_size=128, max_position_embeddings=64,
                          dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          pad_token_id=1, bos_token_id=0, eos_token_id=2,
                          decoder_start_token_id=2)
    return T5Config(d_model=64, d_ff=160, d_kv=16, num_heads=4, num_layers=2,
                    num_decoder_layers=2, vocab_size=128, decoder_start_token_id=0,
                    pad_token_id=0, dropout_rate=0.0, feed_forward_proj="relu")


def _model(family: str) -> torch.nn.Module:
    from transformers import BartForConditionalGeneration, T5ForConditionalGeneration

    cls = BartForConditionalGeneration if family == "bart" else T5ForConditionalGeneration
    return cls(_config(family))


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 128, (B, S_ENC), generator=generator),
            torch.randint(0, 128, (B, S_DEC), generator=generator))


def _phase_peaks(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """As tests/runtime/workers/calib_support.phase_peaks, with decoder labels."""
    from meshtrain_runtime.diagnostics.memory import PhaseMemoryMeter

    head = model.get_output_embeddings()
    meter = PhaseMemoryMeter()

    def head_output(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        output.register_hook(lambda grad: meter.mark("loss"))

    hooks = [head.register_forward_pre_hook(lambda module, args: meter.mark("forward")),
             head.register_forward_hook(head_output)]
    ids, labels = _batch(2)
    with meter:
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        meter.mark("backward")
        del loss
        time.sleep(0.05)
        optimizer.step()
        meter.mark("optimizer_step")
    for hook in hooks:
        hook.remove()
    return meter.peaks


def _measure(state: Any, family: str, reshard: Any) -> dict[str, Any]:
    import meshtrain_runtime as mr
    from meshtrain_runtime.diagnostics.memory import SavedActivationMeter

    state.reset()
    mr.init({"reshard_after_forward": reshard})
    torch.manual_seed(0)
    model = mr.transform(_model(family))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids, labels = _batch(1)
    with SavedActivationMeter() as meter:
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss
    return {"saved": meter.result.bytes, "phases": _phase_peaks(model, optimizer),
            "strategy": mr.state.sharding_strategy}


def _planned(family: str, reshard: Any) -> tuple[float, dict[str, float]]:
    spec = resolve_model(_config(family).to_dict())
    training = Training(seq_len=S_ENC, decoder_seq_len=S_DEC, micro_batch=B, precision="fp32")
    degrees = resolve_degrees(SMPParameters(), 1)
    acts = activation_bytes(spec, seq_len=S_ENC, decoder_seq_len=S_DEC, micro_batch=B,
                            precision="fp32")
    phases = phase_memory(spec, degrees, training, acts, on_gpu=False,
                          reshard_after_forward=None if reshard == "auto" else reshard)
    return acts.total_bytes, {p.name: p.total - p.terms["sharded_parameters"]
                              - p.terms["optimizer_states"] for p in phases}


@pytest.mark.parametrize("reshard", ["auto", True])
@pytest.mark.parametrize("family", ["t5", "bart"])
def test_encoder_decoder_by_transform_against_the_plan(single_process_runtime: Any, family: str,
                                                       reshard: Any) -> None:
    measured = _measure(single_process_runtime, family, reshard)
    assert measured["strategy"] == "no_shard"
    saved, phases = _planned(family, reshard)
    assert measured["saved"] == saved
    report = ", ".join(f"{phase} {measured['phases'][phase]} / {phases[phase]:.0f} "
                       f"({phases[phase] / measured['phases'][phase] - 1:+.1%})"
                       for phase in PHASES)
    print(f"\n{family} no_shard reshard={reshard}: saved {measured['saved']} / {saved}; {report}")
    for phase in PHASES:
        assert abs(measured["phases"][phase] / phases[phase] - 1) < PHASE_BOUND, (
            phase, measured["phases"], phases)
