"""The networks a worker can train: the contract every network meets, the built-ins
(``mlp``, ``dlrm``, ``dcn``, ``deepfm``, ``wide_deep``, ``din``, and for several labels
``shared_bottom``, ``mmoe``, ``ple``, ``esmm``; one module each) and a user's own module
(``[model] module``). docs/models.md says the same for users.

The contract (pure torch; no sockets, no job):

- ``factory(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
  options: dict) -> torch.nn.Module``. ``sparse_dims`` is every sparse field's width as the
  network receives it, in the job's field order; ``sequence_fields`` the list fields with
  ``[model.pooling] <field> = "none"``; ``dense_count`` the number of dense features;
  ``options`` is ``{"hidden": [model] hidden, **[model.options]}``, and ``"tasks"``, the
  labels in order, for a job of several (``[data] labels``). A built-in refuses an
  option it does not know (a ValueError naming it and the known ones).
- ``forward(sparse: dict[str, Tensor], dense: Tensor, lengths: dict[str, Tensor]) -> Tensor``:
  ``sparse[f]`` is ``[B, dim_f]`` for a single-valued or pooled list field and
  ``[B, max_len, dim_f]`` (zero padded) for a sequence field; ``lengths[f]`` is ``[B]`` int64
  for each sequence field (absent for the others); ``dense`` is ``[B, dense_count]``; it
  returns logits ``[B]``, or ``[B, T]`` for T labels (column t the t-th). Where every field
  is single-valued at one width, ``sparse`` is a ``layers.JoinedFields``: ``sparse.joined``
  is the fields' vectors side by side (the worker's grid as it is), each ``sparse[f]`` a view
  of it, which a network may read instead of concatenating the fields (``layers.joined_of``;
  ``mlp`` does).

Every process builds the network from the same seed, on the CPU, and runs it once on a small
sample batch (``checking``); what fails is one ``NetworkError`` line. For torch.fx (model
parallelism) ``flat.FlatInputs`` gives a network positional tensor inputs.
"""

from roles.model.networks.checking import check_network, sample_batch
from roles.model.networks.errors import NetworkError
from roles.model.networks.flat import FlatInputs, example_inputs, input_names
from roles.model.networks.loading import call_factory, device_error, load_factory, network_label
from roles.model.networks.registry import BUILTINS, Factory

__all__ = ["BUILTINS", "Factory", "FlatInputs", "NetworkError", "call_factory",
           "check_network", "device_error", "example_inputs", "input_names", "load_factory",
           "network_label", "sample_batch"]
