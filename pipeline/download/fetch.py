"""Fetching one URL politely and safely (stdlib `http.client`, one connection per request).

Per request: connect and read timeouts and a total deadline; a byte cap enforced while
streaming; manual redirects (each hop re-checked, a limit, loops detected); retries with
exponential backoff for transient failures (timeouts, resets, 429/5xx, honoring
Retry-After) and none for other 4xx; a per-host concurrency cap; a user-agent token;
``X-Robots-Tag`` opt-outs. Only http/https. Every URL (and every redirect target) is
checked and normalized first (`parse_url`): a URL no request can be made for is an
"invalid url", non-ASCII host names are IDNA-encoded and non-ASCII paths percent-encoded
as browsers do. Host names are resolved here and the connection goes to the checked
address (no second lookup to race), and by default loopback, private, link-local,
multicast and reserved addresses, also when embedded in an IPv6 transition address, are
refused before any connection is made. Credentials in a URL are never sent and never
written (`redact_url`). `FetchConfig` holds these settings (validated in itself), and how
many fetches one shard task runs at once (`threads`).
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import os
import random
import re
import socket
import ssl
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Union
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

from pipeline import __version__
from pipeline.config import Config, at_least
from pipeline.errors import ConfigError

CHUNK = 1 << 16
_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_HOST_NAME = re.compile(r"[a-z0-9_.-]+")  # after IDNA encoding
_PRINTABLE_ASCII = "".join(chr(c) for c in range(0x21, 0x7F))  # kept as they are by percent-encoding
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix: IPv4 in the last 32 bits
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215 local-use prefix: never public
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated IPv4-compatible addresses


@dataclass(frozen=True)
class FetchConfig(Config):
    connect_timeout: float = 10.0
    read_timeout: float = 10.0  # per socket operation
    deadline: float = 30.0  # whole request, redirects included
    max_bytes: int = 32 << 20
    max_redirects: int = 5
    retries: int = 2  # extra attempts for transient failures
    backoff: float = 0.5  # first backoff; doubles per attempt, with jitter
    max_retry_wait: float = 10.0  # cap on Retry-After / backoff sleeps
    per_host: int = 16  # concurrent requests to one host, per worker process
    threads: int = 16  # fetch threads inside each shard task (docs/benchmarks.md ran 16)
    user_agent_token: str = ""
    disallowed_directives: tuple[str, ...] = ("noai", "noimageai")  # X-Robots-Tag opt-outs (lower case)
    allow_private_network: bool = False
    allowed_networks: tuple[str, ...] = ()  # CIDRs allowed even when private networks are refused

    def __post_init__(self) -> None:
        at_least(
            self,
            {
                "connect_timeout": 0.01,
                "read_timeout": 0.01,
                "deadline": 0.01,
                "max_bytes": 1,
                "max_redirects": 0,
                "retries": 0,
                "backoff": 0,
                "max_retry_wait": 0,
                "per_host": 1,
                "threads": 1,
            },
        )
        directives = tuple(d.strip().lower() for d in self.disallowed_directives if d.strip())
        object.__setattr__(self, "disallowed_directives", directives)
        canonical = []
        for net in self.allowed_networks:
            try:
                canonical.append(str(ipaddress.ip_network(net.strip(), strict=False)))
            except ValueError as err:
                raise ConfigError(f"--allow-network {net!r} is not a network (CIDR such as 10.0.0.0/8): {err}") from err
        object.__setattr__(self, "allowed_networks", tuple(canonical))

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


def _embedded_ipv4(addr: Union[ipaddress.IPv4Address, ipaddress.IPv6Address]) -> Optional[ipaddress.IPv4Address]:
    """The IPv4 address an IPv6 transition address leads to: IPv4-mapped (::ffff:0:0/96),
    IPv4-compatible (::/96), NAT64 (64:ff9b::/96) or 6to4 (2002::/16); None otherwise."""
    if addr.version != 6:
        return None
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64 or addr in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


@functools.lru_cache(maxsize=4096)
def _address_allowed(ip: str, allow_private: bool, allowed_networks: tuple[str, ...]) -> bool:
    """Whether a connection to `ip` is allowed: a public address (not multicast), or one in
    `allowed_networks`. An IPv6 address embedding an IPv4 one is judged by that IPv4 address."""
    if allow_private:
        return True
    addr = ipaddress.ip_address(ip)
    if any(addr in ipaddress.ip_network(net, strict=False) for net in allowed_networks):
        return True
    embedded = _embedded_ipv4(addr)
    if embedded is not None:
        return _address_allowed(str(embedded), False, allowed_networks)
    return addr.is_global and not addr.is_multicast and addr not in _NAT64_LOCAL


def _check_address(ip: str, cfg: FetchConfig, host: str) -> None:
    if not _address_allowed(ip, cfg.allow_private_network, cfg.allowed_networks):
        raise FetchError("private address", f"{host} resolves to {ip}, which is not a public address")


def redact_url(url: str) -> str:
    """`url` without the ``user:password@`` part (for anything written or logged)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url  # not a URL we could request, and no netloc to strip credentials from
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _short(url: str) -> str:
    return redact_url(url)[:200]


def _percent_encode(text: Union[str, bytes]) -> str:
    """Percent-encode (UTF-8 for text) everything but printable ASCII, which is kept as is
    (an IRI becomes a URI the way browsers do it)."""
    return quote(text, safe=_PRINTABLE_ASCII)


