"""Cut a plain model's traced forward into stage graphs at block boundaries.

The forward's graph (`trace.trace_forward`) is cut right before the first block of every stage
after the first: each stage runs the nodes between its cuts, in the forward's own order, so what
happens between blocks goes with the blocks. A value defined before a cut and used after it
crosses the cut, by its kind:

- "block": computed from a block's output. It crosses only as an input of the next stage's
  first block (the residual stream); any other use of a block output after a later block ("a
  block output used by a later non-block layer") is refused: no stage boundary carries it.
- "param": computed from parameters (an embedding, the residual taken around the block list)
  or by random ops: sent to the stages that use it, through the stages between.
- "input": computed from the inputs, buffers and constants only (positions, masks, shapes):
  recomputed by every stage that uses it from the model inputs, which are sent along.

`plan_graph` traces and checks; `stage_specs` cuts; `GraphStage` runs one stage's graph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.distributed.tensor import DTensor

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.pipeline.stages import PipelineStageModule
from meshtrain_runtime.parallel.pipeline.trace import TORCH_DIR, TracedForward, trace_forward

_KIND = {"input": 0, "param": 1, "block": 2}
_RANDOM = re.compile(r"rand|dropout|bernoulli|multinomial|normal|poisson|exponential")


@dataclass
class GraphPlan:
    """A traced forward, its block calls in order and the kind of every node."""

    traced: TracedForward
    block_paths: list[str]
    kinds: dict[fx.Node, str]
    order: dict[fx.Node, int]

    @property
    def nodes(self) -> list[fx.Node]:
        return list(self.traced.graph.nodes)


@dataclass
class StageSpec:
    """One stage's graph and what it holds (original paths)."""

    index: int
    graph: fx.Graph
    block_paths: list[str]
    module_paths: list[str] = field(default_factory=list)
    tensor_paths: list[str] = field(default_factory=list)


def plan_graph(model: nn.Module, blocks: list[nn.Module]) -> GraphPlan:
    """Trace `model` and check that its forward calls every block once, in order."""
    names = {id(module): name for name, module in model.named_modules()}
    block_paths = [names[id(block)] for block in blocks]
    traced = trace_forward(model, blocks)
    calls = [n.target for n in traced.graph.nodes if n.op == "call_module"
             and n.target in set(block_paths)]
    if calls != block_paths:
        raise ConfigError(_order_error(type(model).__name__, block_paths, calls))
    order = {node: i for i, node in enumerate(traced.graph.nodes)}
    return GraphPlan(traced, block_paths, _classify(model, traced, set(block_paths)), order)


def stage_specs(plan: GraphPlan, bounds: list[int], model_name: str) -> list[StageSpec]:
    """Cut the graph before the first block of every stage after the first."""
    nodes = plan.nodes
    block_nodes = {n.target: n for n in nodes if n.target in set(plan.block_paths)}
    firsts = [block_nodes[plan.block_paths[b]] for b in bounds[1:-1]]
    cuts = [0, *(plan.order[n] for n in firsts), len(nodes)]
    stage_of = {n: next(s for s in range(len(cuts) - 1) if cuts[s] <= plan.order[n] < cuts[s + 1])
                for n in nodes}
    needs = [_stage_needs(plan, nodes[cuts[s]:cuts[s + 1]], stage_of, s)
             for s in range(len(cuts) - 1)]
    sent = _sent_at_cuts(plan, needs, stage_of, len(cuts) - 1)
    for k, first in enumerate(firsts, start=1):
        _check_cut(plan, sent[k], first, model_name)
    return [_build_spec(plan, s, nodes[cuts[s]:cuts[s + 1]], needs[s], sent, bounds)
            for s in range(len(cuts) - 1)]


class GraphStage(PipelineStageModule):
    """A stage that runs its piece of the model's traced forward (Python code fx generates)."""

    def __init__(self, spec: StageSpec, num_stages: int) -> None:
        super().__init__(spec.index, num_stages, spec.block_paths)
        code = spec.graph.python_code(root_module="self")
        namespace = dict(code.globals)
        exec(compile(code.src, f"<pipeline stage {spec.index}>", "exec"), namespace)
        object.__setattr__(self, "_run", namespace["forward"])
        object.__setattr__(self, "_sends", not self.is_last)

    def forward(self, *args: Any) -> Any:
        out = self._run(self, *args)
        if not self._sends:
            return out
        for index, value in enumerate(out):
            if not isinstance(value, torch.Tensor):
                raise ConfigError(
                    f"Pipeline stage {self.stage_index} must send value {index} to the next "
                    f"stage, but it is a {type(value).__name__}, not a tensor: stages only "
                    "exchange tensors. Compute it from the inputs or parameters as a tensor, "
                    "or use pipeline_parallel_degree=1.")
        return tuple(value.contiguous() for value in out)  # sends need contiguous memory


def _classify(model: nn.Module, traced: TracedForward, blocks: set[str]) -> dict[fx.Node, str]:
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    kinds: dict[fx.Node, str] = {}
    for node in traced.graph.nodes:
        inherited = max((kinds[a] for a in node.all_input_nodes), key=_KIND.get, default="input")
        if node.op == "call_module" and node.target in blocks:
            kinds[node] = "block"
        elif node.op == "get_attr":
            kinds[node] = "param" if node.target in params else "input"
        elif _learned_or_random(model, node):  # sent, never recomputed
            kinds[node] = max(inherited, "param", key=_KIND.get)
        else:
            kinds[node] = inherited
    return kinds


def _learned_or_random(model: nn.Module, node: fx.Node) -> bool:
    if node.op == "call_module":
        module = model.get_submodule(node.target)
        return any(True for _ in module.parameters()) or bool(
            _RANDOM.search(type(module).__name__.lower()))
    return bool(_RANDOM.search(getattr(node.target, "__name__", str(node.target))))


