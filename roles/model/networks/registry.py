"""The built-in networks by name (``[model] network``), the type every factory has, and the
defaults a built-in takes from the job's layout (what the contract's factory does not see: the
tables), under the options the job gives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from roles.job.fields import FieldLayout
from roles.model.networks import (
    dcn,
    deepfm,
    din,
    dlrm,
    esmm,
    mlp,
    mmoe,
    ple,
    shared_bottom,
    wide_deep,
)

# factory(sparse_dims, sequence_fields, dense_count, options) -> the network
Factory = Callable[[dict[str, int], list[str], int, dict[str, Any]], nn.Module]

BUILTINS: dict[str, Factory] = {
    "mlp": mlp.build,
    "dlrm": dlrm.build,
    "dcn": dcn.build,
    "deepfm": deepfm.build,
    "wide_deep": wide_deep.build,
    "din": din.build,
    "shared_bottom": shared_bottom.build,
    "mmoe": mmoe.build,
    "ple": ple.build,
    "esmm": esmm.build,
}

LayoutDefaults = Callable[[FieldLayout, dict[str, Any]], dict[str, Any]]
LAYOUT_DEFAULTS: dict[str, LayoutDefaults] = {"din": din.layout_defaults,
                                              "wide_deep": wide_deep.layout_defaults,
                                              "deepfm": wide_deep.layout_defaults}

SEVERAL_LABELS = ("shared_bottom", "mmoe", "ple", "esmm")   # they refuse a job of one label
