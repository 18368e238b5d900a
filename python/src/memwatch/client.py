"""The trainer's side of memwatch's protocol (docs/protocol.md), over the daemon's control socket.

A `Client` attaches the current process (with its config file and profile), keeps the token, asks for
directives, acknowledges them, reports progress and what the run actually runs with, and answers a
checkpoint request. It never raises into the training loop because the daemon is down: it warns once
and the run trains on; it tries again after `retry_seconds`. A refusal (a bad config file at attach,
no attached job by its name, a wrong token) is a mistake to fix: `attach` raises `MemwatchError`, and
every integration calls it before its first step; later refusals are logged once each.

Under `memwatch launch` the job is attached before its first instruction. Launch marks its job with
`MEMWATCH_LAUNCHED`, the pid of the `memwatch launch` process; a client whose process descends from
that pid (the job's root, a torchrun rank, a DataLoader worker) takes the job as attached, finds its
token file, socket and URL in `MEMWATCH_TOKEN_FILE`, `MEMWATCH_SOCKET` and `MEMWATCH_URL`, and does not
attach again: `attach` only checks once that the daemon knows the job and takes this client for it.
`MEMWATCH_JOB` names the job, launched or not: set by hand, it never means "already attached".

A container that `memwatch launch -- docker run …` started (or podman's) cannot see launch across its
pid namespace: launch marks it `MEMWATCH_LAUNCHED=container` and attaches the container's process
from the host once the engine has started it, so a client there takes the job as attached and waits
(up to `CONTAINER_ATTACH_SECONDS`) for the daemon to know it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import _proc

log = logging.getLogger("memwatch")

DEFAULT_SOCKET = "/run/memwatch/control.sock"
DEFAULT_URL = "http://127.0.0.1:9300"

# The knob names memwatch uses in directives and reports.
MICRO_BATCH = "micro_batch"
ACCUMULATION = "accumulation"
WORKERS = "workers"
PIN_MEMORY = "pin_memory"

LAUNCHED = "MEMWATCH_LAUNCHED"
"""The variable `memwatch launch` sets in its job's environment: its own pid."""

# The refusals that say this client's job is not what it takes it for: a mistake to fix, not an outage.
_WRONG_JOB = ("not_found", "forbidden")
CONTAINER_ATTACH_SECONDS = 30.0
"""How long a client in a container launch started waits for launch to attach it from the host."""
_HTTP_KINDS = {400: "invalid", 403: "forbidden", 404: "not_found", 409: "conflict", 429: "limit", 503: "unavailable"}


class MemwatchError(RuntimeError):
    """memwatch refused a request: a mistake to fix (a bad config file, a wrong token or job name),
    not an outage."""


@dataclass(frozen=True)
class Directives:
    """What the daemon answered: the changes newer than the generation the client has applied."""

    generation: int
    """The newest generation staged."""
    changes: List[Dict[str, Any]]
    """The directives newer than the client's generation, oldest first (each with `generation`,
    `changes` as `{"knob", "path", "old", "new"}`, `reason` and, when set, `urgent`)."""
    knobs: Dict[str, Any]
    """The knobs as the config file holds them now (`micro_batch`, `accumulation`, `workers`,
    `pin_memory`, …), with every staged change in them."""
    checkpoint_requested: bool = False
    """memwatch asks for a checkpoint now; it stops the job cleanly after the answer."""

    @property
    def pending(self) -> bool:
        return bool(self.changes)

    @property
    def urgent(self) -> bool:
        """Apply at the next step, not the next epoch: the job runs on emergency room."""
        return any(d.get("urgent") for d in self.changes)

    def new_values(self) -> Dict[str, Any]:
        """The newest value of each knob the pending directives change."""
        out: Dict[str, Any] = {}
        for d in self.changes:
            for c in d.get("changes", []):
                out[c["knob"]] = c["new"]
        return out


@dataclass
class _Outage:
    warned: bool = False
    retry_at: float = 0.0
    refusals: set = field(default_factory=set)


