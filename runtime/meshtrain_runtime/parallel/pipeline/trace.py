"""Trace a plain model's own forward into a graph in which every block is one call (torch.fx).

`trace_forward` runs the model's forward once on symbolic values (`torch.fx.Tracer`, the public
symbolic tracer): the blocks, and torch.nn's own layers, are recorded as calls of the original
modules, and everything the forward does around them (positions added by indexing a weight,
masks built from the input's shape, residuals around the block list, asserts) as graph nodes.
Stages are then cut from that graph (`meshtrain_runtime.parallel.pipeline.graph`), so what a
stage runs is the model's own code, not a guess at it.

What cannot be recorded is refused here, as a ConfigError naming the line of the forward and
the fix: control flow on a tensor's values or on the input's shape (the branch taken is not
known without data; asserts are the exception: they are kept as runtime checks), anything else
the tracer cannot follow, and a forward that needs more inputs than forward_backward passes.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import linecache
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from meshtrain.contract.errors import ConfigError

TORCH_DIR = str(Path(torch.__file__).parent)
_THIS_DIR = str(Path(__file__).parent)
SIZE_FACTORIES = ("ones", "zeros", "empty", "rand", "randn")
"""torch functions that take sizes as separate arguments (``torch.ones(t, t)``), which torch's
argument parser refuses as traced values; while tracing they get them as one tuple."""
SHAPE_READS = frozenset({"size", "shape", "dim", "ndim", "numel", "device", "dtype"})
"""Attribute and method names whose result depends on a tensor's metadata, not its values."""


@dataclass
class TracedForward:
    """A model's forward as a graph; `constants` are tensors the forward created while traced."""

    graph: fx.Graph
    constants: dict[str, torch.Tensor]


class _ControlFlow(Exception):
    """The forward converted a traced value to bool outside an assert (an if, while, and/or)."""

    def __init__(self, node: fx.Node, where: str) -> None:
        super().__init__(where)
        self.node, self.where = node, where


class _BlockTracer(fx.Tracer):
    """torch.fx's tracer with the blocks as leaves and asserts kept as ``torch._assert``."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self._blocks = {id(block) for block in blocks}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return id(m) in self._blocks or super().is_leaf_module(m, module_qualified_name)

    def to_bool(self, obj: fx.Proxy) -> bool:
        frame = _user_frame(inspect.currentframe())
        if frame is not None and _is_assert(frame):
            self.create_proxy("call_function", runtime_assert,
                              (obj, f"assert at {_where(frame)} failed"), {})
            return True
        raise _ControlFlow(obj.node, _where(frame) if frame is not None else "its forward")


def runtime_assert(condition: Any, message: str) -> None:
    """An assert of the forward, kept in the stage graph: raise AssertionError when false."""
    if not condition:
        raise AssertionError(message)


def trace_forward(model: nn.Module, blocks: list[nn.Module]) -> TracedForward:
    """`model`'s forward as an fx graph with one call per block; ConfigError if it cannot be."""
    name = type(model).__name__
    concrete = _concrete_arguments(model)
    tracer = _BlockTracer(blocks)
    tracer.record_stack_traces = True  # node.stack_trace: the line a refusal names
    try:
        with _sizes_as_one_tuple():
            graph = tracer.trace(model, concrete_args=concrete)
    except _ControlFlow as error:
        raise _control_flow_error(name, error) from None
    except ConfigError:
        raise
    except Exception as error:  # whatever the tracer could not follow
        raise ConfigError(
            f"{name} cannot be split into pipeline stages: its forward cannot be traced "
            f"(torch.fx) at {_deepest_user_line(error)}: {type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}. Pipelining "
            "runs the forward's own code split at the blocks, so it must be traceable: keep "
            "Python-level work on tensors (len(), int(), numpy, iterating a tensor) out of the "
            "forward, or use pipeline_parallel_degree=1.") from None
    return TracedForward(graph, _take_constants(model, graph))


