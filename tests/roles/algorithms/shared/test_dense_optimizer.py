"""The dense optimiser steps as ``torch.optim.Adam`` steps, and loads no ``torch._dynamo``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from harness import REPO

from roles.algorithms.shared.dense_optimizer import DenseAdam


def nets() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(3)
    a = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
    b = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
    b.load_state_dict(a.state_dict())
    return a, b


def train(net: torch.nn.Module, opt, steps: int, freeze_last_at: int | None = None) -> None:
    g = torch.Generator().manual_seed(11)
    for step in range(steps):
        x, y = torch.randn(16, 7, generator=g), torch.randn(16, 1, generator=g)
        net.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(net(x), y).backward()
        if freeze_last_at is not None and step >= freeze_last_at:
            net[2].weight.grad = None   # a parameter the backward did not reach
        opt.step()


@pytest.mark.parametrize("fused", [True, False])
def test_it_steps_every_parameter_as_torch_adam_does(fused: bool) -> None:
    ours, theirs = nets()
    opt = DenseAdam(list(ours.parameters()), lr=0.01)
    if fused and not opt.fused:
        pytest.skip("this torch has no fused Adam for the CPU")
    opt.fused = fused
    train(ours, opt, 12, freeze_last_at=5)
    train(theirs, torch.optim.Adam(theirs.parameters(), lr=0.01, fused=fused or None,
                                   foreach=False if not fused else None), 12,
          freeze_last_at=5)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)
    # the frozen weight counted only the steps it took
    assert float(opt.state[2][2]) == 5.0 and float(opt.state[0][2]) == 12.0


def test_a_parameter_without_a_gradient_is_left_alone_and_gets_no_state() -> None:
    net, _ = nets()
    before = [p.detach().clone() for p in net.parameters()]
    opt = DenseAdam(list(net.parameters()), lr=0.01)
    opt.step()   # no backward yet
    assert opt.state == {}
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before, strict=True))


def test_no_parameters_is_an_error() -> None:
    with pytest.raises(ValueError, match="no parameters"):
        DenseAdam([], lr=0.01)


@pytest.mark.integration
def test_making_and_stepping_it_loads_no_dynamo() -> None:
    """``torch.optim.Adam``'s constructor loads ``torch._dynamo``: 1.3 s of CPU at every
    worker's start. Ours must not (a fresh interpreter: this one may have loaded it)."""
    code = ("import sys, torch\n"
            "from roles.algorithms.shared.dense_optimizer import DenseAdam\n"
            "net = torch.nn.Linear(4, 2)\n"
            "opt = DenseAdam(list(net.parameters()), 0.01)\n"
            "net(torch.ones(3, 4)).sum().backward(); opt.step()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_zero_grad_drops_every_gradient() -> None:
    net, _ = nets()
    opt = DenseAdam(list(net.parameters()), lr=0.01)
    net(torch.ones(2, 7)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())
