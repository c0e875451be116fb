"""benchmarks/flower_runtimes.py --deployments warm-fastpoll only, never a deployment setting:
on PYTHONPATH of that deployment's SuperNodes, Python imports this file at start-up. In the
`flower-supernode` process it shortens the SuperNode's fixed sleeps (Flower 1.41 has no option
for them: 3 s between two pulls from the SuperLink when there was no message, 0.5 s between
two looks for the ClientApp's reply) to 0.05 s, to measure what a deployed round would cost
without them, i.e. how much of the gap to the simulator is Flower's SuperNode polling."""

import os
import sys
import time

if [os.path.basename(a) for a in sys.orig_argv[1:2]] == ["flower-supernode"]:
    import flwr.supernode.start_client_internal as supernode

    class _ShortSleeps:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            time.sleep(min(seconds, 0.05))

    supernode.time = _ShortSleeps()  # only that module's `time.sleep(3)` and `time.sleep(0.5)`
