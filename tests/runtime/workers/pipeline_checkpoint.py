"""Checkpoints between pipeline layouts: ``save DIR`` on 4 ranks, ``load DIR`` on 2,
``load_pp4 DIR`` on 4 ranks. save and load run the tiny HF Llama, then the GPT-2-style plain
module (DIR/gpt: its position table is read by attribute in forward, so the stage holds it
outside any module it calls).

save: pp2 x dp2 (hybrid_shard_degree 2 within each stage, 1F1B, 2 microbatches) trains a tiny
HF Llama for SAVE_AT steps, saves model and AdamW state with save_checkpoint, exports the full
state dict (DIR/export_pp), then trains on and reports the losses of the steps after the save.
load: 2 ranks without pipelining (full shard) build the model from another seed,
load_checkpoint, export (DIR/export_plain) and save again without pipelining (DIR/plain), then
train the same steps. load_pp4: pp4 loads the pp2 x dp2 checkpoint (another pipeline degree),
exports (DIR/export_pp4) and saves it again (DIR/pp4: one rank per stage, so plain tensors,
not FSDP's DTensors); then, in the same launch, pp2 x dp2 loads the checkpoint saved without
pipelining, and the pp4 one. The losses and the exports must match
(tests/runtime/test_pipeline_checkpoint.py).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from pipeline_parity import GLOBAL_BATCH, LR, STEPS, build, data, loss_fn
from report import report

import meshtrain_runtime as mr
from meshtrain_runtime.checkpoint import export_full_state_dict

SAVE_AT = 2
PARAMETERS = {
    "save": {"pipeline_parallel_degree": 2, "hybrid_shard_degree": 2, "microbatches": 2},
    "load": {},  # 2 ranks, full shard, no pipelining
    "load_pp4": {"pipeline_parallel_degree": 4, "microbatches": 4},  # another pp degree
}
PLAIN_TO_PP = PARAMETERS["save"]  # the no-PP and pp4 checkpoints are loaded at pp2 x dp2


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                steps: range) -> list[float]:
    st, tokens, losses = mr.state, data(), []
    for step in steps:
        batch = tokens[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
        rows = batch.chunk(st.dp_size)[st.dp_rank]
        loss = mr.forward_backward(model, rows[:, :-1], rows[:, 1:], loss_fn=loss_fn)
        optimizer.step()
        optimizer.zero_grad()
        total = loss.clone()
        dist.all_reduce(total)
        losses.append(float(total) / st.world_size)
    return losses


def main(mode: str, directory: str) -> None:
    run(mode, PARAMETERS[mode], directory)
    if mode in ("save", "load"):  # the GPT-2-style plain module too, in the same launch
        mr.reset()
        run(mode, PARAMETERS[mode], f"{directory}/gpt", name="gpt")
    if mode == "load_pp4":  # more cases in the same launch
        mr.reset()
        run("plain_to_pp2", PLAIN_TO_PP, f"{directory}/plain")
        mr.reset()
        run("pp4_to_pp2", PLAIN_TO_PP, f"{directory}/pp4")


def run(case: str, parameters: dict, directory: str, name: str = "llama") -> None:
    saving = case == "save"
    mr.init(parameters)
    torch.manual_seed(0)
    model = mr.transform(build(name) if saving else _other_seed(name))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    if saving:
        train_steps(model, optimizer, range(SAVE_AT))
        mr.save_checkpoint(directory, model, optimizer, step=SAVE_AT)
        export_full_state_dict(model, f"{directory}/export_pp")
    else:
        info = mr.load_checkpoint(directory, model, optimizer)
        assert info["step"] == SAVE_AT, info
    if case == "load":  # the unpipelined model's export, and a checkpoint saved without PP
        export_full_state_dict(model, f"{directory}/export_plain")
        mr.save_checkpoint(f"{directory}/plain", model, optimizer, step=SAVE_AT)
    if case == "load_pp4":  # pp4 on 4 ranks: one rank per stage, plain tensors (no FSDP)
        export_full_state_dict(model, f"{directory}/export_pp4")
        mr.save_checkpoint(f"{directory}/pp4", model, optimizer, step=SAVE_AT)
    losses = train_steps(model, optimizer, range(SAVE_AT, STEPS))
    report({"case": case, "model": name, "losses": losses, "pp_size": mr.state.pp_size,
            "names": sorted(n for n, _ in model.named_parameters())})


def _other_seed(name: str) -> torch.nn.Module:
    model = build(name)
    with torch.no_grad():  # weights that differ from the saved ones: the load must fill them
        for parameter in model.parameters():
            parameter.add_(0.5)
    return model


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
