"""The dense synchronisation modes (``[train] sync``): one strategy per mode on each side that
behaves differently, pure (no sockets: a role sends what its strategy returns).

- ``step``: worker ``StepSync`` (every step's gradient to the aggregator, no local optimiser),
  feeder ``FreeFeeding``, aggregator ``StepApplying`` (its Adam takes each step gradient).
- ``every``: worker ``EverySync`` (RoundReady after ``sync_every`` local steps), feeder
  ``FreeFeeding``, aggregator ``RoundsOnly``.
- ``round``: worker ``RoundSync`` (trains round r + 1 once it contributed to r), feeder
  ``RoundFeeding`` (releases a round's batches, reports the round drained), aggregator
  ``RoundsOnly``.
- ``lazy``: worker ``LazySync`` (a RoundReady per local round, waits at ``max_local_rounds``),
  feeder ``FreeFeeding``, aggregator ``RoundsOnly``.

The worker's strategies are in ``.worker``, the feeder's in ``.feeder``, the aggregator's in
``.aggregator``; each module's ``for_mode`` is its table of modes, so a new mode is a class (or
an existing one) and a line there, per side. What every mode shares (contributing on
Aggregate, the replica's round arithmetic in ``roles.algorithms.worker.replica``, the aggregator's
rounds) stays with the role. Control's side (when it calls rounds) is ``roles.control``.
"""
