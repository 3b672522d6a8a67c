"""Find the cluster and call its API: the only module of the commands that does network IO.

Where the cluster is, and who we are on it (the first that applies):

1. ``CORRAL_CREDENTIALS`` names a credentials file (services, tests, a remote cluster); ``CORRAL_NATS_URL``,
   when set, wins over the URL in it;
2. the local cluster of ``corral up`` (unless ``CORRAL_NATS_URL`` is set): the state directory is
   ``CORRAL_STATE_DIR`` or ``~/.corral`` and the credentials file ``<state>/credentials/<unix user>.json``;
3. the host's ``corral authd`` (``authd_client``): ``CORRAL_AUTH_SOCKET``, else ``<state>/authd.sock``, else
   ``/run/corral/authd.sock``; it vouches for our Unix user with a ticket and names the cluster. A ticket
   lives minutes: ``Cluster.login`` asks for a new one for each connection made near its end (srun's
   reattach after a long step).

A caller that is inside a trace passes it on: a valid W3C ``TRACEPARENT`` in the environment (as CI systems
and ``opentelemetry-instrument`` set it) goes with every call as the NATS ``traceparent`` header, and the
gateway's spans (a submission's trace, the job's) continue it. An invalid one is ignored, as the W3C
specification says.

Calls use the small synchronous NATS client rather than nats-py and asyncio: these commands are started
by the thousand by submitit and dask, so their start-up time is what users feel.
"""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union

import msgspec

from corral.cli import authd_client
from corral.cli.errors import CliError
from corral.libs.runtime import nats_request
from corral.libs.runtime.credentials import Credentials, read_credentials
from corral.libs.runtime.nats_errors import ServerUnreachable
from corral.libs.runtime.nats_retry import RETRY_S, retrying
from corral.libs.trace.spans import parse_traceparent
from corral.schemas.api import (
    AcctJob,
    AcctReply,
    AcctRequest,
    ApiError,
    HistoryReply,
    HistoryRequest,
    JobInfo,
    JobPriority,
    JobsReply,
    JobsRequest,
    NodeInfo,
    NodesReply,
    NodesRequest,
    PriorityReply,
    PriorityRequest,
    ShareInfo,
    SharesReply,
    SharesRequest,
)
from corral.schemas.subjects import api_subject, inbox_prefix, valid_token

R = TypeVar("R")

#: Seconds one API call may take before it fails (the cluster answers in milliseconds when healthy).
DEFAULT_TIMEOUT = 15.0
#: Where a deployment's authd listens (``corral authd``).
AUTH_SOCKET = "/run/corral/authd.sock"
#: A ticket this close to its expiry (seconds) is replaced before a new connection.
RENEW_S = 60.0


