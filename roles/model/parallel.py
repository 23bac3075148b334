"""Running one network split over the members of a model-parallel group.

The traced graph (``roles.model.graph``) is cut into *stages*: maximal runs of consecutive
nodes (in the graph's topological order) owned by one member. A stage runs as soon as its
inputs are in; the values it makes that a later stage on another member needs go there as one
``MemberTensors`` per member (forward). Every stage starts from detached copies of its inputs
(leaves), so each member's autograd graph ends at its stage boundaries: backward runs a stage
once the gradients of all its outputs are in (from every consuming stage, local or not), and
sends the gradients of its input leaves to the members that made them. The leader (member 0)
holds the inputs and the output, computes the loss and starts backward. The result equals the
unpartitioned network's forward and backward (tests/roles/model/test_model_parallel.py checks
to 1e-5).

``Program`` is one member's share of the network and the state of its step in progress (torch,
no sockets); ``member_program`` makes it from control's plan. What the members and the leader
do with the group's messages is ``roles.model.group``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import fx

from roles.job.settings import Job
from roles.model.graph import differentiable, network_parameters, trace_job
from roles.protocol.model_parallel import MemberTensors, ModelPlan
from zbus.codec import ProtocolError


@dataclass
class Stage:
    index: int
    member: int
    nodes: list[fx.Node]
    inputs: list[str] = field(default_factory=list)     # values made by earlier stages
    outputs: list[str] = field(default_factory=list)    # values later stages (or loss) use


class Program:
    """One member's stages of the traced network, and the state of the step in progress."""

    def __init__(self, gm: fx.GraphModule, owner: dict[str, int], member: int,
                 device: torch.device):
        self.nodes_by_name = {n.name: n for n in gm.graph.nodes}
        names = list(self.nodes_by_name)
        missing = sorted(set(names) ^ set(owner))
        if missing:
            raise ValueError(f"the plan does not match this network (nodes {missing[:5]})")
        self.gm, self.owner, self.member, self.device = gm, owner, member, device
        self.stages: list[Stage] = []
        for node in gm.graph.nodes:
            m = owner[node.name]
            if not self.stages or self.stages[-1].member != m:
                self.stages.append(Stage(len(self.stages), m, []))
            self.stages[-1].nodes.append(node)
        stage_of = {n.name: s.index for s in self.stages for n in s.nodes}
        self.maker = {name: self.stages[i].member for name, i in stage_of.items()}
        self.expected: dict[str, int] = defaultdict(int)  # gradients a value gets per step
        self.differentiable = {n.name: differentiable(n) for n in gm.graph.nodes}
        self.output = next(n.name for n in gm.graph.nodes if n.op == "output")
        self.differentiable[self.output] = True
        for stage in self.stages:
            for node in stage.nodes:
                for source in node.all_input_nodes:
                    s = stage_of[source.name]
                    if s != stage.index and source.name not in stage.inputs:
                        stage.inputs.append(source.name)
                        if source.name not in self.stages[s].outputs:
                            self.stages[s].outputs.append(source.name)
                        if self.differentiable[source.name]:
                            self.expected[source.name] += 1
        self.stages[stage_of[self.output]].outputs.append(self.output)
        self.expected[self.output] = 1
        for stage in self.stages:
            for name in stage.inputs:
                if self.maker[name] != stage.member and not self.differentiable[name]:
                    raise ValueError(f"the plan cuts {name}, which is not a float tensor")
        self.mine = [s for s in self.stages if s.member == member]
        self.params = self.owned_parameters()
        for p in self.params.values():
            p.data = p.data.to(device)
        self.step = -1
        self.train = False
        self.begin(-1, False, {})

    def owned_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The parameters this member holds (``flat_layout``), by qualified name, in the
        network's order."""
        return {n: p for n, p, m in flat_layout(self.gm, self.owner) if m == self.member}

    @property
    def members_with_stages(self) -> set[int]:
        return {s.member for s in self.stages}

    # -- one step ------------------------------------------------------------------------------
    def begin(self, step: int, train: bool, inputs: dict[str, torch.Tensor]) -> None:
        self.step, self.train, self.inputs = step, train, inputs
        self.values: dict[str, torch.Tensor] = {}   # made here (graph-attached) or received
        self.leaves: dict[tuple[int, str], torch.Tensor] = {}
        self.grads: dict[str, torch.Tensor] = {}
        self.grad_count: dict[str, int] = defaultdict(int)
        self.forward_done: set[int] = set()
        self.backward_done: set[int] = set()
        if train:
            for p in self.params.values():
                p.grad = None

    def receive(self, msg: MemberTensors) -> None:
        """Values this member needs (forward) or gradients of values it made (backward), each
        checked against the traced shapes (any batch size) before any is taken."""
        items = msg.tensors()
        for name, array in items:
            self.check_tensor(name, array.shape, msg.phase)
        for name, array in items:
            tensor = torch.from_numpy(np.array(array)).to(self.device)
            if msg.phase == "forward":
                self.values[name] = tensor
            else:
                self.add_grad(name, tensor)

    def check_tensor(self, name: str, shape: tuple[int, ...], phase: str) -> None:
        if name not in self.maker:
            raise ProtocolError("bad_field", f"no value {name!r} in this network")
        if phase == "forward":
            wanted = any(name in s.inputs for s in self.mine) and self.maker[name] != self.member
        else:
            wanted = self.maker[name] == self.member and self.differentiable[name]
        if not wanted:
            raise ProtocolError("bad_field", f"{phase} {name!r} is not for member {self.member}")
        meta = self.node(name).meta.get("tensor_meta")
        traced = tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None
        made = self.values.get(name) if phase == "backward" else None
        if made is not None and tuple(made.shape) != tuple(shape):
            raise ProtocolError("bad_shape", f"gradient of {name!r} of shape {shape}, the "
                                             f"value is {tuple(made.shape)}")
        if traced is not None and (len(shape) != len(traced) or shape[1:] != traced[1:]):
            raise ProtocolError("bad_shape", f"{name!r} of shape {shape}, traced {traced}")

    def add_grad(self, name: str, grad: torch.Tensor) -> None:
        self.grads[name] = grad if name not in self.grads else self.grads[name] + grad
        self.grad_count[name] += 1

    def run_forward(self) -> dict[int, list[tuple[str, torch.Tensor]]]:
        """Run every stage whose inputs are in; the values to send, per member."""
        out: dict[int, list[tuple[str, torch.Tensor]]] = defaultdict(list)
        progress = True
        while progress:
            progress = False
            for stage in self.mine:
                if stage.index in self.forward_done or \
                        not all(v in self.values for v in stage.inputs):
                    continue
                with torch.set_grad_enabled(self.train):
                    self.run_stage(stage)
                self.forward_done.add(stage.index)
                progress = True
                for name in stage.outputs:
                    users = {self.owner[u.name] for u in self.node(name).users}
                    for member in sorted(users - {self.member}):
                        out[member].append((name, self.values[name].detach()))
        return out

    def run_stage(self, stage: Stage) -> None:
        env: dict[str, Any] = {}   # a traced node's name -> its value (tensors, mostly)
        for name in stage.inputs:
            value = self.values[name]
            if self.train and self.differentiable[name]:
                value = value.detach().requires_grad_(True)
                self.leaves[(stage.index, name)] = value
            env[name] = value
        for node in stage.nodes:
            args = fx.node.map_arg(node.args, lambda n: env[n.name])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n.name])
            if node.op == "placeholder":
                env[node.name] = self.inputs[str(node.target)]
            elif node.op == "get_attr":
                env[node.name] = self.gm.get_parameter(str(node.target)) \
                    if str(node.target) in self.params else getattr(self.gm, str(node.target))
            elif node.op == "call_module":
                env[node.name] = self.gm.get_submodule(str(node.target))(*args, **kwargs)
            elif node.op == "call_function":
                function = node.target
                assert callable(function)  # fx: a call_function node's target is the function
                env[node.name] = function(*args, **kwargs)
            elif node.op == "call_method":
                env[node.name] = getattr(args[0], str(node.target))(*args[1:], **kwargs)
            else:  # output
                env[node.name] = args[0]
        for name in stage.outputs:
            self.values[name] = env[name]

    def result(self) -> torch.Tensor | None:
        """The network's output (the leader's, once forward reached it)."""
        return self.values.get(self.output) if self.owner[self.output] == self.member else None

    def run_backward(self) -> dict[int, list[tuple[str, torch.Tensor]]]:
        """Run backward of every stage whose output gradients are all in, last stage first;
        the gradients to send, per member."""
        out: dict[int, list[tuple[str, torch.Tensor]]] = defaultdict(list)
        progress = True
        while progress:
            progress = False
            for stage in reversed(self.mine):
                if stage.index in self.backward_done or stage.index not in self.forward_done:
                    continue
                if any(self.grad_count[v] < self.expected[v] for v in stage.outputs
                       if self.differentiable[v]):
                    continue
                roots = [(self.values[v], self.grads[v]) for v in stage.outputs
                         if v in self.grads and self.values[v].requires_grad]
                if roots:
                    torch.autograd.backward([r for r, _ in roots], [g for _, g in roots])
                self.backward_done.add(stage.index)
                progress = True
                for name in stage.inputs:
                    leaf = self.leaves.get((stage.index, name))
                    if leaf is None:
                        continue
                    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                    if self.maker[name] == self.member:
                        self.add_grad(name, grad)
                    else:
                        out[self.maker[name]].append((name, grad))
        return out

    def finish(self) -> None:
        """The step is done here: drop its tensors and graphs (a late repeat does nothing)."""
        self.begin(self.step, False, {})
        self.forward_done = {s.index for s in self.mine}
        self.backward_done = set(self.forward_done)

    def backward_complete(self) -> bool:
        return all(s.index in self.backward_done for s in self.mine)

    def forward_complete(self) -> bool:
        return all(s.index in self.forward_done for s in self.mine)

    def node(self, name: str) -> fx.Node:
        return self.nodes_by_name[name]

    # -- weights -------------------------------------------------------------------------------
    def flat(self) -> np.ndarray:
        with torch.no_grad():
            if not self.params:
                return np.zeros(0, dtype=np.float32)
            return torch.cat([p.detach().reshape(-1) for p in self.params.values()]).cpu() \
                .numpy()

    def load(self, flat: np.ndarray) -> None:
        size = sum(p.numel() for p in self.params.values())
        if flat.shape != (size,):
            raise ProtocolError("bad_shape", f"{flat.shape[0]} weights for a part of {size}")
        source = torch.from_numpy(np.array(flat, dtype=np.float32)).to(self.device)
        at = 0
        with torch.no_grad():
            for p in self.params.values():
                p.copy_(source[at:at + p.numel()].view_as(p))
                at += p.numel()