class Client:
    """One training process's link to the memwatch daemon.

    name: the job's name [default: `MEMWATCH_JOB`, else the script's name].
    config_file, profile, keys: the training config memwatch may rewrite and where its knobs are
        (profiles `hf`, `deepspeed`, `accelerate`, `generic` with `keys` such as
        `"batch=train.micro_batch"`); without a config file the job is attached to be watched and
        paused only.
    socket_path, url: where the daemon is [default: `MEMWATCH_SOCKET`/`MEMWATCH_URL`, else
        /run/memwatch/control.sock and http://127.0.0.1:9300]. The socket is used when it exists;
        else the HTTP API with the token.
    poll_seconds: `directives()` asks the daemon at most this often unless forced.
    """

    def __init__(
        self,
        name: Optional[str] = None,
        *,
        config_file: Optional[str] = None,
        profile: Optional[str] = None,
        keys: Sequence[str] = (),
        pid: Optional[int] = None,
        socket_path: Optional[str] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 2.0,
        retry_seconds: float = 30.0,
        poll_seconds: float = 0.5,
    ) -> None:
        env = os.environ
        self.launched = launched_by_memwatch(env)
        """`memwatch launch` started this process's tree and attached the job (`MEMWATCH_LAUNCHED`
        holds the pid of a `memwatch launch` this process descends from): the client does not
        attach it again."""
        self.name = name or env.get("MEMWATCH_JOB") or _default_name()
        self.config_file = os.path.abspath(config_file) if config_file else None
        self.profile = profile or ("generic" if keys else None)
        self.keys = list(keys)
        self.pid = pid or os.getpid()
        self.socket_path = socket_path or env.get("MEMWATCH_SOCKET") or DEFAULT_SOCKET
        self.url = (url or env.get("MEMWATCH_URL") or DEFAULT_URL).rstrip("/")
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.poll_seconds = poll_seconds
        self.token = token or _read_token(env.get("MEMWATCH_TOKEN_FILE"))
        self.generation = 0
        """The newest generation this run has applied (or declined)."""
        self.resumed = env.get("MEMWATCH_RESUME") == "1"
        """`memwatch launch` relaunched this run after memwatch stopped the previous one: resume from
        the last checkpoint."""
        self.attached = self.launched
        self._confirmed = False
        """The daemon has taken this client for its job (attached it, or answered it as the job's)."""
        self._outage = _Outage()
        self._last_poll = float("-inf")
        self._last: Optional[Directives] = None

    # --- attaching -----------------------------------------------------------------------------

    def attach(self) -> bool:
        """Attaches this process (idempotent); when it is attached already (by `memwatch launch`),
        checks once that the daemon knows the job and takes this client for it. False when the
        daemon cannot be reached (warned once); raises `MemwatchError` when it refuses: a bad config
        file, no attached job by this name, a wrong token."""
        if self._confirmed:
            return True
        if self.attached:
            return self._check_attached()
        request: Dict[str, Any] = {"cmd": "attach", "pid": self.pid, "name": self.name}
        if self.pid == os.getpid():
            # This process itself: in a container its pid is its namespace's, and the daemon takes
            # the one that counts from the socket (this pid only has to agree with it).
            request["self"] = True
        if self.config_file:
            request.update(config_file=self.config_file, profile=self.profile or "generic", keys=self.keys)
        reply = self._socket(request)
        if reply is not None and not reply.get("ok") and "unknown field `self`" in str(reply.get("error")):
            # A daemon older than the field: attached by the pid as this process sees it.
            del request["self"]
            reply = self._socket(request)
        if reply is None:
            return False
        if not reply.get("ok"):
            raise MemwatchError(f"memwatch refused to attach {self.name} (pid {self.pid}): {reply.get('error')}")
        self.token = reply.get("token") or self.token
        job = reply.get("job") or {}
        self.name = job.get("name", self.name)
        self.attached = self._confirmed = True
        log.info("memwatch: attached %s (pid %d)", self.name, self.pid)
        return True

    def _check_attached(self) -> bool:
        """Asks for the directives once, as the job's trainer: a job the daemon does not know, or a
        token it does not take, raises `MemwatchError` with what to fix."""
        path = f"directives?since={self.generation}"
        deadline = time.monotonic() + CONTAINER_ATTACH_SECONDS
        while True:
            reply = self._request({"cmd": "directives", "since": self.generation}, "GET", path)
            # In a container, launch attaches the job from the host just after the engine starts it.
            if not (
                reply is not None
                and reply.get("kind") == "not_found"
                and os.environ.get(LAUNCHED) == "container"
                and time.monotonic() < deadline
            ):
                break
            time.sleep(0.1)
        if reply is None:
            return False
        if reply.get("ok") is False:
            kind, error = reply.get("kind"), reply.get("error")
            if kind == "unavailable":  # shutting down: an outage
                self._down(str(error))
                return False
            if kind in _WRONG_JOB:
                raise MemwatchError(self._wrong_job(kind, error))
            if kind == "invalid" and self.config_file:
                raise MemwatchError(
                    f"memwatch has job {self.name!r} attached without a config file ({error}), so "
                    f"{self.config_file} is never rewritten: give it to `memwatch launch --config-file` "
                    "(with --profile or --key), or leave config_file out here"
                )
        else:
            self._last_poll = time.monotonic()
            self._last = self._directives(reply)
        self._confirmed = True
        return True

    def _wrong_job(self, kind: str, error: Any) -> str:
        """A refusal that says this client's job is not what it takes it for, and what to fix."""
        by = (
            f"{LAUNCHED} says `memwatch launch` attached this run, so this client does not attach it "
            "again"
            if self.launched
            else "this client was told the job is attached already, so it does not attach it"
        )
        if kind == "not_found":
            return (
                f"memwatch has no attached job named {self.name!r} ({error}); {by}. Give the client "
                "the name the job was attached under (launch's --name, which it sets in MEMWATCH_JOB), "
                "or let the client attach the job itself"
            )
        return (
            f"memwatch refused this client for job {self.name!r} ({error}); {by}. Give it the job's "
            "token (the file in MEMWATCH_TOKEN_FILE, from `memwatch launch --config-file` or `memwatch "
            "attach --token-file`, or token=), or run it as the job's owner on the control socket"
        )

    # --- the protocol --------------------------------------------------------------------------

    def directives(self, force: bool = False) -> Optional[Directives]:
        """The directives newer than `generation`, or None when the daemon is down. Asks the daemon
        at most every `poll_seconds` unless `force`; in between, returns the last answer."""
        now = time.monotonic()
        if not force and now - self._last_poll < self.poll_seconds:
            return self._last
        self._last_poll = now
        reply = self._call({"cmd": "directives", "since": self.generation}, "GET", f"directives?since={self.generation}")
        self._last = None if reply is None else self._directives(reply)
        return self._last

    @staticmethod
    def _directives(reply: Dict[str, Any]) -> Directives:
        d = reply.get("directives", reply)
        checkpoint = d.get("checkpoint") or {}
        return Directives(
            generation=int(d.get("generation", 0)),
            changes=[x for x in d.get("directives", []) if not x.get("declined")],
            knobs=dict(d.get("knobs", {})),
            checkpoint_requested=bool(checkpoint) and not checkpoint.get("saved_at_ms"),
        )

    def ack(self, generation: int, epoch: int) -> bool:
        """Everything up to `generation` is applied, at `epoch`."""
        ok = self._call({"cmd": "ack", "generation": generation, "epoch": epoch}, "POST", "ack") is not None
        if ok:
            self._applied(generation)
        return ok

    def cannot_apply(self, generation: int, reason: str) -> bool:
        """The changes up to `generation` cannot be applied in this run, and why: memwatch stops
        waiting for them (they stay in the file for the next start)."""
        body = {"cmd": "ack", "generation": generation, "cannot_apply": reason[:500] or "no reason given"}
        ok = self._call(body, "POST", "ack") is not None
        if ok:
            self._applied(generation)
        return ok

    def checkpoint_saved(self) -> bool:
        """The checkpoint memwatch asked for is saved: memwatch may stop the job now."""
        return self._call({"cmd": "ack", "checkpoint": True}, "POST", "ack") is not None

    def progress(
        self,
        epoch: int,
        step: int,
        loss: Optional[float] = None,
        samples_per_second: Optional[float] = None,
        running: Optional[Mapping[str, Any]] = None,
    ) -> bool:
        """Reports progress and, in `running`, what the run actually runs with now (live DataLoader
        workers, micro-batch, accumulation, pin_memory): memwatch checks it against the changes it
        asked for."""
        p: Dict[str, Any] = {"epoch": int(epoch), "step": int(step)}
        if loss is not None:
            p["loss"] = float(loss)
        if samples_per_second is not None:
            p["samples_per_second"] = float(samples_per_second)
        if running:
            p["running"] = {k: v for k, v in running.items() if v is not None}
        return self._call({"cmd": "progress", "progress": p}, "POST", "progress", body=p) is not None

    def oom(self, report: Mapping[str, Any]) -> bool:
        """Reports an out-of-memory error inside a step (docs/protocol.md, "CUDA OOM reports"):
        `epoch`, `step`, `phase`, `micro_batch_before`, `recovered` and, when recovered,
        `micro_batch_after` and `accumulation_after`; what CUDA said where known. memwatch records
        it, counts it, and stages the smaller micro-batch in the config file so a relaunch starts
        from it."""
        body = dict(report)
        return self._call({"cmd": "oom", "oom": body}, "POST", "oom", body=body) is not None

    def _applied(self, generation: int) -> None:
        self.generation = max(self.generation, generation)
        if self._last is not None:
            left = [d for d in self._last.changes if d.get("generation", 0) > self.generation]
            self._last = Directives(self._last.generation, left, self._last.knobs, self._last.checkpoint_requested)

    # --- transport -----------------------------------------------------------------------------

    def _call(
        self, request: Dict[str, Any], method: str, path: str, body: Optional[Dict[str, Any]] = None
    ) -> Optional[Dict[str, Any]]:
        """One trainer request: on the control socket when there is one, else over HTTP with the
        token. None when the daemon is down (then not asked again for `retry_seconds`) or refused
        (logged)."""
        if time.monotonic() < self._outage.retry_at:
            return None
        if not self.attached:
            try:
                if not self.attach():
                    return None
            except MemwatchError as e:
                self._refused(str(e))
                self._outage.retry_at = time.monotonic() + self.retry_seconds
                return None
        reply = self._request(request, method, path, body)
        if reply is None:
            return None
        if reply.get("kind") not in (*_WRONG_JOB, "unavailable"):
            self._confirmed = True
        if reply.get("ok") is False:
            self._refused(f"memwatch refused {request.get('cmd')} for {self.name}: {reply.get('error')}")
            return None
        self._outage = _Outage(refusals=self._outage.refusals)
        return reply

    def _request(
        self, request: Dict[str, Any], method: str, path: str, body: Optional[Dict[str, Any]] = None
    ) -> Optional[Dict[str, Any]]:
        """Sends a trainer request for this job, as it is: the daemon's answer (a refusal with its
        `kind`), or None when the daemon is down."""
        if os.path.exists(self.socket_path):
            request = dict(request, target=self.name)
            if self.token:
                request["token"] = self.token
            return self._socket(request)
        if body is None and method == "POST":
            body = {k: v for k, v in request.items() if k != "cmd"}
        return self._http(method, path, body)

    def _socket(self, request: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout)
                s.connect(self.socket_path)
                s.sendall(json.dumps(request).encode() + b"\n")
                line = s.makefile("rb").readline()
            if not line:
                raise OSError("the daemon closed the connection")
            return json.loads(line)
        except (OSError, ValueError) as e:
            self._down(f"{self.socket_path}: {e}")
            return None

    def _http(self, method: str, path: str, body: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        req = urllib.request.Request(
            f"{self.url}/api/v1/jobs/{self.name}/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token or ''}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                v = json.load(r)
                return v if "ok" in v else {"ok": True, "directives": v}
        except urllib.error.HTTPError as e:
            error = f"{e.code} {e.read().decode(errors='replace')}"
            return {"ok": False, "error": error, "kind": _HTTP_KINDS.get(e.code, "failed")}
        except (OSError, ValueError) as e:
            self._down(f"{self.url}: {e}")
            return None

    def _down(self, why: str) -> None:
        if not self._outage.warned:
            log.warning("memwatch: the daemon cannot be reached (%s); training goes on without it", why)
            self._outage.warned = True
        self._outage.retry_at = time.monotonic() + self.retry_seconds

    def _refused(self, message: str) -> None:
        if message not in self._outage.refusals:
            self._outage.refusals.add(message)
            log.error("%s", message)


def launched_by_memwatch(env: Mapping[str, str]) -> bool:
    """Whether `memwatch launch` started this process's tree: `MEMWATCH_LAUNCHED` holds the pid of
    the `memwatch launch` process, and this process descends from it; or it is `container`, set by
    launch in the container it started through an engine's `run`."""
    marker = env.get(LAUNCHED, "").strip()
    if marker == "container":
        return True
    return marker.isdigit() and _proc.descends_from(int(marker))


def _default_name() -> str:
    base = os.path.basename(sys.argv[0] or "") or "train"
    return os.path.splitext(base)[0] or "train"


def _read_token(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError as e:
        log.warning("memwatch: cannot read the token file %s: %s", path, e)
        return None
