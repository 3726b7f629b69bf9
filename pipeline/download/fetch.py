"""Fetching one URL politely and safely (stdlib `http.client`, one connection per request).

Per request: connect and read timeouts and a total deadline; a byte cap enforced while
streaming; manual redirects (each hop re-checked, a limit, loops detected); retries with
exponential backoff for transient failures (timeouts, resets, 429/5xx, honoring
Retry-After) and none for other 4xx; a per-host concurrency cap; a user-agent token;
``X-Robots-Tag`` opt-outs. Only http/https. Host names are resolved here and the
connection goes to the checked address (no second lookup to race), and by default
loopback, private, link-local, multicast and reserved addresses are refused before any
connection is made.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import random
import socket
import ssl
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional
from urllib.parse import urljoin, urlsplit

from pipeline import __version__

CHUNK = 1 << 16


@dataclass(frozen=True)
class FetchConfig:
    connect_timeout: float = 10.0
    read_timeout: float = 10.0  # per socket operation
    deadline: float = 30.0  # whole request, redirects included
    max_bytes: int = 32 << 20
    max_redirects: int = 5
    retries: int = 2  # extra attempts for transient failures
    backoff: float = 0.5  # first backoff; doubles per attempt, with jitter
    max_retry_wait: float = 10.0  # cap on Retry-After / backoff sleeps
    per_host: int = 16  # concurrent requests to one host, per worker process
    user_agent_token: str = ""
    disallowed_directives: tuple[str, ...] = ("noai", "noimageai")
    allow_private_network: bool = False
    allowed_networks: tuple[str, ...] = ()  # CIDRs allowed even when private networks are refused

    @property
    def user_agent(self) -> str:
        token = f"; {self.user_agent_token}" if self.user_agent_token else ""
        return f"vlprep/{__version__} (research image downloader{token})"


class FetchError(Exception):
    """A failed fetch: `kind` names the reason (counted in stats), `transient` says
    whether a later retry may succeed."""

    def __init__(self, kind: str, detail: str, transient: bool = False, retry_after: Optional[float] = None):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.transient, self.retry_after = kind, detail, transient, retry_after


@dataclass(frozen=True)
class Fetched:
    data: bytes
    final_url: str
    status: int
    content_type: str
    attempts: int


class HostLimiter:
    """At most `limit` concurrent requests per host within this process."""

    def __init__(self, limit: int):
        self._limit = limit
        self._lock = threading.Lock()
        self._sems: dict[str, threading.Semaphore] = {}

    @contextmanager
    def slot(self, host: str) -> Iterator[None]:
        with self._lock:
            sem = self._sems.setdefault(host, threading.Semaphore(self._limit))
        with sem:
            yield


@functools.lru_cache(maxsize=4096)
def _address_allowed(ip: str, allow_private: bool, allowed_networks: tuple[str, ...]) -> bool:
    addr = ipaddress.ip_address(ip)
    if allow_private or addr.is_global and not addr.is_multicast:
        return True
    return any(addr in ipaddress.ip_network(net, strict=False) for net in allowed_networks)


def _check_address(ip: str, cfg: FetchConfig, host: str) -> None:
    if not _address_allowed(ip, cfg.allow_private_network, cfg.allowed_networks):
        raise FetchError("private address", f"{host} resolves to {ip}, which is not a public address")


def _resolve(host: str, port: int, cfg: FetchConfig, deadline: float) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise FetchError("dns", f"{host}: {err.strerror}", transient=True) from err
    if time.monotonic() > deadline:
        raise FetchError("deadline", "name resolution exceeded the deadline", transient=True)
    addresses = [info[4][0] for info in infos]
    for ip in addresses:  # every address must pass: the resolver picks the order
        _check_address(ip, cfg, host)
    return addresses[0]


def _robots_disallowed(values: list[str], cfg: FetchConfig) -> Optional[str]:
    """The first disallowed X-Robots-Tag directive aimed at every agent or at us
    (``noai``, or ``vlprep: noai`` / ``<our token>: noai``); None if there is none."""
    ours = {"vlprep", cfg.user_agent_token.lower()} - {""}
    for value in values:
        agent, sep, rest = value.partition(":")
        if sep and agent.strip().lower() not in ours:
            continue  # aimed at another crawler
        for directive in (rest if sep else value).split(","):
            if directive.strip().lower() in cfg.disallowed_directives:
                return directive.strip().lower()
    return None


def _request_once(url: str, cfg: FetchConfig, limiter: HostLimiter, attempt: int) -> Fetched:
    deadline = time.monotonic() + cfg.deadline
    seen = {url}
    for _hop in range(cfg.max_redirects + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise FetchError("unsupported scheme", f"{parts.scheme or 'no scheme'} in {url[:200]}")
        if not parts.hostname:
            raise FetchError("bad url", url[:200])
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as err:
            raise FetchError("bad url", str(err)) from err
        ip = _resolve(parts.hostname, port, cfg, deadline)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        with limiter.slot(parts.hostname):
            status, headers, body = _exchange(parts.scheme, parts.hostname, ip, port, path, cfg, deadline)
        if status in (301, 302, 303, 307, 308):
            location = headers.get("location")
            if not location:
                raise FetchError("bad redirect", f"HTTP {status} without Location")
            url = urljoin(url, location)
            if url in seen:
                raise FetchError("redirect loop", f"back to {url[:200]}")
            seen.add(url)
            continue
        if status == 429 or 500 <= status < 600:
            raise FetchError(f"http {status}", "server busy or failing", transient=True,
                             retry_after=_retry_after(headers.get("retry-after")))
        if status >= 400:
            raise FetchError(f"http {status}", f"{url[:200]}")
        if status != 200:
            raise FetchError(f"http {status}", "unexpected status")
        directive = _robots_disallowed(headers.get_all("x-robots-tag") or [], cfg)
        if directive:
            raise FetchError("opted out", f"X-Robots-Tag: {directive}")
        return Fetched(body, url, status, headers.get("content-type", ""), attempt)
    raise FetchError("too many redirects", f"more than {cfg.max_redirects}")


def _exchange(scheme: str, host: str, ip: str, port: int, path: str, cfg: FetchConfig, deadline: float):
    """One GET over a connection to the already-checked `ip`; returns (status, headers,
    body); the body is read only for 200 responses, within the byte cap and deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise FetchError("deadline", "exceeded before connecting", transient=True)
    try:
        sock = socket.create_connection((ip, port), timeout=min(cfg.connect_timeout, remaining))
    except socket.timeout as err:
        raise FetchError("timeout", f"connecting to {host}", transient=True) from err
    except OSError as err:
        raise FetchError("connection", f"{host}: {err.strerror or err}", transient=True) from err
    conn_cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(host, port, timeout=cfg.read_timeout)
    try:
        if scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        conn.sock = sock
        sock.settimeout(min(cfg.read_timeout, max(0.01, deadline - time.monotonic())))
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.putheader("User-Agent", cfg.user_agent)
        conn.putheader("Accept", "image/*,*/*;q=0.8")
        conn.putheader("Connection", "close")
        conn.endheaders()
        resp = conn.getresponse()
        if resp.status != 200:
            return resp.status, resp.headers, b""
        length = resp.getheader("content-length")
        if length and length.isdigit() and int(length) > cfg.max_bytes:
            raise FetchError("too large", f"Content-Length {int(length):,} > {cfg.max_bytes:,} bytes")
        chunks, size = [], 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FetchError("deadline", f"body not complete after {cfg.deadline:g} s ({size:,} bytes)", transient=True)
            sock.settimeout(min(cfg.read_timeout, remaining))
            chunk = resp.read1(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > cfg.max_bytes:
                raise FetchError("too large", f"more than {cfg.max_bytes:,} bytes")
            chunks.append(chunk)
        return resp.status, resp.headers, b"".join(chunks)
    except FetchError:
        raise
    except socket.timeout as err:
        if time.monotonic() >= deadline - 0.05:
            raise FetchError("deadline", f"not complete after {cfg.deadline:g} s", transient=True) from err
        raise FetchError("timeout", f"no data from {host} for {cfg.read_timeout:g} s", transient=True) from err
    except ssl.SSLError as err:
        raise FetchError("tls", f"{host}: {err.reason or err}") from err
    except (http.client.HTTPException, OSError) as err:
        raise FetchError("connection", f"{host}: {type(err).__name__}: {err}", transient=True) from err
    finally:
        conn.close()


def _retry_after(value: Optional[str]) -> Optional[float]:
    if value and value.strip().isdigit():
        return float(value.strip())
    return None


def fetch(url: str, cfg: FetchConfig, limiter: HostLimiter) -> Fetched:
    """GET `url`, retrying transient failures; raises `FetchError` with the last reason."""
    for attempt in range(cfg.retries + 1):
        try:
            return _request_once(url, cfg, limiter, attempt + 1)
        except FetchError as err:
            if not err.transient or attempt == cfg.retries:
                raise
            wait = err.retry_after if err.retry_after is not None else cfg.backoff * 2**attempt * random.uniform(0.5, 1.5)
            time.sleep(min(wait, cfg.max_retry_wait))
    raise AssertionError("unreachable")