@dataclass(frozen=True)
class Target:
    """What one request goes to: scheme, ASCII host (IDNA-encoded), port, request target."""

    scheme: str
    host: str
    port: int
    target: str  # path and query, ASCII


def parse_url(url: str) -> Target:
    """Check and normalize a URL; raises `FetchError` "invalid url" (or "unsupported
    scheme") for one no request can be made for: whitespace or control characters, an
    unbalanced bracket, a bad port, no host, a host name with an empty or over-long label or
    characters no host name has. Non-ASCII host names are IDNA-encoded; non-ASCII path and
    query characters are percent-encoded as UTF-8; credentials and fragment are dropped."""
    if _SPACE_OR_CONTROL.search(url):
        raise FetchError("invalid url", f"space or control character in {_short(url)!r}")
    try:
        parts = urlsplit(url)
        port, host = parts.port, parts.hostname
    except ValueError as err:  # unbalanced brackets, a port out of range or not a number
        raise FetchError("invalid url", f"{err}: {_short(url)!r}") from err
    if parts.scheme not in ("http", "https"):
        raise FetchError("unsupported scheme", f"{parts.scheme or 'no scheme'} in {_short(url)}")
    if not host:
        raise FetchError("invalid url", f"no host in {_short(url)!r}")
    if "]" in parts.netloc and parts.netloc.rpartition("]")[2][:1] not in ("", ":"):  # "[::1]x"
        raise FetchError("invalid url", f"text after ']' in {_short(url)!r}")
    if port == 0:
        raise FetchError("invalid url", f"port 0 in {_short(url)!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:  # a name, not an address literal
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as err:
            raise FetchError("invalid url", f"host {host!r}: {err}") from err
        if not _HOST_NAME.fullmatch(host):
            raise FetchError("invalid url", f"host {host!r} is not a host name")
    try:
        target = _percent_encode((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    except UnicodeEncodeError as err:  # e.g. a lone surrogate from a JSON escape
        raise FetchError("invalid url", f"{err.reason} in {_short(url)!r}") from err
    return Target(parts.scheme, host, port if port is not None else (443 if parts.scheme == "https" else 80), target)


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
        to = parse_url(url)
        ip = _resolve(to.host, to.port, cfg, deadline)
        with limiter.slot(to.host):
            status, headers, body = _exchange(to.scheme, to.host, ip, to.port, to.target, cfg, deadline)
        if status in (301, 302, 303, 307, 308):
            location = headers.get("location")
            if not location:
                raise FetchError("bad redirect", f"HTTP {status} without Location")
            try:  # the header's raw bytes (http.client decodes them as latin-1), percent-encoded
                url = urljoin(url, _percent_encode(location.encode("latin-1")))
            except (ValueError, UnicodeEncodeError) as err:
                raise FetchError("bad redirect", f"Location {location[:200]!r}: {err}") from err
            if url in seen:
                raise FetchError("redirect loop", f"back to {_short(url)}")
            seen.add(url)
            continue
        if status == 429 or 500 <= status < 600:
            raise FetchError(
                f"http {status}",
                "server busy or failing",
                transient=True,
                retry_after=_retry_after(headers.get("retry-after")),
            )
        if status >= 400:
            raise FetchError(f"http {status}", _short(url))
        if status != 200:
            raise FetchError(f"http {status}", "unexpected status")
        directive = _robots_disallowed(headers.get_all("x-robots-tag") or [], cfg)
        if directive:
            raise FetchError("opted out", f"X-Robots-Tag: {directive}")
        return Fetched(body, redact_url(url), status, headers.get("content-type", ""), attempt)
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
                raise FetchError(
                    "deadline", f"body not complete after {cfg.deadline:g} s ({size:,} bytes)", transient=True
                )
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


def read_local(path: str, max_bytes: int) -> Fetched:
    """A local image file read under the same size cap as a download; `FetchError` with the
    same reason names (``file not found``, ``file error``, ``too large``)."""
    try:
        # Non-blocking: opening a FIFO for reading would wait for a writer for ever; it is
        # refused below, as every file that is not a regular one (a device, a socket).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as err:
        raise FetchError("file not found", path) from err
    except OSError as err:
        raise FetchError("file error", f"{path}: {err.strerror}") from err
    except ValueError as err:  # a NUL byte in the path
        raise FetchError("file error", f"{path!r}: {err}") from err
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise FetchError("file error", f"{path}: a folder, not a file")
        if not stat.S_ISREG(mode):
            raise FetchError("file error", f"{path}: not a regular file (a pipe, a device or a socket)")
        os.set_blocking(fd, True)
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as err:
        raise FetchError("file error", f"{path}: {err.strerror}") from err
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FetchError("too large", f"{path} is larger than {max_bytes:,} bytes")
    return Fetched(data, path, 0, "", 1)


def fetch(url: str, cfg: FetchConfig, limiter: HostLimiter) -> Fetched:
    """GET `url`, retrying transient failures; raises `FetchError` with the last reason."""
    for attempt in range(cfg.retries + 1):
        try:
            return _request_once(url, cfg, limiter, attempt + 1)
        except FetchError as err:
            if not err.transient or attempt == cfg.retries:
                raise
            wait = (
                err.retry_after if err.retry_after is not None else cfg.backoff * 2**attempt * random.uniform(0.5, 1.5)
            )
            time.sleep(min(wait, cfg.max_retry_wait))
    raise AssertionError("unreachable")
