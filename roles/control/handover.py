"""Control's records handed over to the control that comes next, when its pod is stopped.

A SIGTERM to control in a pod (``zbus.signals``: an eviction, a node drain, a rolling update,
``kubectl delete pod``) is control's restart, not the job's end: control writes its records
(``control-state.json``, ``control-history.json``) into its run directory, and with
``[checkpoint] dir`` set also under ``control/`` there, since a pod made again elsewhere has an
empty run directory; then it exits without telling the nodes anything. They go on as far as
they can without control, as when control dies, and join the next control (Rejoin).

The next control (``zbus-pod`` starts it with ``--resume``) takes its run directory's records,
else the handed-over ones, as a control resumed after its death does: nothing is rolled back.
It copies them into its run directory and removes them from the store at once, so that a later
control, whose predecessor was killed rather than stopped, never goes on from records older
than what the nodes hold: it takes them from the newest complete checkpoint instead, and the
whole job goes back to it (``roles.control.resuming``).
"""

from __future__ import annotations

import orjson

from roles.checkpoint.files import HANDOVER
from roles.control.state import HISTORY_FILE, STATE_FILE, ControlHistory, ControlState
from roles.storage.store import Store

STATE = f"{HANDOVER}/{STATE_FILE}"
HISTORY = f"{HANDOVER}/{HISTORY_FILE}"


def hand_over(store: Store, state: ControlState, history: ControlHistory) -> None:
    """The records into the store: the history first, the state (which says they are there)
    last."""
    store.put_bytes(HISTORY, orjson.dumps(history, option=orjson.OPT_SERIALIZE_NUMPY))
    store.put_bytes(STATE, orjson.dumps(state))


def handed_over(store: Store) -> str | None:
    """Where the handed-over records are (to read as a run directory's), or None."""
    return store.location(HANDOVER) if store.size(STATE) is not None else None


def remove_handover(store: Store) -> None:
    """The state first: records without it are never read."""
    store.remove(STATE)
    store.remove(HISTORY)
