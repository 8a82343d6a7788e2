"""meshtrain's own collective calls raise no deprecation warning on the installed torch, and
fall back to the older name on a torch without the newer one (parallel/collectives.py)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from meshtrain_runtime.parallel.collectives import all_gather_into


def test_all_gather_is_quiet_and_right(single_process_runtime):
    single_process_runtime.init()
    local = torch.arange(6.0).reshape(3, 2)
    gathered = torch.empty(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch 2.13 warns for all_gather_into_tensor
        all_gather_into(gathered, local, group=dist.group.WORLD)
    assert torch.equal(gathered, local)


def test_a_torch_without_all_gather_single_uses_the_older_name(single_process_runtime,
                                                                  monkeypatch):
    single_process_runtime.init()
    called = []
    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    monkeypatch.setattr(dist, "all_gather_into_tensor",
                        lambda output, local, group=None: called.append(group) or
                        output.copy_(local))
    local, gathered = torch.ones(2), torch.zeros(2)
    all_gather_into(gathered, local, group="the group")
    assert called == ["the group"] and torch.equal(gathered, local)
