"""The dense network's optimiser, as the workers' replicas, a model-parallel group's members and
both references make it: Adam, stepped as ``torch.optim.Adam(params, lr=lr)`` steps (betas 0.9
and 0.999, eps 1e-8, no weight decay) through its functional form (``torch.optim.adam.adam``).

Not ``torch.optim.Adam`` itself: its constructor loads ``torch._dynamo`` to mark itself as not
to be compiled, 1.3 s of CPU at every worker's start on the 2-core development host (a third
of a worker's start-up). The functional form loads nothing more, and steps the parameters
with the same arithmetic: PyTorch's fused kernel where this build has one for the parameters'
device (CUDA; the CPU from torch 2.4), a third of the single-tensor loop's time on the CPU
(0.12 against 0.32 ms a step for an MLP 429-256-128-1, 0.06 against 0.18 for Adult's
64-128-64-1, one thread), else that loop.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam

BETAS = (0.9, 0.999)
EPS = 1e-8


def fused_kernel(device: torch.device) -> bool:
    """This build has Adam's fused kernel for ``device`` (as ``torch.optim.Adam`` asks)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:   # an older torch: CUDA only
        return device.type == "cuda"
    return device.type in _get_fused_kernels_supported_devices()


class DenseAdam:
    """Adam's state for ``params`` (first and second moments, and each parameter's step
    count, made at its first step as ``torch.optim.Adam`` makes them); ``step`` moves every
    parameter that has a gradient and leaves the others, their state and count, as they are."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float):
        if not params:
            raise ValueError("the dense optimiser got no parameters")
        self.params = list(params)
        self.lr = lr
        self.fused = all(p.is_floating_point() and fused_kernel(p.device) for p in self.params)
        self.state: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _state(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        got = self.state.get(i)
        if got is None:
            p = self.params[i]
            # the step count: on the parameter's device for the fused kernel, else the CPU
            step = torch.zeros((), dtype=torch.float32,
                               device=p.device if self.fused else torch.device("cpu"))
            got = (torch.zeros_like(p, memory_format=torch.preserve_format),
                   torch.zeros_like(p, memory_format=torch.preserve_format), step)
            self.state[i] = got
        return got

    def zero_grad(self) -> None:
        """Every parameter's gradient dropped (``set_to_none``, as torch's optimisers do)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        params: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        states = []
        for i, p in enumerate(self.params):
            if p.grad is not None:
                params.append(p)
                grads.append(p.grad)
                states.append(self._state(i))
        if not params:
            return
        adam(params, grads, [s[0] for s in states], [s[1] for s in states], [],
             [s[2] for s in states], fused=True if self.fused else None, amsgrad=False,
             beta1=BETAS[0], beta2=BETAS[1], lr=self.lr, weight_decay=0.0, eps=EPS,
             maximize=False)


def dense_adam(params: list[torch.nn.Parameter], lr: float) -> DenseAdam:
    return DenseAdam(params, lr)
