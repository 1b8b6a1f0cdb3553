"""Collectives between the tensor-parallel ranks of one engine (parallel_config.py says what a rank is).

`tp_group()` is this process's group, set once when an engine process starts (`set_tp_group`) and never
changed after: the layers read it while building a model and in every forward. A process that runs no
tensor parallelism keeps `SingleRank`, whose collectives are the identity, so a model built without TP
runs exactly the code it ran before.
"""

from fdcli_engine.distributed.common import CollectiveError
from fdcli_engine.distributed.group import ProcessGroup, SingleRank, set_tp_group, tp_group
from fdcli_engine.distributed.init import init_tp_group

__all__ = ["CollectiveError", "ProcessGroup", "SingleRank", "init_tp_group", "set_tp_group", "tp_group"]
