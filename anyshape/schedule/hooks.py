"""The plan's verify and dump hooks, as the pass pipeline has for the IR.

Sits at the end of planning, called by a backend once its plan is complete
(routes included): with the ``verify`` option the plan verifier runs, and with
``dump_dir`` the plan is written as ``<graph>.plan`` beside the passes'
``<graph>.<k>.<pass>.ir`` files.
"""

from __future__ import annotations

import os

from ..config import Options
from .plan import Schedule
from .printer import print_plan
from .verifier import verify_plan


def after_planning(sched: Schedule, options: Options) -> Schedule:
    if options.verify:
        verify_plan(sched)
    if options.dump_dir:
        os.makedirs(options.dump_dir, exist_ok=True)
        with open(os.path.join(options.dump_dir, f"{sched.graph.name}.plan"), "w") as f:
            f.write(print_plan(sched))
    return sched
