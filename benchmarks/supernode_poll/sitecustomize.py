"""benchmarks/flower_runtimes.py --deployments warm-fastpoll only, never a deployment setting:
on PYTHONPATH of that deployment's processes (SuperLink, ServerApp, SuperNodes, ClientApps,
`flwr`), Python imports this file at start-up. It shortens Flower 1.42's fixed waits, for which
Flower has no option, to 0.05 s, to measure what a deployed round would cost without them:

- in `flower-supernode`: 3 s between two pulls from the SuperLink when there was no message,
  0.5 s between two looks for the ClientApp's reply (`flwr.supernode.start_client_internal`);
- everywhere: the first retry when a message's content is asked for before it is uploaded
  (`pull_objects`: 1 s, then doubling; a sender pushes a message's header before its content,
  so a quick receiver often asks too early).
"""

import os
import sys
import time

import flwr.supercore.inflatable.inflatable_utils as inflatable

for _function in (inflatable.pull_objects, inflatable.pull_and_inflate_object_from_tree):
    _function.__kwdefaults__ = {**(_function.__kwdefaults__ or {}), "initial_backoff": 0.05}

if [os.path.basename(a) for a in sys.orig_argv[1:2]] == ["flower-supernode"]:
    import flwr.supernode.start_client_internal as supernode

    class _ShortSleeps:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            time.sleep(min(seconds, 0.05))

    supernode.time = _ShortSleeps()  # only that module's `time.sleep(3)` and `time.sleep(0.5)`
