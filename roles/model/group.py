"""A model-parallel group's messages, each side's handling of them (torch; no sockets).

``MemberServer`` is a member's: the stages it owns run as their inputs arrive, its Adam steps
once its backward of a step is done, and it answers the leader's weight calls. ``GroupLeader``
is the leader's (member 0): it starts each step (forward from the inputs, backward from the
gradient of the output) and the weight calls, and takes in what the members send back. Neither
waits for anything: every call returns the messages to send, as (member, message), and the
leader says when what it started is done (``output``, ``backward_done``, ``gathered``,
``scattered``); the worker sends those messages and hands it every message of the group's
inbox as its loop reads them (``roles.worker.group_link``), so that no process blocks on
another (a whole cluster can be driven turn by turn in one process).

``GroupWeights`` is the leader's replica's weights (``roles.algorithms.worker.replica``): the
whole network's flat weights, in its own parameter order, spread over the members. The leader
gathers the members' slices (``gather``) before the replica reads them, and sends each member
what the replica loaded (``scatter``) after.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
from torch import fx

from roles.algorithms.shared.dense_optimizer import dense_adam
from roles.model.parallel import Program, flat_layout, tensors_message
from roles.protocol.model_parallel import MemberCall, MemberReply, MemberTensors
from zbus.codec import Message, ProtocolError

Sends = list[tuple[int, Message]]   # messages to send, each to a member of the group


class MemberServer:
    """A member's handling of group messages: each call returns the messages to send."""

    def __init__(self, program: Program, lr: float):
        self.program = program
        self.optimizer = dense_adam(list(program.params.values()), lr) \
            if program.params else None
        self.steps = 0

    def handle(self, msg: Message) -> Sends:
        p = self.program
        match msg:
            case MemberTensors() as t:
                if t.step != p.step:
                    p.begin(t.step, t.train, {})
                p.receive(t)
                out = self.sends(p.run_forward(), "forward")
                if p.train:
                    out += self.sends(p.run_backward(), "backward")
                    if p.backward_complete() and p.forward_complete():
                        if self.optimizer is not None:
                            self.optimizer.step()
                        self.steps += 1
                        out.append((0, MemberReply(call="step", seq=p.step,
                                                   values=np.zeros(0, dtype=np.float32))))
                        p.finish()
                return out
            case MemberCall(call="load", seq=seq, values=values):
                p.load(values)
                return [(0, MemberReply(call="load", seq=seq, values=np.zeros(0, np.float32)))]
            case MemberCall(call=call, seq=seq):
                values = p.flat() if call == "flat" else np.zeros(0, dtype=np.float32)
                return [(0, MemberReply(call=call, seq=seq, values=values))]
        raise ProtocolError("unexpected_type", f"{type(msg).__name__} on a group link")

    def sends(self, out: dict[int, list], phase: str) -> Sends:
        p = self.program
        return [(member, tensors_message(p.step, phase, p.train, items))
                for member, items in out.items()]


class GroupWeights:
    """The flat weights of a network spread over a group, as the leader's replica reads and
    loads them: the leader's own slice in its ``Program``, each member's as last gathered
    (``held``: read only between a gather and the scatter that follows), and what ``load``
    gave each member (``to_load``, for the scatter)."""

    def __init__(self, gm: fx.GraphModule, program: Program):
        self.program = program
        indexes: dict[int, list[int]] = defaultdict(list)
        at = 0   # each member's slice is its parameters' weights, in the network's order
        for _, p, member in flat_layout(gm, program.owner):
            indexes[member].extend(range(at, at + p.numel()))
            at += p.numel()
        self.slices = {m: np.asarray(ix, dtype=np.int64)   # member -> flat indexes
                       for m, ix in indexes.items()}
        self.members = sorted(m for m in self.slices if m != 0)   # those holding weights
        self.params = list(program.params.values())   # the leader's own (its Adam's)
        self.size = at
        self.held: dict[int, np.ndarray] | None = None
        self.to_load: dict[int, np.ndarray] = {}

    def hold(self, flats: dict[int, np.ndarray]) -> None:
        """The members' slices, as they answered a gather."""
        for member, values in flats.items():
            if values.shape != self.slices[member].shape:
                raise ProtocolError("bad_shape", f"member {member} sent {values.shape[0]} "
                                                 f"weights for a slice of "
                                                 f"{len(self.slices[member])}")
        self.held = dict(flats)

    def flat(self) -> np.ndarray:
        if self.held is None and self.members:
            raise RuntimeError("the members' weights are read before they were gathered")
        held = self.held or {}
        out = np.zeros(self.size, dtype=np.float32)
        for member, index in self.slices.items():
            out[index] = self.program.flat() if member == 0 else held[member]
        return out

    def load(self, flat: np.ndarray) -> None:
        for member, index in self.slices.items():
            values = np.asarray(flat[index], dtype=np.float32)
            if member == 0:
                self.program.load(values)
                continue
            self.to_load[member] = values
            if self.held is not None:
                self.held[member] = values

    def released(self) -> dict[int, np.ndarray]:
        """What the members are to load now; the slices held are forgotten (the members
        train on)."""
        loads, self.to_load, self.held = self.to_load, {}, None
        return loads


