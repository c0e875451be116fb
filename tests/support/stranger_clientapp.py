"""A stranger's ClientApp, for a test SuperNode registered with its own key
(tests/deployment/test_cli_deployed_trust.py): its warm launcher imports this module
(`fedcare flower supernode --preload support.stranger_clientapp`, with tests/ on PYTHONPATH),
which puts a ClientApp answering every greeting with `{garbage` where fedcare's is. Flower's
app loading takes an imported module as it is, so this node runs the stranger's code, as a
node with modified software would."""

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

import fedcare.deployment.app as fedcare_app
from fedcare.runtime.flower.link import HELLO

GARBAGE = "{garbage"

stranger = ClientApp()


@stranger.query()
def hello(msg: Message, context: Context) -> Message:
    return Message(RecordDict({HELLO: ConfigRecord({"json": GARBAGE})}), reply_to=msg)


fedcare_app.client_app = stranger
