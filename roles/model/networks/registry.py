"""The built-in networks by name (``[model] network``), and the type every factory has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from roles.model.networks import dcn, deepfm, din, dlrm, mlp, wide_deep

# factory(sparse_dims, sequence_fields, dense_count, options) -> the network
Factory = Callable[[dict[str, int], list[str], int, dict[str, Any]], nn.Module]

BUILTINS: dict[str, Factory] = {
    "mlp": mlp.build,
    "dlrm": dlrm.build,
    "dcn": dcn.build,
    "deepfm": deepfm.build,
    "wide_deep": wide_deep.build,
    "din": din.build,
}