class Cluster(msgspec.Struct):
    """A cluster to call, and who we are on it."""

    url: str  # nats://host:port
    credentials: Credentials  # user and password (the URL in the file may differ from ``url``)
    timeout: float = DEFAULT_TIMEOUT  # seconds per call
    retry_s: float = RETRY_S  # seconds a call retries a refused connection or "no responders" (nats_retry)
    traceparent: str | None = None  # the caller's W3C trace context (TRACEPARENT), sent with each call
    auth_socket: str | None = None  # the authd the credentials came from (their password is a ticket)
    expires: float = 0.0  # when the ticket expires (Unix seconds), with ``auth_socket``
    local_state: str | None = None  # the local cluster's state directory the credentials came from

    def login(self) -> Credentials:
        """The credentials for a new connection: with authd's, a new ticket when this one is near its end."""
        if self.auth_socket is not None and self.expires - time.time() < RENEW_S:
            try:
                self.credentials, self.expires = authd_client.fetch(self.auth_socket)
            except authd_client.AuthdError as exc:
                raise CliError(str(exc)) from None
        return self.credentials

    @property
    def user(self) -> str:
        """The user the cluster knows us as (``--me``, the default ``sacct`` filter)."""
        return self.credentials.user

    def call(self, verb: str, request: msgspec.Struct, reply_type: type[R]) -> R:
        """Send ``request`` to the API verb and return its reply.

        Raises CliError with the cluster's message for an ``ApiError`` reply, and with the transport's
        message when the cluster cannot be reached or does not answer in time. A refused connection and
        "no responders" are tried again for ``retry_s`` seconds (``nats_retry``: safe for every verb).
        """
        try:
            reply = self.request(
                api_subject(verb, self.credentials.user),
                msgspec.json.encode(request),
                headers={"traceparent": self.traceparent} if self.traceparent else None,
            )
        except nats_request.RequestTimeout as exc:
            raise CallTimeout(str(exc)) from None
        except nats_request.NatsRequestError as exc:
            raise CliError(str(exc)) from None
        return decode_reply(reply.data, reply_type)

    def request(
        self, subject: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> nats_request.Reply:
        """One request on its own connection, retried as ``nats_retry`` says; raises the last
        ``NatsRequestError``."""
        user = self.credentials.user

        def attempt() -> nats_request.Reply:
            try:
                return nats_request.request(
                    self.url,
                    subject,
                    payload,
                    user=user,
                    password=self.login().password,
                    inbox_prefix=inbox_prefix(user),
                    headers=headers,
                    timeout=self.timeout,
                )
            except ServerUnreachable as exc:
                if self.local_state is not None:
                    from corral.cli import up_marker

                    if up_marker.is_down(self.local_state):
                        raise ClusterDown(
                            f"{exc}: the local cluster in {self.local_state} is not running; "
                            "start it with 'corral up'"
                        ) from None
                raise

        return retrying(attempt, self.retry_s)

    def history(self, request: HistoryRequest) -> HistoryReply:
        """The log entries of a job, a node or a user's jobs (``corral audit``); CliError if refused."""
        return self.call("history", request, HistoryReply)

    def jobs(self, request: JobsRequest) -> list[JobInfo]:
        """Every job matching a squeue request, by id: the ``jobs`` verb's pages (``every_page``)."""
        return every_page(lambda req: self.call("jobs", req, JobsReply), request)

    def nodes(self, request: NodesRequest) -> NodesReply:
        """Every node matching a sinfo request, by name, and every partition: the ``nodes`` verb's pages, each
        asked after the last node of the one before."""
        nodes: list[NodeInfo] = []
        while True:
            reply = self.call("nodes", request, NodesReply)
            nodes.extend(reply.nodes)
            if not reply.more or not reply.nodes:
                return msgspec.structs.replace(reply, nodes=nodes, more=False)
            request = msgspec.structs.replace(request, after_node=reply.nodes[-1].name)

    def shares(self, request: SharesRequest) -> SharesReply:
        """The fair-share tree's rows an sshare request asks for: the ``shares`` verb's pages, each asked from
        the row after those received."""
        rows: list[ShareInfo] = []
        while True:
            reply = self.call("shares", msgspec.structs.replace(request, start=len(rows)), SharesReply)
            rows.extend(reply.rows)
            if not reply.more or not reply.rows:
                return msgspec.structs.replace(reply, rows=rows, more=False)

    def priorities(self, request: PriorityRequest) -> PriorityReply:
        """Every pending job matching an sprio request, in queue order, and the weights: the ``priority``
        verb's pages (by id, as ``jobs`` reads squeue's), sorted by ``JobPriority.queue_key``."""
        rows: list[JobPriority] = []
        while True:
            reply = self.call("priority", request, PriorityReply)
            rows.extend(reply.jobs)
            if not reply.more or not reply.jobs:
                rows.sort(key=JobPriority.queue_key)
                return msgspec.structs.replace(reply, jobs=rows, more=False)
            request = msgspec.structs.replace(request, after_job_id=reply.jobs[-1].job_id)

    def acct(self, request: AcctRequest, every: bool = False) -> list[AcctJob]:
        """Up to ``request.limit`` accounting records matching a sacct request, by id: the ``acct`` verb's
        pages, as ``jobs`` reads squeue's. ``every``: every matching record, however many (sacct, as
        Slurm's, has no limit: it showed the first 10,000 of 20,000 jobs, silently); ``limit`` then only
        bounds each request."""
        out: list[AcctJob] = []
        while reply_jobs := (reply := self.call("acct", request, AcctReply)).jobs:
            out.extend(reply_jobs)
            if every:  # the next request as large: after a page the server cut, or one as long as allowed
                left, more = request.limit, reply.more or len(reply_jobs) >= request.limit
            else:
                left = request.limit - len(reply_jobs)
                more = reply.more and left > 0
            if not more:
                break
            request = msgspec.structs.replace(request, after_job_id=reply_jobs[-1].job_id, limit=left)
        return out


def every_page(ask: Callable[[JobsRequest], JobsReply], request: JobsRequest) -> list[JobInfo]:
    """Every job of the ``jobs`` verb's pages (``ask``: one call), by id: each page asked after the largest
    id the one before covers (its ``last_job_id``: a row of an array's tasks stands for ids past its own; an
    older scheduler's 0, its last job's), until a reply says there are no more."""
    out: list[JobInfo] = []
    while True:
        reply = ask(request)
        out.extend(reply.jobs)
        if not reply.more or not reply.jobs:
            return out
        after = reply.last_job_id or reply.jobs[-1].job_id
        request = msgspec.structs.replace(request, after_job_id=after)


class ClusterDown(nats_request.NatsRequestError):
    """The local cluster the credentials belong to is not running: no retry can reach it."""


class CallTimeout(CliError):
    """No reply in time: the request may or may not have been carried out."""


def decode_reply(data: bytes, reply_type: type[R]) -> R:
    """Decode ``reply_type | ApiError``; CliError for an ApiError or a reply of another shape."""
    union: Any = Union[reply_type, ApiError]  # noqa: UP007 (a runtime union of a type variable)
    try:
        decoded: object = msgspec.json.decode(data, type=union)
    except msgspec.DecodeError as exc:
        raise CliError(f"unexpected reply from the cluster: {exc}") from None
    if isinstance(decoded, ApiError):
        raise CliError(decoded.error)
    if not isinstance(decoded, reply_type):
        raise CliError(f"unexpected reply from the cluster: {type(decoded).__name__}")
    return decoded


def prepare_decoding() -> None:
    """Build msgspec's decoding information for the credentials and every API reply (each with ApiError, as
    ``decode_reply`` asks): msgspec builds a Struct's on its first decode, from its annotations (~0.1-0.2 ms a
    type here), and the command server does it once for every child it forks (``cmdserver``)."""
    from corral.schemas import api

    msgspec.json.Decoder(Credentials)
    for name in api.__all__:
        kind = getattr(api, name)
        if name.endswith("Reply") and isinstance(kind, type) and issubclass(kind, msgspec.Struct):
            msgspec.json.Decoder(Union[kind, ApiError])  # noqa: UP007 (the union decode_reply builds)


def find_cluster(environ: Mapping[str, str] | None = None) -> Cluster:
    """Locate the cluster and its credentials from the environment (see the module docstring).

    Raises CliError naming the file that is missing or unreadable and how to fix it.
    """
    env = os.environ if environ is None else environ
    remote_url = env.get("CORRAL_NATS_URL", "").strip()
    path_text = env.get("CORRAL_CREDENTIALS", "").strip()
    # os.path rather than pathlib, which costs a command ~7 ms to import
    state = os.path.expanduser(env.get("CORRAL_STATE_DIR") or "~/.corral")
    auth_socket: str | None = None
    expires = 0.0
    if path_text:
        path = os.path.expanduser(path_text)
    else:
        try:
            unix_user = getpass.getuser()
        except (KeyError, OSError):
            raise CliError("cannot tell who you are: set USER or LOGNAME") from None
        path = os.path.join(state, "credentials", f"{unix_user}.json")
    if path_text or (not remote_url and os.path.isfile(path)):
        if not os.path.isfile(path):
            raise CliError(
                f"no credentials file {path} (CORRAL_CREDENTIALS): set it to your credentials file"
            )
        try:
            credentials = read_credentials(path)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    else:
        auth_socket = _auth_socket(env, state)
        if auth_socket is None:
            raise CliError(
                f"no Corral cluster found (no {path}, no corral authd at {AUTH_SOCKET}): start one with "
                "'corral up', or set CORRAL_AUTH_SOCKET, or CORRAL_NATS_URL and CORRAL_CREDENTIALS"
            )
        try:
            credentials, expires = authd_client.fetch(auth_socket)
        except authd_client.AuthdError as exc:
            raise CliError(str(exc)) from None
    if not valid_token(credentials.user):
        source = path if auth_socket is None else f"corral authd's answer ({auth_socket})"
        raise CliError(f"the user name {credentials.user!r} in {source} cannot be used on the cluster")
    given = env.get("TRACEPARENT", "").strip()
    traceparent = given if parse_traceparent(given) is not None else None
    return Cluster(
        url=remote_url or credentials.url,
        credentials=credentials,
        traceparent=traceparent,
        auth_socket=auth_socket,
        expires=expires,
        local_state=state if not path_text and not remote_url and auth_socket is None else None,
    )


def _auth_socket(env: Mapping[str, str], state: str) -> str | None:
    """The authd socket to ask: ``CORRAL_AUTH_SOCKET``, else the local cluster's, else the deployment's."""
    named = env.get("CORRAL_AUTH_SOCKET", "").strip()
    if named:
        return named
    for candidate in (os.path.join(state, "authd.sock"), AUTH_SOCKET):
        if os.path.exists(candidate):
            return candidate
    return None