@contextlib.contextmanager
def _sizes_as_one_tuple() -> Iterator[None]:
    """While tracing, ``torch.ones(t, t)`` with traced sizes becomes ``torch.ones((t, t))``
    (the same call; the graph records the tuple form)."""
    originals = {name: getattr(torch, name) for name in SIZE_FACTORIES}
    for name, original in originals.items():
        setattr(torch, name, _packing(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch, name, original)


def _packing(factory: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(factory)
    def packed(*sizes: Any, **kwargs: Any) -> Any:
        if len(sizes) > 1 and any(isinstance(size, fx.Proxy) for size in sizes):
            return factory(tuple(sizes), **kwargs)
        return factory(*sizes, **kwargs)
    return packed


def _concrete_arguments(model: nn.Module) -> dict[str, Any]:
    """forward_backward passes one input: every later argument keeps its default."""
    parameters = list(inspect.signature(model.forward).parameters.values())
    positional = [p for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p.name for p in positional if p.default is inspect.Parameter.empty]
    if len(required) != 1:
        raise ConfigError(
            f"{type(model).__name__}.forward takes {len(required)} required inputs "
            f"({', '.join(required) or 'none'}), but a pipeline passes one: forward_backward"
            "(model, inputs, targets, ...) sends `inputs` to the first stage. Give the other "
            "arguments defaults, or use pipeline_parallel_degree=1.")
    return {p.name: p.default for p in positional if p.default is not inspect.Parameter.empty}


def _control_flow_error(name: str, error: _ControlFlow) -> ConfigError:
    if _reads_values(error.node):
        return ConfigError(
            f"{name} cannot be split into pipeline stages: its forward has data-dependent "
            f"control flow at {error.where} (a branch on a tensor's values). Each stage runs a "
            "fixed piece of the forward, recorded once, so the branch taken could not follow "
            "the data. Compute both sides and select with torch.where(condition, a, b), or use "
            "pipeline_parallel_degree=1.")
    return ConfigError(
        f"{name} cannot be split into pipeline stages: its forward branches on the input's "
        f"shape at {error.where}, which the tracer does not know when transform() runs. Write "
        "the check as an assert (kept as a runtime check in the stage that holds it) or "
        "compute without the branch, or use pipeline_parallel_degree=1.")


def _reads_values(node: fx.Node) -> bool:
    """Whether `node` depends on tensor values, not only on shapes and other metadata."""
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if _is_metadata_read(current):
            continue
        if current.op in ("placeholder", "get_attr", "call_module"):
            return True
        stack.extend(current.all_input_nodes)
    return False


def _is_metadata_read(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target in SHAPE_READS:
        return True
    return (node.op == "call_function" and node.target is getattr
            and len(node.args) > 1 and node.args[1] in SHAPE_READS)


def _take_constants(model: nn.Module, graph: fx.Graph) -> dict[str, torch.Tensor]:
    """Tensors the forward created while traced: the tracer stores them on the model as
    ``_tensor_constant<i>``; keep them here and leave the user's model as it was."""
    known = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    known |= {name for name, _ in model.named_buffers(remove_duplicate=False)}
    constants: dict[str, torch.Tensor] = {}
    for node in graph.nodes:
        if node.op == "get_attr" and node.target not in known and "." not in node.target:
            constants[node.target] = getattr(model, node.target)
    for target in constants:
        delattr(model, target)
    return constants


def _user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame outside torch and this package: the model's code."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith((TORCH_DIR, _THIS_DIR)):
            return frame
        frame = frame.f_back
    return None


def _is_assert(frame: FrameType) -> bool:
    """Whether the bool() being taken in `frame` is an assert statement's test."""
    instructions = list(dis.get_instructions(frame.f_code))
    offsets = [i.offset for i in instructions]
    at = next((k for k, offset in enumerate(offsets)
               if offset in (frame.f_lasti, 2 * frame.f_lasti)), None)
    if at is None:
        return False
    rest = [i for i in instructions[at:at + 4] if i.opname not in ("TO_BOOL", "CACHE", "NOP")]
    return (len(rest) >= 2 and "IF_TRUE" in rest[0].opname
            and (rest[1].opname == "LOAD_ASSERTION_ERROR"
                 or rest[1].argval in (AssertionError, "AssertionError")))


def _where(frame: FrameType) -> str:
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} ({line!r})"


def _deepest_user_line(error: BaseException) -> str:
    """file:line (source) of the last traceback entry in the model's code."""
    entries = [entry for entry in traceback.extract_tb(error.__traceback__)
               if not entry.filename.startswith((TORCH_DIR, _THIS_DIR))]
    if not entries:
        return "its forward"
    entry = entries[-1]
    return f"{Path(entry.filename).name}:{entry.lineno} ({(entry.line or '').strip()!r})"


__all__ = ["SHAPE_READS", "TORCH_DIR", "TracedForward", "runtime_assert", "trace_forward"]
