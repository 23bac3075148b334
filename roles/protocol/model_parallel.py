"""Model parallelism: control's plan of the network over a group, and the tensors and calls
between the members of one group (DEALER -> ROUTER, channel "model_parallel")."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from zbus.codec import Message, array, message, require


@message()
class ModelPlan(Message):
    """How the network is split over the members of every model-parallel group (standing;
    control PUB): ``owner`` maps each traced node's name to its member (0 = the leader);
    ``summary`` is the plan's figures (``roles.model.graph.PartitionReport``)."""

    parts: int
    owner: dict[str, int]
    summary: dict[str, Any]

    def check(self) -> None:
        require(self.parts >= 2, "a plan has at least 2 parts")
        require(all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                    and 0 <= v < self.parts for k, v in self.owner.items()),
                "owner must map node names to parts 0..parts-1")


@message("model_parallel")
class MemberTensors(Message):
    """The tensors on cut edges of step ``step``: values (``phase`` forward) or their gradients
    (backward), float32, concatenated in ``values``; ``names[i]`` (a traced node's name) has
    shape ``shapes[i]``. A name may repeat in backward: one gradient per consuming stage."""

    PHASES: ClassVar[tuple[str, ...]] = ("forward", "backward")
    step: int
    phase: str
    train: bool
    names: list[str]
    shapes: list[list[int]]
    values: np.ndarray = array("float32", 1)

    def check(self) -> None:
        require(self.phase in self.PHASES, f"phase must be one of {self.PHASES}")
        require(len(self.names) == len(self.shapes), "names and shapes differ in length")
        total = 0
        for shape in self.shapes:
            require(len(shape) <= 8 and all(isinstance(d, int) and not isinstance(d, bool)
                                            and d >= 0 for d in shape), "bad shape")
            total += math.prod(shape)
        require(total == self.values.size, f"shapes hold {total} values, frame has "
                                           f"{self.values.size}")

    def tensors(self) -> list[tuple[str, np.ndarray]]:
        out, at = [], 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            size = math.prod(shape)
            out.append((name, self.values[at:at + size].reshape(shape)))
            at += size
        return out


@message("model_parallel")
class MemberCall(Message):
    """Leader -> member: ``load`` its slice of the dense weights (``values``), or send them
    back (``flat``); ``ping`` asks whether it is there with the plan. Answered by MemberReply."""

    CALLS: ClassVar[tuple[str, ...]] = ("load", "flat", "ping")
    call: str
    seq: int
    values: np.ndarray = array("float32", 1)

    def check(self) -> None:
        require(self.call in self.CALLS, f"call must be one of {self.CALLS}")


@message("model_parallel")
class MemberReply(Message):
    """Member -> leader: the answer to MemberCall ``seq``, or (``call`` = "step") that the
    member finished step ``seq``: its backward is done and its optimiser has stepped."""

    call: str
    seq: int
    values: np.ndarray = array("float32", 1)