def _stage_needs(plan: GraphPlan, own: list[fx.Node], stage_of: dict[fx.Node, int],
                 stage: int) -> tuple[list[fx.Node], list[fx.Node]]:
    """(values this stage receives, values it recomputes), each in forward order."""
    pending = [a for n in own for a in n.all_input_nodes if stage_of[a] != stage]
    received: set[fx.Node] = set()
    recomputed: set[fx.Node] = set()
    while pending:
        node = pending.pop()
        if node in received or node in recomputed:
            continue
        real_input = node.op == "placeholder" and not node.args  # no default: sent along
        if plan.kinds[node] == "input" and not real_input:
            recomputed.add(node)
            pending.extend(node.all_input_nodes)
        else:
            received.add(node)
    return sorted(received, key=plan.order.get), sorted(recomputed, key=plan.order.get)


def _sent_at_cuts(plan: GraphPlan, needs: list[tuple[list[fx.Node], list[fx.Node]]],
                  stage_of: dict[fx.Node, int], num_stages: int) -> list[list[fx.Node]]:
    """Values crossing each cut k (k = 1 .. stages - 1), in forward order; [0] is empty."""
    crossing: list[set[fx.Node]] = [set() for _ in range(num_stages)]
    for stage, (received, _) in enumerate(needs):
        for value in received:
            for cut in range(stage_of[value] + 1, stage + 1):
                crossing[cut].add(value)
    return [sorted(values, key=plan.order.get) for values in crossing]


def _check_cut(plan: GraphPlan, sent: list[fx.Node], first_block: fx.Node, name: str) -> None:
    """Block outputs cross a cut only as inputs of the next stage's first block."""
    for value in sent:
        if plan.kinds[value] == "block" and value not in first_block.all_input_nodes:
            user = next(u for u in value.users if plan.order[u] > plan.order[first_block])
            raise ConfigError(
                f"{name} cannot be split into pipeline stages: {_describe(value)} comes from "
                f"a block's output and is used after block {first_block.target!r} by "
                f"{_describe(user)} (a block output used by a later layer). A stage boundary "
                "before a block carries only that block's inputs. Use the block output only "
                "up to the next block (e.g. a residual inside the block), or use "
                "pipeline_parallel_degree=1.")


def _build_spec(plan: GraphPlan, stage: int, own: list[fx.Node],
                need: tuple[list[fx.Node], list[fx.Node]], sent: list[list[fx.Node]],
                bounds: list[int]) -> StageSpec:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    recomputed = need[1]
    if stage > 0:
        for value in sent[stage]:
            env[value] = graph.placeholder(value.name)
    for node in recomputed + [n for n in own if n.op != "output"]:
        if node not in env:
            env[node] = graph.node_copy(node, env.__getitem__)
    last = stage == len(bounds) - 2
    if last:
        (output,) = [n for n in plan.nodes if n.op == "output"]
        graph.output(fx.map_arg(output.args[0], env.__getitem__))
    else:
        graph.output(tuple(env[v] for v in sent[stage + 1]))
    _read_tensors_locally(graph)
    spec = StageSpec(stage, graph, plan.block_paths[bounds[stage]:bounds[stage + 1]])
    for node in graph.nodes:
        if node.op == "call_module" and node.target not in spec.module_paths:
            spec.module_paths.append(node.target)
        elif node.op == "get_attr" and node.target not in spec.tensor_paths:
            spec.tensor_paths.append(node.target)
    return spec


def local_value(value: Any) -> Any:
    """A Replicate DTensor as this rank's local tensor, anything else as it is: tensor
    parallelism makes the parameters its plan leaves whole Replicate DTensors and lets their
    modules compute on the local tensors (meshtrain_runtime.parallel.tensor); a forward that
    reads such a parameter by attribute (``self.wpe.weight[:t]``) gets the same here."""
    if isinstance(value, DTensor) and all(p.is_replicate() for p in value.placements):
        return value.to_local()
    return value


def _read_tensors_locally(graph: fx.Graph) -> None:
    for node in [n for n in graph.nodes if n.op == "get_attr"]:
        users = list(node.users)
        with graph.inserting_after(node):
            local = graph.call_function(local_value, (node,))
        for user in users:
            user.replace_input_with(node, local)


def _describe(node: fx.Node) -> str:
    """The node's name and the model's line that made it (from the trace's stack)."""
    lines = (node.stack_trace or "").splitlines()
    for index in range(len(lines) - 1, -1, -1):
        match = re.search(r'File "([^"]+)", line (\d+)', lines[index])
        if match and not match.group(1).startswith(TORCH_DIR):
            code = lines[index + 1].strip() if index + 1 < len(lines) else ""
            return f"{node.name!r} at {Path(match.group(1)).name}:{match.group(2)} ({code!r})"
    return repr(node.name)


def _order_error(name: str, expected: list[str], called: list[str]) -> str:
    missing = [p for p in expected if p not in called]
    twice = sorted({p for p in called if called.count(p) > 1})
    if missing:
        problem = f"never calls block {missing[0]!r}"
    elif twice:
        problem = f"calls block {twice[0]!r} more than once"
    else:
        problem = f"calls its blocks in the order {called}, not {expected}"
    return (f"{name} cannot be split into pipeline stages: its forward {problem}. Stages are "
            "cut between the blocks (the list transform() found, or blocks=...) and each runs "
            "its blocks once, in order. Pass the blocks the forward runs in order, e.g. "
            "transform(model, blocks=list(model.layers)), or use pipeline_parallel_degree=1.")


__all__ = ["GraphPlan", "GraphStage", "StageSpec", "local_value", "plan_graph", "stage_specs"]
