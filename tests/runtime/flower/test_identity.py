"""A node is bound to its site by the site's key (issue 25, item 3).

Flower lets in any SuperNode whose key is registered, and anyone who can reach the
SuperLink's Control API can register one. Before this check, a node claiming an existing
site's name took that site's client over: the coordinator sent it the site's next round
(reproduced below with a stand-in grid: node 666 replaced node 101 as client 43)."""

import itertools
import json

import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from fedcare.runtime.flower.certs import make_site_key
from fedcare.runtime.flower.identity import SiteKeyError, read_site_keys, sign_claim
from fedcare.runtime.flower.link import HELLO, FlowerRunError, LinkSettings, SiteLink

from support.flower_offline import task_identity


class HelloGrid:
    """Nodes answering the coordinator's greeting with `nodes[node](greeting)`: an answer
    dict, or an exception's text for a ClientApp that failed."""

    def __init__(self, nodes):
        self.nodes = dict(nodes)
        self._ids = itertools.count(1)
        self._sent = {}

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = f"message-{next(self._ids)}"
            m.metadata.__dict__["_message_id"] = mid  # what the SuperLink does on push
            self._sent[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        replies = []
        for mid in ids:
            m = self._sent.pop(mid)
            answer = self.nodes[m.metadata.dst_node_id](dict(m.content.config_records[HELLO]))
            if isinstance(answer, str):
                replies.append(Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, answer), reply_to=m))
            else:
                replies.append(Message(RecordDict({HELLO: ConfigRecord({"json": json.dumps(answer)})}), reply_to=m))
        return replies


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    for site in ("site-43", "site-80", "intruder"):
        make_site_key(root, site)
    return root / "keys"


def node(site, client, key=None):
    """A node's greeting answer; signed with `key` (a private key file) if given."""
    def answer(hello):
        reply = {"client": client, "site": site, "summary": {}, "synthetic": True}
        if key is not None:
            reply["signature"] = sign_claim(key, hello["challenge"], site, client)
        return reply
    return answer


def link_for(grid, site_keys):
    return SiteLink(grid, {"experiment": "x"}, LinkSettings(connect_timeout=0.5, round_timeout=0.5), site_keys=site_keys)


def test_without_site_keys_a_later_node_takes_the_site_over(keys):
    """The behaviour the keys close (and a local trial's `--unverified-sites` keeps)."""
    with task_identity():
        grid = HelloGrid({101: node("site-43", 43), 102: node("site-80", 80)})
        link = link_for(grid, None)
        link.connect([43, 80])
        grid.nodes[666] = node("site-43", 43)
        link.greet_new_nodes()
    assert link.node_of == {43: 666, 80: 102}


def test_a_node_without_the_sites_key_is_refused_and_the_site_keeps_its_node(keys):
    site_keys = {s: (keys / f"{s}.pub").read_text() for s in ("site-43", "site-80", "intruder")}
    with task_identity():
        grid = HelloGrid({101: node("site-43", 43, keys / "site-43"), 102: node("site-80", 80, keys / "site-80")})
        link = link_for(grid, site_keys)
        link.connect([43, 80])
        assert link.node_of == {43: 101, 80: 102} and link.refused == []
        grid.nodes[666] = node("site-43", 43, keys / "intruder")  # a registered key, not site-43's
        grid.nodes[667] = node("site-43", 43)  # no key at all
        grid.nodes[668] = node("hospital-x", 7, keys / "intruder")  # a site no key was issued for
        grid.nodes[670] = lambda hello: "boom"  # a failing ClientApp must not stop the run
        # a site on fedcare 0.2 named its paths in its error: the coordinator does not keep them
        grid.nodes[671] = lambda hello: "<class 'SiteError'>:<'data directory /data/UNBC does not exist'>"
        link.greet_new_nodes()
        assert link.node_of == {43: 101, 80: 102}
        reasons = {r["node"]: r["reason"] for r in link.refused}
        assert "does not match site-43.pub" in reasons[666]
        assert "sent no signature" in reasons[667]
        assert "no key was issued" in reasons[668]
        assert "answered the greeting with an error: boom" in reasons[670]
        assert reasons[671].endswith("data directory <a path at the site> does not exist'>")
        refused_before = len(link.refused)
        link.greet_new_nodes()  # a refused node is never greeted again
        assert len(link.refused) == refused_before
        # the real site-43, restarted on a new node, proves itself and rejoins
        del grid.nodes[101]
        grid.nodes[201] = node("site-43", 43, keys / "site-43")
        link.greet_new_nodes()
        assert link.node_of[43] == 201


def test_a_site_whose_node_was_refused_fails_the_start_naming_the_refusal(keys):
    site_keys = {"site-43": (keys / "site-43.pub").read_text()}
    with task_identity():
        link = link_for(HelloGrid({666: node("site-43", 43, keys / "intruder")}), site_keys)
        with pytest.raises(FlowerRunError, match=r"missing clients: \[43\]; node 666 claiming site 'site-43' was "
                                                 r"refused: its signature does not match site-43.pub"):
            link.connect([43])


def test_site_key_folders_are_checked(tmp_path, keys):
    assert set(read_site_keys(keys)) == {"site-43", "site-80", "intruder"}
    with pytest.raises(SiteKeyError, match="no such directory"):
        read_site_keys(tmp_path / "nope")
    with pytest.raises(SiteKeyError, match="no <site>.pub files"):
        read_site_keys(tmp_path)
    (tmp_path / "bad.pub").write_text("ssh-ed25519 AAAA\n")
    with pytest.raises(SiteKeyError, match="bad.pub: not a site's public key"):
        read_site_keys(tmp_path)
    with pytest.raises(SiteKeyError, match="not this site's private key"):
        sign_claim(keys / "site-43.pub", "c", "site-43", 43)


def test_a_key_of_a_type_cryptography_does_not_know_is_a_site_key_error(tmp_path):
    """An `ecdsa-sha2-nistp999` (or any unknown type) `.pub` raised UnsupportedAlgorithm, a traceback."""
    import base64
    import struct

    def field(b: bytes) -> bytes:
        return struct.pack(">I", len(b)) + b

    blob = field(b"ecdsa-sha2-nistp999") + field(b"nistp999") + field(b"\x04" + b"\x01" * 64)
    (tmp_path / "odd.pub").write_bytes(b"ecdsa-sha2-nistp999 " + base64.b64encode(blob) + b" odd\n")
    with pytest.raises(SiteKeyError, match="odd.pub: not a site's public key"):
        read_site_keys(tmp_path)
    (tmp_path / "odd.pub").unlink()
    (tmp_path / "folder.pub").mkdir()  # a folder named like a key: a traceback too
    with pytest.raises(SiteKeyError, match="folder.pub: cannot be read"):
        read_site_keys(tmp_path)
