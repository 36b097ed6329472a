"""The launcher's half of how a notebook cell's variables travel to its ranks and back
(node_side/cell_runner.py is the node's half, and documents the files):

- `pack` pickles the named notebook variables into the text the job ships as `push.b64`;
- `unpack` reads back what each rank saved under `out/` (`<rank>.pkl`: {"values": {...},
  "missing": [...]}) once the job ended.

cloudpickle, so that functions and classes defined in the notebook travel too.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from jupyter_dist.errors import DistrunError
from jupyter_dist.run.job import Job


def pack(namespace: Mapping[str, Any], names: list[str]) -> str | None:
    """The `names` of `namespace`, pickled for the ranks (base64 text), or None for none.
    DistrunError names a variable that is missing or cannot be pickled."""
    if not names:
        return None
    import cloudpickle

    values = {}
    for name in names:
        if name not in namespace:
            raise DistrunError(f"--push: {name!r} is not defined in the notebook")
        try:
            cloudpickle.dumps(namespace[name])
        except Exception as exc:
            kind = type(namespace[name]).__name__
            raise DistrunError(
                f"--push: {name!r} ({kind}) cannot be sent to the ranks: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        values[name] = namespace[name]
    return base64.b64encode(cloudpickle.dumps(values)).decode()


def unpack(job: Job, names: list[str], every_rank: bool, folder: str = "out") -> dict[str, Any]:
    """Each of `names` as the ranks left it: rank 0's value, or with `every_rank` a list of
    every rank's. DistrunError when no rank saved anything or a name was missing on some."""
    import cloudpickle

    reports = [cloudpickle.loads(data) for _, data in sorted(job.collect(folder).items())]
    if not reports:
        raise DistrunError("--out: no rank saved its values (did the cell run to the end?)")
    found = {}
    for name in names:
        lacking = [i for i, r in enumerate(reports) if name in r["missing"]]
        if lacking:
            raise DistrunError(
                f"--out: {name!r} is not defined after the cell on {len(lacking)} of "
                f"{len(reports)} processes"
            )
        values = [r["values"][name] for r in reports]
        found[name] = values if every_rank else values[0]
    return found
