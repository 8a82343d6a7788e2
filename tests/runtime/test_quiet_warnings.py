"""The runtime's warning filters are narrow: the TP modules' view warning only (quiet.py)."""

from __future__ import annotations

import warnings

from torch import nn

from meshtrain_runtime.parallel.quiet import quiet_tensor_parallel_view_warnings

VIEW = ("FSDP2-wrapped module ({}) returned a view tensor. An in-place op on this view (e.g., "
        "`x += y`) will silently drop the pre-backward hook")


class Head(nn.Linear):
    pass


def test_only_the_named_modules_view_warning_is_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_tensor_parallel_view_warnings([nn.Embedding(4, 2), Head(2, 4), None])
        warnings.warn(VIEW.format("FSDPEmbedding"), UserWarning, stacklevel=1)
        warnings.warn(VIEW.format("FSDPHead"), UserWarning, stacklevel=1)
        warnings.warn(VIEW.format("FSDPLinear"), UserWarning, stacklevel=1)  # not wrapped
        warnings.warn("FSDPEmbedding did something else", UserWarning, stacklevel=1)
    assert [str(w.message)[:40] for w in caught] == [VIEW.format("FSDPLinear")[:40],
                                                     "FSDPEmbedding did something else"]
