"""The ServerApp's side of a Flower run: which Flower node is which site (`SiteLink`), and the
`Clients` runtime that carries a federation's client operations to the sites (`FlowerClients`).

- Flower's node ids are random: a site says which client it is in a greeting (a QUERY
  message carrying the experiment), answered with its client id and the summary the
  protocol needs. A node that appears later (a restarted SuperNode) is greeted the same way
  and takes its site's place: the site rejoins. With the sites' public keys (`site_keys`),
  a node must prove with its site's key that it is that site (`identity`): a node that
  cannot is refused, recorded, and never greeted again. The answer is read as untrusted input:
  size-limited, its shape checked, its proof verified before any field is used; a node whose
  answer is none of that is refused, so no stranger can stop the run. The link knows the
  sites the experiment lists (`sites`: `[deployment.sites]`): a proven site must be listed
  with the client it claims, and a listed site that cannot take part (it answers its greeting
  with its own signed error: wrong data, wrong settings) is that site's failure, named.
- A listed site that never joined, failed its greeting, was late, dropped or gone is recorded
  with the reason (a "missed" record per exchange, with method, phase and round): the run goes
  on when `min_sites` answered, and `FlowerRuntime` never calls it complete.
- Every call to the SuperLink goes through `PatientGrid` (`grid.py`): its transient faults (an
  HTTP 500 from a locked database) are retried within `round_timeout` instead of ending the run.
  Replies are collected by polling (`poll_interval`), not with `Grid.send_and_receive`, which
  sleeps 3 s between polls; a site that does not answer within `round_timeout` is late
  (`late_sites`: dropped until it reconnects, skipped for this exchange, or waited for), one
  that the SuperLink reports unavailable has missed that operation: the exchange goes on with
  the sites that answered (at least `min_sites`, else the run stops below quorum), and each
  fit records who answered, was late, was missing (a "participation" record).
- With `late_sites = "wait"` nothing a fault does changes the numbers: a site that the SuperLink
  reports gone mid-exchange (a killed SuperNode) is waited for up to `connect_timeout` to
  rejoin, and its message is sent again (`rejoined`); a site whose reply the federation dropped
  as invalid is asked for it again (`FlowerClients.ask_again`, `asked_again`). The site knows
  the message by its number and answers it from its state before it (`site.SiteNode`), so the
  reply is the one an undisturbed run got. Only a site that does not rejoin in time misses the
  exchange, and only a reply that stays invalid is dropped, as under the other policies.
- A coordinator's checkpoint (`FlowerClients.state_dict`) holds no site's state: every message
  is numbered (`Mark`), the checkpoint says after which message each site's state counts, and
  the site keeps a copy of that state in its state folder; a resumed run sends `Resume`.
- Operations that need no answer (after-aggregation, snapshot, restore, taking a setup
  answer) wait in a per-site queue and travel with the next message to that site: one
  message exchange per fit and per evaluation, the rest rides along. Each site runs its
  operations in order, so the numbers are those of the in-process simulator.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from torch import nn

from fedcare.algorithms.base import ClientId
from fedcare.algorithms.messages import Message as FedMessage
from fedcare.algorithms.training import ClientData
from fedcare.config import site_name_problem
from fedcare.errors import UserError
from fedcare.runtime.clients import (
    AfterAggregation,
    Data,
    Evaluate,
    Exchange,
    Fit,
    ReceiveSetup,
    Restore,
    Setup,
    Snapshot,
    Work,
)
from fedcare.runtime.flower.grid import PatientGrid
from fedcare.runtime.flower.identity import claim_problem, new_challenge
from fedcare.runtime.flower.records import Begin, Mark, Resume, decode_results, encode_ops, op_from_plain, op_to_plain
from fedcare.runtime.sites import without_paths

HELLO = "fedcare-hello"
# A node that crashed or left: the SuperLink answers for it with one of these.
UNAVAILABLE = {ErrorCode.NODE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE,
               ErrorCode.CLIENT_APP_CRASHED}
# ... and these when our message's time-to-live (round_timeout) ran out first: the site is late, not gone
EXPIRED = {ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE}
MAX_ANSWER = 1 << 20  # characters: a greeting's answer is a few kilobytes; a longer one is not parsed
MAX_REASON = 500  # characters of a node's or site's own words kept in a record
ASK_AGAIN = 2  # late_sites = "wait": how often a site whose reply was invalid is asked for it again

log = logging.getLogger(__name__)


class FlowerRunError(UserError, RuntimeError):
    """The federation cannot go on: a site failed, too few sites answered, or the sites do
    not match the experiment. The message names the sites."""


LATE_POLICIES = ("wait", "skip-round", "drop")


@dataclass(frozen=True)
class LinkSettings:
    min_sites: int = 1  # an exchange goes ahead when at least this many sites answered
    round_timeout: float = 600.0  # seconds to wait for the sites' replies to one exchange
    # a site that has not answered within round_timeout: "drop" (not asked again until its
    # SuperNode reconnects), "skip-round" (misses this exchange, asked again at the next) or
    # "wait" (waited for until it answers; one reported gone is waited for to rejoin, its message sent again)
    late_sites: str = "drop"
    # seconds to wait for every site at the start (and, with "wait", for a site gone mid-exchange to rejoin)
    connect_timeout: float = 300.0
    poll_interval: float = 0.05  # seconds between two looks for replies


class SiteLink:
    def __init__(self, grid: Grid, hello: Mapping[str, Any], settings: LinkSettings,
                 on_missed: Callable[[dict], None] | None = None, on_participation: Callable[[dict], None] | None = None,
                 site_keys: Mapping[str, str] | None = None, sites: Mapping[str, ClientId] | None = None):
        if settings.late_sites not in LATE_POLICIES:
            raise ValueError(f"late_sites {settings.late_sites!r}: expected one of {', '.join(LATE_POLICIES)}")
        # every SuperLink call retried on its transient faults (HTTP 500: a locked database), for up to round_timeout
        self.grid = grid if isinstance(grid, PatientGrid) else PatientGrid(grid, settings.round_timeout)
        self.site_keys = None if site_keys is None else dict(site_keys)  # None: sites are taken at their word
        self.hello = dict(hello)  # what every site is greeted with (the experiment, as TOML text)
        self.settings = settings
        self.on_missed = on_missed
        self.on_participation = on_participation  # gets each fit's (and setup's) participation record
        self.participation: list[dict] = []  # per fit/setup exchange: which sites answered, were late, missing
        self.node_of: dict[ClientId, int] = {}
        self.site_of: dict[ClientId, str] = {}
        self.summaries: dict[ClientId, dict] = {}
        self.synthetic: dict[ClientId, bool] = {}
        self.preflight: dict[ClientId, dict | None] = {}  # each site's data summary (fedcare.runtime.preflight)
        self.compute: dict[ClientId, dict] = {}  # each site's torch, CPU kernels and threads (fedcare.compute)
        self.joins: dict[ClientId, int] = {}  # how often each client has (re)joined
        self.missed: list[dict] = []
        self.refused: list[dict] = []  # nodes that claimed a site they could not prove to be
        # late_sites = "wait": sites that left mid-exchange and answered after rejoining; replies asked for again
        self.rejoined: list[dict] = []
        self.asked_again: list[dict] = []
        self.out: dict[ClientId, str] = {}  # why a listed site is not connected (failed, refused, dropped, gone)
        self._greeted: set[int] = set()
        self._silent: set[int] = set()  # listed nodes that did not answer: not waited for again
        # the sites the experiment lists, name -> client ([deployment.sites]); None: any node is taken
        self.sites = None if sites is None else dict(sites)
        self._listed_name = {} if sites is None else {c: s for s, c in sites.items()}
        self._names = dict(self.sites or {})  # the names a node may answer under
        if site_keys is None:  # Flower's Simulation Engine names a node by its client id
            self._names.update({str(c): c for c in self._listed_name if str(c) not in self._names})

    def _message(self, content: RecordDict, node: int, message_type: str) -> Message:
        # the TTL keeps a message the site could not take in time from reaching it later (a
        # restarted SuperNode would otherwise first run an operation the server gave up on);
        # a server that waits for late sites keeps Flower's default TTL
        if self.settings.late_sites == "wait":
            return Message(content, dst_node_id=node, message_type=message_type)
        return Message(content, dst_node_id=node, message_type=message_type, ttl=self.settings.round_timeout)

    # -- who is who --------------------------------------------------------------------
    def greet_new_nodes(self, expected: list[ClientId] | None = None) -> None:
        """Greet the connected nodes that are no site's yet: new SuperNodes, and sites that
        came back (a restarted SuperNode may keep its node id: it is tied to its key). With
        `expected` (the start), stop waiting once each of those clients' sites has joined or
        failed: a node that never answers (a stranger's) holds nothing up."""
        listed = set(self.grid.get_node_ids())
        self._silent &= listed  # a node that left may come back under its id: greet it then
        new = sorted(listed - set(self.node_of.values()) - self._silent - {r["node"] for r in self.refused})
        if not new:
            return
        challenge = new_challenge()
        content = RecordDict({HELLO: ConfigRecord({**self.hello, "challenge": challenge})})
        messages = [self._message(content, n, MessageType.QUERY) for n in new]
        first = not self._greeted
        done = None if expected is None else (lambda: all(c in self.node_of or c in self.out for c in expected))
        replies = self._collect(messages, self.settings.connect_timeout if first else self.settings.round_timeout,
                                take=lambda node, reply: self._take_greeting(node, reply, challenge), done=done)
        self._greeted.update(new)
        self._silent |= {n for n in new if n not in replies}  # not asked again while it stays listed

    def _take_greeting(self, node: int, reply: Message, challenge: str) -> None:
        """One node's answer to its greeting: it joins as its site, or the site's failure is
        recorded, or the node is refused."""
        if reply.has_error():
            if reply.error.code in UNAVAILABLE:
                return
            error = _short(_site_reason(reply))
            if self.site_keys is None:  # every node is taken at its word: a failing one stops the run
                raise FlowerRunError(f"a site refused the experiment: {error}")
            self._refuse(node, "?", None, f"answered the greeting with an error: {error}")  # an unproven node must not be able to stop the run
            return
        answer, problem = read_answer(reply)
        if answer is None:
            self._refuse(node, "?", None, problem)
            return
        site = answer["site"]
        problem = self._proof_problem(answer, challenge)
        if problem is not None:
            self._refuse(node, site, answer.get("client"), problem)
            return
        # from here on the node is the site it says it is
        if "error" in answer:  # the site cannot take part: its own words
            if self.sites is None:  # no list of sites to record it against
                raise FlowerRunError(f"site {site!r} refused the experiment: {_short(answer['error'])}")
            self._silent.add(node)  # greeted again once its SuperNode restarts
            cid = self._names[site]
            self.out[cid] = f"its greeting failed: {_short(answer['error'])}"
            return
        problem = self._client_problem(site, answer["client"])
        if problem is not None:
            self._refuse(node, site, answer["client"], problem)
            self.out[self._names[site]] = f"refused: {problem}"
            return
        cid = answer["client"]
        if cid in self.node_of and self.node_of[cid] != node and self.site_of[cid] != site:
            raise FlowerRunError(f"sites {self.site_of[cid]!r} and {site!r} both claim client {cid!r}")
        self.node_of[cid], self.site_of[cid] = node, site
        self.out.pop(cid, None)
        self.summaries[cid] = answer["summary"]
        self.synthetic[cid] = answer["synthetic"]
        self.preflight[cid] = answer.get("preflight")
        if isinstance(answer.get("compute"), dict):
            self.compute[cid] = answer["compute"]
        self.joins[cid] = self.joins.get(cid, 0) + 1

    def _proof_problem(self, answer: Mapping[str, Any], challenge: str) -> str | None:
        """Why a node is not the listed site it names (None: it is, or sites are taken at their word)."""
        site = answer["site"]
        if self.sites is not None and site not in self._names:
            return f"not a site of this experiment ([deployment.sites] lists {', '.join(sorted(self.sites))})"
        if self.site_keys is None:
            return None
        if site not in self.site_keys:
            return f"no key was issued for a site of that name (not among the {len(self.site_keys)} site keys)"
        return claim_problem(self.site_keys[site], answer.get("signature"), challenge, site, answer.get("client"),
                             answer.get("error"))

    def _client_problem(self, site: str, cid: ClientId) -> str | None:
        """Why a proven site may not be the client it claims: the experiment lists it as another."""
        if self.sites is None or _same(self._names[site], cid):
            return None
        return f"it claims client {cid!r}, but [deployment.sites] lists site {site!r} as client {self._names[site]!r}"

    def _refuse(self, node: int, site: str, cid: ClientId, reason: str) -> None:
        record = {"type": "refused", "node": node, "site": str(site), "client": cid, "reason": reason}
        self.refused.append(record)
        if self.on_missed is not None:
            self.on_missed(record)

    def connect(self, expected: list[ClientId] | None = None) -> None:
        """Wait until every expected client's site (default: every listed site) has joined or
        failed; after `connect_timeout` go on with at least `min_sites` of them, recording why
        each other one is missing, else fail naming them."""
        expected = list(self._listed_name) if expected is None else list(expected)
        deadline = time.monotonic() + self.settings.connect_timeout
        while True:
            self.greet_new_nodes(expected)
            missing = [c for c in expected if c not in self.node_of]
            if not missing:
                return
            if time.monotonic() > deadline or all(c in self.out for c in missing):  # none left to wait for
                break
            time.sleep(max(self.settings.poll_interval, 0.2))
        joined = len(expected) - len(missing)
        if joined >= self.settings.min_sites:
            for c in missing:
                self._miss(c, {"operation": "start"}, self.why_out(c))
            return
        refused = "".join(f"; node {r['node']} claiming site {r['site']!r} was refused: {r['reason']}"
                          for r in self.refused)
        failed = "".join(f"; site {self.site_name(c)!r}: {self.out[c]}" for c in missing if c in self.out)
        raise FlowerRunError(
            f"only {joined} of {len(expected)} sites joined within {self.settings.connect_timeout:.0f} s "
            f"(min_sites = {self.settings.min_sites}); missing clients: {missing}{refused}{failed}")

    def why_out(self, cid: ClientId) -> str:
        """Why a listed client's site is not connected: failed, refused, dropped, gone, or not running."""
        if cid in self.out:
            return self.out[cid]
        claims = [r["reason"] for r in self.refused if r["site"] == self.site_name(cid)]
        if claims:
            return f"not running, or not proven: a node claiming it was refused ({claims[-1]})"
        return "not running (no node answered the greeting as this site)"

    def absent(self) -> dict[ClientId, str]:
        """The listed sites that are not connected, and why (`--preflight-only` fails naming them)."""
        return {c: self.why_out(c) for c in self._listed_name if c not in self.node_of}

    def site_name(self, cid: ClientId) -> str:
        return self.site_of.get(cid) or self._listed_name.get(cid, str(cid))

    # -- exchanges ---------------------------------------------------------------------
    def _collect(self, messages: list[Message], timeout: float, late: set[int] | None = None,
                 take: Callable[[int, Message], None] | None = None,
                 done: Callable[[], bool] | None = None) -> dict[int, Message]:
        """Push the messages, poll for replies until each has one or `timeout` passes; keyed
        by node id (a node gets at most one message per exchange). With `late` (a set to fill),
        the nodes that have not answered by `timeout` are put in it and waited for (late sites: "wait").
        `take` is handed each reply as it comes; polling stops early once `done()` holds."""
        ids = dict(zip(self.grid.push_messages(messages), (m.metadata.dst_node_id for m in messages)))
        replies: dict[int, Message] = {}
        deadline = time.monotonic() + timeout
        while ids and (late is not None or time.monotonic() < deadline):
            for reply in self.grid.pull_messages(list(ids)):
                node = ids.pop(reply.metadata.reply_to_message_id)
                replies[node] = reply
                if take is not None:
                    take(node, reply)
            if done is not None and done():
                break
            if late is not None and not late and time.monotonic() >= deadline:
                late.update(ids.values())
            if ids:
                time.sleep(self.settings.poll_interval)
        return replies

    def exchange(self, ops: Mapping[ClientId, list], what: Mapping[str, Any], *, again: bool = False,
                 ) -> dict[ClientId, list]:
        """Send each client its operations; returns each answering client's results. Clients
        that do not answer are recorded as missed (`what` says what they missed). `again`: the
        exchange's messages sent once more (`FlowerClients.ask_again`): no second participation record."""
        self.greet_new_nodes()
        wanted = sorted(ops)
        reachable = [c for c in wanted if c in self.node_of]
        messages = [self._message(encode_ops(ops[c]), self.node_of[c], MessageType.TRAIN) for c in reachable]
        late_nodes: set[int] | None = set() if self.settings.late_sites == "wait" else None
        by_node = self._collect(messages, self.settings.round_timeout, late_nodes) if messages else {}
        results: dict[ClientId, list] = {}
        gone: dict[ClientId, str] = {}  # "wait": sites the SuperLink reported gone, waited for to rejoin
        late: list[ClientId] = [c for c in reachable if self.node_of[c] in (late_nodes or ())]
        for c in wanted:
            reply = by_node.get(self.node_of.get(c, -1)) if c in reachable else None
            if c not in reachable:
                self._miss(c, what, f"not connected: {self.why_out(c)}")
            elif reply is None or (reply.has_error() and reply.error.code in EXPIRED):  # no answer in time
                late.append(c)
                if self.settings.late_sites == "drop":  # silent: not waited for again until it rejoins
                    self._silent.add(self.node_of.pop(c))
                    self.out[c] = f"dropped after it was late for {_during(what)}"
                self._miss(c, {**what, "late": True}, f"late: no answer within round_timeout "
                                                      f"({self.settings.round_timeout:g} s)")
            elif reply.has_error():
                if reply.error.code not in UNAVAILABLE:
                    raise FlowerRunError(f"site {self.site_name(c)!r} failed: {_site_reason(reply)}")
                self.node_of.pop(c, None)  # gone: do not wait for it again until it rejoins
                self.out[c] = f"gone during {_during(what)}"
                if self.settings.late_sites == "wait":
                    gone[c] = _short(reply.error.reason)
                else:
                    self._miss(c, what, f"gone: {_short(reply.error.reason)}")
            else:
                results[c] = decode_results(reply.content)
        if gone:
            results.update(self._wait_for_return(ops, gone, what))
            results = {c: results[c] for c in wanted if c in results}  # the order they are aggregated in
        if what.get("operation") in ("fit", "setup") and not again:
            self._participation(what, wanted, results, late)
        needed = min(self.settings.min_sites, len(wanted))
        if len(results) < needed:
            raise FlowerRunError(
                f"below quorum: {_describe(what)}: only {len(results)} of {len(wanted)} sites answered "
                f"(min_sites = {self.settings.min_sites}); missing: {[self.site_name(c) for c in wanted if c not in results]}. "
                "The run stops here; its finished units are kept")
        return results

    def _wait_for_return(self, ops: Mapping[ClientId, list], gone: dict[ClientId, str],
                         what: Mapping[str, Any]) -> dict[ClientId, list]:
        """late_sites = "wait": the sites that left during an exchange, waited for up to
        `connect_timeout` to rejoin; each that does is sent its message again (it answers from
        its state before that message), each that does not has missed the exchange."""
        timeout = self.settings.connect_timeout
        for c, why in gone.items():
            log.warning("site %r left during %s (%s): waiting up to %g s (connect_timeout) for it to rejoin",
                        self.site_name(c), _during(what), why, timeout)
        results: dict[ClientId, list] = {}
        start = time.monotonic()
        while gone and time.monotonic() < start + timeout:
            self.greet_new_nodes()
            back = [c for c in gone if c in self.node_of]
            if not back:
                time.sleep(max(self.settings.poll_interval, 0.2))
                continue
            by_node = self._collect([self._message(encode_ops(ops[c]), self.node_of[c], MessageType.TRAIN)
                                     for c in back], self.settings.round_timeout, set())
            for c in back:
                reply = by_node[self.node_of[c]]
                if reply.has_error() and reply.error.code not in UNAVAILABLE:
                    raise FlowerRunError(f"site {self.site_name(c)!r} failed: {_site_reason(reply)}")
                if reply.has_error():  # gone again: waited for again
                    self.node_of.pop(c)
                    continue
                results[c] = decode_results(reply.content)
                record = {"site": self.site_name(c), "client": c, **what, "reason": f"gone: {gone.pop(c)}",
                          "seconds": round(time.monotonic() - start, 1)}
                self.rejoined.append(record)
                log.warning("site %r rejoined after %.1f s and answered %s", record["site"], record["seconds"],
                            _during(what))
        for c, why in gone.items():
            self._miss(c, what, f"gone: {why}; it did not rejoin within connect_timeout ({timeout:g} s)")
        return results

    def _participation(self, what: Mapping[str, Any], wanted: list[ClientId], results: Mapping[ClientId, list],
                       late: list[ClientId]) -> None:
        """One exchange's record of who answered, was late (did not answer within round_timeout;
        with "wait" it may have answered after) and was missing (not connected, or gone)."""
        names = self.site_name
        record = {"type": "participation", **what, "policy": self.settings.late_sites,
                  "answered": sorted(names(c) for c in results), "late": sorted(names(c) for c in set(late)),
                  "missing": sorted(names(c) for c in wanted if c not in results and c not in late)}
        self.participation.append(record)
        if self.on_participation is not None:
            self.on_participation(record)

    def _miss(self, cid: ClientId, what: Mapping[str, Any], reason: str) -> None:
        what = {k: v for k, v in what.items() if k != "late" or v}  # "late": only for a late site
        record = {"type": "missed", "site": self.site_name(cid), "client": cid, **what, "reason": reason}
        self.missed.append(record)
        if self.on_missed is not None:
            self.on_missed(record)


def _site_reason(reply: Message) -> str:
    """A site's error as the coordinator keeps it (run.json, the run's error): without the
    site's paths (a site on fedcare 0.2 sent them; a site's disk is the site's)."""
    return without_paths(reply.error.reason.strip())


def _describe(what: Mapping[str, Any]) -> str:
    return " ".join(f"{k} {v}" for k, v in what.items() if k not in ("data",))


def where(record: Mapping[str, Any]) -> str:
    """Which round an exchange's record (missed, participation) is about: method, phase, round."""
    at = " ".join(str(record[k]) for k in ("method", "phase") if record.get(k) is not None)
    return f"{at} round {record['round']}".strip() if record.get("round") is not None else at


def _during(what: Mapping[str, Any]) -> str:
    """An exchange, for a reason: "fit (fedavg train round 2)"."""
    return f"{what['operation']} ({where(what)})" if where(what) else str(what["operation"])


def _short(text: object) -> str:
    """A node's or site's own words, as a record keeps them: one line, at most MAX_REASON
    characters, no closing full stop (a record's reasons are joined into sentences)."""
    words = " ".join(str(text).split()).rstrip(".")
    return words if len(words) <= MAX_REASON else words[:MAX_REASON] + "..."


def _same(a: object, b: object) -> bool:
    """Equal and of one type: client 43 is not "43" (nor True 1)."""
    return type(a) is type(b) and a == b


def read_answer(reply: Message) -> tuple[dict | None, str]:
    """A greeting's answer as untrusted input: (the answer, "") when it is a JSON object of at
    most MAX_ANSWER characters with the fields a site sends, of their types; else (None, why not)."""
    try:
        text = reply.content.config_records[HELLO]["json"]
    except (KeyError, TypeError, AttributeError):
        return None, "sent a malformed greeting answer: no fedcare answer in it"
    if not isinstance(text, str) or len(text) > MAX_ANSWER:
        size = f"{len(text)} characters" if isinstance(text, str) else type(text).__name__
        return None, f"sent a malformed greeting answer: {size}, expected JSON text of at most {MAX_ANSWER} characters"
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError) as e:
        return None, f"sent a malformed greeting answer: not JSON ({_short(e)})"
    problem = _answer_problem(answer)
    return (answer, "") if problem is None else (None, f"sent a malformed greeting answer: {problem}")