def flat_layout(gm: fx.GraphModule, owner: dict[str, int]
                ) -> list[tuple[str, torch.nn.Parameter, int]]:
    """Every parameter of the network, in the network's own ``named_parameters()`` order (the
    order of the flat weights the aggregator and every data-parallel replica use, which a
    GraphModule's first-use order need not be), with the member that holds it: that of the
    first node that uses it, the leader for one that no node uses. Named as in ``gm`` (the
    network's name, ``net.<name>``, unless the graph reaches a shared parameter by another)."""
    owners = parameter_owners(gm, owner)
    traced = {id(p): n for n, p in gm.named_parameters()}
    layout = []
    for name, p in network_parameters(gm):
        there = traced.get(id(p))
        layout.append((there or name, p, owners.get(there, 0) if there else 0))
    return layout


def parameter_owners(gm: fx.GraphModule, owner: dict[str, int]) -> dict[str, int]:
    """The member of each parameter a node uses: that of the first node (in graph order) that
    uses it. A parameter no node uses is absent."""
    owners: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            prefix = str(node.target)
            used = [f"{prefix}.{n}" if prefix else n
                    for n, _ in gm.get_submodule(prefix).named_parameters()]
        elif node.op == "get_attr":
            used = [str(node.target)]
        else:
            continue
        for name in used:
            owners.setdefault(name, owner[node.name])
    return owners


def tensors_message(step: int, phase: str, train: bool,
                    items: list[tuple[str, torch.Tensor]]) -> MemberTensors:
    arrays = [t.detach().to(torch.float32).cpu().numpy() for _, t in items]
    return MemberTensors(step=step, phase=phase, train=train, names=[n for n, _ in items],
                         shapes=[list(a.shape) for a in arrays],
                         values=np.concatenate([a.reshape(-1) for a in arrays])
                         if arrays else np.zeros(0, dtype=np.float32))


def member_program(job: Job, plan: ModelPlan, member: int, device: torch.device
                   ) -> tuple[fx.GraphModule, Program]:
    """Member ``member``'s share of the job's network under control's plan: the network
    traced here (the same seeded weights everywhere), then cut by the plan."""
    if plan.parts != job.cluster.parts:
        raise ProtocolError("bad_field", f"a plan of {plan.parts} parts for a job of "
                                         f"{job.cluster.parts}")
    gm = trace_job(job, 2)
    return gm, Program(gm, plan.owner, member, device)