class GroupLeader:
    """Member 0: starts each step and the weight calls, and takes in the members' messages
    (``take``), running whatever they make possible; each returns the messages to send."""

    def __init__(self, gm: fx.GraphModule, program: Program):
        self.program = program
        self.weights = GroupWeights(gm, program)
        self.step = 0
        self.seq = 0
        self.phase = ""   # "forward" or "backward": what a message taken may run
        self.replies: dict[tuple[str, int], list[MemberReply]] = defaultdict(list)
        self.working = sorted(program.members_with_stages - {0})
        self.calls: dict[int, tuple[str, int]] = {}   # member -> the call it is to answer

    def take(self, msg: Message) -> Sends:
        """A message that reached the leader's inbox."""
        match msg:
            case MemberTensors() as t if t.step == self.program.step:
                self.program.receive(t)
            case MemberTensors():
                pass  # of a step given up on
            case MemberReply(call=call, seq=seq) as r:
                self.replies[(call, seq)].append(r)
            case _:
                raise ProtocolError("unexpected_type", f"{type(msg).__name__} on a group link")
        return self.run()

    def run(self) -> Sends:
        """Run what the step's phase can run now; the tensors to send on."""
        p = self.program
        if self.phase == "forward":
            out = p.run_forward()
        elif self.phase == "backward":
            out = p.run_backward()
        else:
            return []
        return [(member, tensors_message(p.step, self.phase, p.train, items))
                for member, items in out.items()]

    # -- a step ----------------------------------------------------------------------------------
    def forward(self, inputs: dict[str, torch.Tensor], train: bool) -> Sends:
        """Start the next step: forward from the network's inputs (by placeholder name)."""
        self.replies.pop(("step", self.step), None)   # the previous step's, done with
        self.step += 1
        self.program.begin(self.step, train, inputs)
        self.phase = "forward"
        return self.run()

    def output(self) -> torch.Tensor | None:
        """The network's output, once forward reached it."""
        return self.program.result()

    def backward(self, output_grad: torch.Tensor) -> Sends:
        """Start the step's backward from the gradient of the output."""
        self.program.add_grad(self.program.output, output_grad)
        self.phase = "backward"
        return self.run()

    def backward_done(self) -> bool:
        """The step's backward is done here and every member with stages has stepped."""
        return self.program.backward_complete() \
            and len(self.replies.get(("step", self.step), ())) >= len(self.working)

    # -- weights ---------------------------------------------------------------------------------
    def call(self, call: str, values: dict[int, np.ndarray]) -> Sends:
        """Ask each member of ``values`` the call, with its values."""
        out: Sends = []
        for member, v in values.items():
            self.seq += 1
            self.calls[member] = (call, self.seq)
            out.append((member, MemberCall(call=call, seq=self.seq, values=v)))
        return out

    def answered(self) -> dict[int, MemberReply] | None:
        """Every member's answer to the calls made last, once all are in."""
        if not all(self.replies.get(key) for key in self.calls.values()):
            return None
        answers = {m: self.replies.pop(key)[0] for m, key in self.calls.items()}
        self.calls = {}
        return answers

    def gather(self) -> Sends:
        """Ask every member that holds weights for its slice."""
        return self.call("flat", {m: np.zeros(0, dtype=np.float32)
                                  for m in self.weights.members})

    def gathered(self) -> bool:
        """The members' slices are in: True once they are, and they are held
        (``GroupWeights.held``)."""
        answers = self.answered()
        if answers is None:
            return False
        self.weights.hold({m: r.values for m, r in answers.items()})
        return True

    def scatter(self) -> Sends:
        """Send each member what the replica loaded into its slice."""
        return self.call("load", self.weights.released())

    def scattered(self) -> bool:
        """Every member loaded its slice."""
        return self.answered() is not None