def _answer_problem(answer: object) -> str | None:
    """What in a parsed greeting answer is not what a site sends (None: nothing)."""
    if not isinstance(answer, dict):
        return f"a JSON {type(answer).__name__}, not an object"
    site = answer.get("site")
    if not isinstance(site, str) or site_name_problem(site):
        return "its site is not a site's name"
    if not isinstance(answer.get("signature", ""), str):
        return "its signature is not text"
    if "error" in answer:  # a site that cannot take part says why, and nothing else
        return None if isinstance(answer["error"], str) else "its error is not text"
    cid = answer.get("client")
    if isinstance(cid, bool) or not isinstance(cid, (int, str)) or len(str(cid)) > 100:
        return "its client is not a client id (a number or a short text)"
    required = {"summary": dict, "synthetic": bool}
    optional = {"preflight": (dict, type(None)), "compute": dict}
    wrong = [k for k, kind in required.items() if not isinstance(answer.get(k), kind)]
    wrong += [k for k, kind in optional.items() if k in answer and not isinstance(answer[k], kind)]
    return f"{', '.join(wrong)}: missing or of the wrong type" if wrong else None


class FlowerClients:
    """One federation's clients at their sites (see the module docstring)."""

    def __init__(self, link: SiteLink, namespace: str, algorithm: str, seed: int, model: nn.Module,
                 label: Mapping[str, Any] | None = None):
        self.link = link
        self.namespace = namespace
        self.algorithm = algorithm
        self.seed = seed
        self.initial = FedMessage({k: v.detach().clone() for k, v in model.state_dict().items()})
        self.label = dict(label or {})
        self.ready: dict[ClientId, int] = {}  # client -> its join count when it began this federation
        self.reset: set[ClientId] = set()
        self.pending: dict[ClientId, list] = {}
        self.in_snapshot: set[ClientId] = set()
        # messages of this federation to each site, numbered (`Mark`): the last sent, the last
        # answered, and the one whose state the coordinator's last checkpoint refers to
        self.sent: dict[ClientId, int] = {}
        self.answered: dict[ClientId, int] = {}
        self.kept: dict[ClientId, int] = {}
        self.resume_from: dict[ClientId, int] = {}  # a resumed run: where each site continues from
        self.last_round: dict[str, Any] = {}  # the last fit's phase and round: what an evaluation follows
        self.last_ops: dict[ClientId, list] = {}  # the last exchange's messages, and what it was
        self.last_what: dict[str, Any] = {}

    @property
    def asks_again(self) -> int:
        """How often the federation asks a site whose reply it dropped for it again (`ask_again`):
        only a coordinator that waits for its sites does."""
        return ASK_AGAIN if self.link.settings.late_sites == "wait" else 0

    def ask_again(self, rejected: Mapping[ClientId, str]) -> dict[ClientId, FedMessage]:
        """Send the sites whose replies were dropped (client -> why) the last exchange's messages
        again: each answers from its state before that message, as it did the first time."""
        for c, why in sorted(rejected.items(), key=lambda item: str(item[0])):
            self.link.asked_again.append({"site": self.link.site_name(c), "client": c, **self.label,
                                          **self.last_what, "reason": why})
        results = self.link.exchange({c: self.last_ops[c] for c in rejected}, {**self.label, **self.last_what},
                                     again=True)
        return {c: r[-1] for c, r in results.items()}

    @property
    def min_replies(self) -> int:
        """The fewest valid replies an exchange goes on with (the deployment's quorum, `min_sites`):
        the federation drops invalid ones (`fedcare.runtime.replies`) after the link counted them."""
        return self.link.settings.min_sites

    def _ops(self, cid: ClientId, new: list) -> list:
        ops = []
        joins = self.link.joins.get(cid, 0)
        if self.ready.get(cid) != joins:  # first contact, or the site rejoined: (re)start it
            if cid in self.resume_from:
                ops.append(Resume(self.algorithm, self.seed, self.resume_from[cid]))
            else:
                ops.append(Begin(self.algorithm, self.seed, self.initial, reset=cid in self.reset))
            self.reset.discard(cid)
            self.ready[cid] = joins
        self.sent[cid] = self.sent.get(cid, 0) + 1
        ops.append(Mark(self.sent[cid], self.kept.get(cid)))
        ops += self.pending.pop(cid, [])
        return [(self.namespace, op) for op in ops + new]

    def _exchange(self, new_ops: Mapping[ClientId, list], what: Mapping[str, Any]) -> dict[ClientId, Any]:
        ops = {c: self._ops(c, new_ops[c]) for c in sorted(new_ops)}
        self.last_ops, self.last_what = ops, dict(what)  # what `ask_again` sends again
        results = self.link.exchange(ops, {**self.label, **what})
        for c in results:
            self.answered[c] = self.sent[c]
            self.resume_from.pop(c, None)
        return {c: r[-1] for c, r in results.items()}  # the last operation's result is the asked-for one

    # -- a resumable run's checkpoint (`fedcare.studies.checkpoint`) -----------------------
    def state_dict(self) -> dict:
        """The coordinator's side of this federation's clients: the operations waiting for the
        sites and, per site, the message after which its state counts. The state itself stays at
        the site: the next message tells the site to keep a copy of it (`Mark`)."""
        self.kept = {c: self.answered[c] for c in self.ready if c in self.answered}
        return {"namespace": self.namespace, "kept": dict(self.kept),
                "pending": {c: [op_to_plain(op) for op in ops] for c, ops in self.pending.items()},
                "in_snapshot": sorted(self.in_snapshot), "reset": sorted(self.reset)}

    def load_state_dict(self, saved: dict) -> None:
        """Continue the checkpointed federation: each site goes back to its kept state at first contact."""
        self.namespace = saved["namespace"]
        self.kept = dict(saved["kept"])
        self.resume_from = dict(saved["kept"])
        self.sent, self.answered = dict(saved["kept"]), dict(saved["kept"])
        self.ready = {c: -1 for c in self.kept}  # -1: no join count yet: Resume at first contact
        self.pending = {c: [op_from_plain(op) for op in ops] for c, ops in saved["pending"].items()}
        legacy = [op.data for ops in self.pending.values() for op in ops if isinstance(getattr(op, "data", None), str)]
        if legacy:  # fedcare 0.2.0 named data by strings ("train/global"); its sites no longer read them
            raise FlowerRunError(f"this run's checkpoint was written before typed data references (an operation "
                                 f"waiting for a site names its data {legacy[0]!r}): it cannot continue across "
                                 "sites; start the run again")
        self.in_snapshot, self.reset = set(saved["in_snapshot"]), set(saved["reset"])

    def fit(self, phase: str, rnd: int, work: Work) -> dict[ClientId, FedMessage]:
        self.last_round = {"phase": phase, "round": rnd}
        return self._exchange({c: [Fit(phase, rnd, m, d)] for c, (m, d) in work.items()},
                              {"operation": "fit", "phase": phase, "round": rnd})

    def after_aggregation(self, phase: str, rnd: int, work: Work) -> None:
        for c, (m, d) in work.items():
            self.pending.setdefault(c, []).append(AfterAggregation(phase, rnd, m, d))

    def setup(self, phase: str, work: Work) -> dict[ClientId, FedMessage]:
        replies = self._exchange({c: [Setup(phase, m, d)] for c, (m, d) in work.items()},
                                 {"operation": "setup", "phase": phase})
        return {c: r for c, r in replies.items() if r is not None}

    def receive_setup(self, answers: Mapping[ClientId, FedMessage]) -> None:
        for c, m in answers.items():
            self.pending.setdefault(c, []).append(ReceiveSetup(m))

    def evaluate(self, work: Work, metrics: str) -> dict[ClientId, dict]:
        return self._exchange({c: [Evaluate(m, d, metrics)] for c, (m, d) in work.items()},
                              {"operation": f"evaluate {metrics}", **self.last_round,
                               "data": sorted({str(d) for _, d in work.values()})})

    def exchange(self, name: str, rnd: int, messages: Mapping[ClientId, FedMessage]) -> dict[ClientId, FedMessage]:
        return self._exchange({c: [Exchange(name, rnd, m)] for c, m in messages.items()},
                              {"operation": name, "round": rnd})

    def snapshot(self) -> None:
        for c in self.ready:
            self.pending.setdefault(c, []).append(Snapshot())
        self.in_snapshot = set(self.ready)

    def restore(self) -> None:
        for c in list(self.ready):
            if c in self.in_snapshot:
                self.pending.setdefault(c, []).append(Restore())
            else:  # began after the snapshot: starts afresh, as in process
                del self.ready[c]
                self.pending.pop(c, None)
                self.reset.add(c)

    def pooled(self, refs: Mapping[ClientId, Data]) -> ClientData:
        raise FlowerRunError("centralized training pools every site's data: it cannot run across sites")
