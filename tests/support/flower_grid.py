"""A stand-in for the Grid a ServerApp talks to (`SiteLink`'s side of a Flower run), offline:
each node is a function from a message pushed to it to its reply, or None while it has not
answered (a node that never answers is a late or a dead site). The nodes a test needs are
built here: a site answering as fedcare's ClientApp does (signed with its key), a site that
cannot take part (its signed error), a stranger answering whatever it likes, a real ClientApp
in this process, and replies Flower's SuperLink makes (an error for a node gone or a message
expired). Messages need Flower's TaskIdentity set: use `support.flower_offline.task_identity`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from fedcare.runtime.flower.identity import sign_claim
from fedcare.runtime.flower.link import HELLO
from fedcare.runtime.flower.records import encode_results

Node = Callable[[Message], "Message | None"]


class SitesGrid:
    """Nodes by id; `pushed` keeps every message pushed, in order."""

    def __init__(self, nodes: Mapping[int, Node]):
        self.nodes = dict(nodes)
        self.pushed: list[Message] = []
        self._ids = itertools.count(1)
        self._waiting: dict[str, Message] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages) -> list[str]:
        ids = []
        for m in messages:
            mid = f"message-{next(self._ids)}"
            m.metadata.__dict__["_message_id"] = mid  # what the SuperLink does on push
            self._waiting[mid] = m
            self.pushed.append(m)
            ids.append(mid)
        return ids

    def pull_messages(self, ids) -> list[Message]:
        replies = []
        for mid in ids:
            m = self._waiting[mid]
            node = self.nodes.get(m.metadata.dst_node_id)
            reply = None if node is None else node(m)
            if reply is not None:
                del self._waiting[mid]
                replies.append(reply)
        return replies


def is_greeting(m: Message) -> bool:
    return HELLO in m.content.config_records


def greeting_of(m: Message) -> dict:
    return dict(m.content.config_records[HELLO])


def answer_text(m: Message, text: str) -> Message:
    """A greeting's answer carrying `text` as its JSON (whatever it is)."""
    return Message(RecordDict({HELLO: ConfigRecord({"json": text})}), reply_to=m)


def error_reply(m: Message, code: int = ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason: str = "boom") -> Message:
    """A reply carrying an error: the ClientApp raised (the default), or the SuperLink's words for
    a node gone (`ErrorCode.NODE_UNAVAILABLE`) or a message whose time-to-live ran out
    (`ErrorCode.MESSAGE_UNAVAILABLE`)."""
    return Message(Error(code, reason), reply_to=m)


def results_reply(m: Message) -> Message:
    return Message(encode_results([{"ok": m.metadata.dst_node_id}]), reply_to=m)


PREFLIGHT = {"unit": "frames", "min_count": 5, "splits": {"sessions": {"examples": 40, "labels": {"no pain": 30, "pain": 10}}},
             "dataset": {}}


def site(name: str, client: Any, key: Path | None = None, *, error: str | None = None,
         work: Node = results_reply, **fields: Any) -> Node:
    """A node answering as fedcare's ClientApp does: its greeting with (client, site, summary,
    ...) signed with `key` if given, or with `error` (a site that cannot take part), and every
    other message with `work`. `fields` replace the answer's fields."""
    def node(m: Message) -> Message | None:
        if not is_greeting(m):
            return work(m)
        answer = {"site": name, "error": error} if error is not None else {
            "client": client, "site": name, "summary": {}, "synthetic": True, "preflight": PREFLIGHT, **fields}
        if key is not None:
            answer["signature"] = sign_claim(key, greeting_of(m)["challenge"], name, client, error)
        return answer_text(m, json.dumps(answer))
    return node


def stranger(text: str) -> Node:
    """A registered node answering its greeting with `text` (garbage, another shape)."""
    return lambda m: answer_text(m, text)


def never(m: Message) -> None:
    """A node that never answers (a late site; a node whose SuperNode hangs)."""
    return None


def client_app_node(app, node_id: int, node_config: Mapping[str, Any]) -> Node:
    """A real ClientApp in this process, as a SuperNode with `node_config` runs it: an exception
    becomes an error reply, as Flower makes it."""
    context = Context(run_id=1, node_id=node_id, node_config=dict(node_config), state=RecordDict(), run_config={})

    def node(m: Message) -> Message:
        try:
            return app(message=m, context=context)
        except Exception as e:  # noqa: BLE001 - what Flower's ClientApp runtime does with it
            return error_reply(m, reason=f"{type(e).__name__}: {e}")
    return node
