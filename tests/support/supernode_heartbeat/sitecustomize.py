"""On PYTHONPATH of the test deployment's SuperNodes only (support/deployment.py): Python imports
this file at start-up. In the `flower-supernode` process it shortens the node's heartbeat to
10 s, the shortest interval the SuperLink accepts (`HEARTBEAT_MIN_INTERVAL`); Flower 1.41 and 1.42 have no
option for it. The SuperLink marks a node offline after 2 intervals without a heartbeat, so a
killed site is noticed after about 20 s instead of about a minute
(tests/deployment/test_cli_deployed_pain.py).

Only the node's heartbeat to the SuperLink changes (the interval it declares and how often it
sends): the SuperNode's own deadlines for its ClientApp processes (`flwr.supercore.corestate`)
and every other process (SuperExec, ClientApps) keep Flower's defaults.

With FEDCARE_TEST_FAULTS set (the chaos test only), the site's processes also load the fault
hook of site_faults.py."""

import os
import sys

if [os.path.basename(a) for a in sys.orig_argv[1:2]] == ["flower-supernode"]:  # python3 .../flower-supernode
    import flwr.supernode.fleet_http_connection as connection  # the interval it declares
    from flwr.common.constant import HEARTBEAT_MIN_INTERVAL
    from flwr.supercore import heartbeat  # how often the node's HeartbeatSender sends

    heartbeat.HEARTBEAT_DEFAULT_INTERVAL = connection.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT_MIN_INTERVAL

if os.environ.get("FEDCARE_TEST_FAULTS"):  # the chaos test's faults at this site (site_faults.py)
    import site_faults  # beside this file, on the same path

    site_faults.install()
