import threading
import time

import pytest

from pipeline.download.fetch import FetchConfig, FetchError, HostLimiter, fetch

LOCAL = FetchConfig(
    allowed_networks=("127.0.0.0/8",),
    deadline=3.0,
    read_timeout=2.0,
    connect_timeout=2.0,
    max_bytes=1 << 20,
    retries=1,
    backoff=0.05,
)


def get(server, path, cfg=LOCAL):
    return fetch(server.url(path), cfg, HostLimiter(cfg.per_host))


def failure(server, path, cfg=LOCAL) -> FetchError:
    with pytest.raises(FetchError) as info:
        get(server, path, cfg)
    return info.value


def test_good_image_and_redirect(server):
    got = get(server, "/img/rgb.jpg")
    assert got.data == server.corpus["rgb.jpg"][0] and got.status == 200 and got.attempts == 1
    got = get(server, "/redirect-ok")
    assert got.data == server.corpus["rgb.png"][0] and got.final_url.endswith("/img/rgb.png")


@pytest.mark.parametrize("status, transient", [(404, False), (403, False), (410, False), (503, True)])
def test_http_errors(server, status, transient):
    err = failure(server, f"/status/{status}")
    assert err.kind == f"http {status}" and err.transient is transient


def test_500_then_200_is_retried(server):
    got = get(server, "/flaky/1/a")
    assert got.attempts == 2 and server.hits["/flaky/1/a"] == 2
    err = failure(server, "/flaky/5/b")  # more failures than retries
    assert err.kind == "http 500" and err.transient and server.hits["/flaky/5/b"] == 2
    assert server.hits["/status/404"] == 1  # never retried


def test_429_honours_retry_after(server):
    t0 = time.monotonic()
    got = get(server, "/busy/x")
    assert got.attempts == 2 and time.monotonic() - t0 >= 0.95


def test_trickle_hits_the_deadline(server):
    t0 = time.monotonic()
    err = failure(server, "/trickle", FetchConfig(**{**LOCAL.__dict__, "retries": 0, "deadline": 1.5}))
    assert err.kind == "deadline" and err.transient
    assert time.monotonic() - t0 < 3


def test_endless_stream_hits_the_byte_cap(server):
    err = failure(server, "/endless")
    assert err.kind == "too large"


def test_redirect_loops(server):
    assert failure(server, "/loop").kind == "redirect loop"
    assert failure(server, "/loop-a").kind == "redirect loop"


def test_private_addresses_are_refused_without_connecting(server):
    err = failure(server, "/to-private")  # 127.0.0.1 allowed, the redirect target is not
    assert err.kind == "private address" and "169.254.169.254" in err.detail
    err = failure(server, "/img/rgb.jpg", FetchConfig())  # defaults refuse loopback too
    assert err.kind == "private address"
    assert get(server, "/img/rgb.jpg", FetchConfig(allow_private_network=True)).status == 200


def test_opt_out_is_respected(server):
    assert failure(server, "/noai").kind == "opted out"
    assert get(server, "/otherbot-noai").status == 200  # aimed at another crawler
    assert get(server, "/noai", FetchConfig(**{**LOCAL.__dict__, "disallowed_directives": ()})).status == 200


@pytest.mark.parametrize(
    "url, kind",
    [
        ("ftp://127.0.0.1/a.jpg", "unsupported scheme"),
        ("file:///etc/passwd", "unsupported scheme"),
        ("http:///nohost", "invalid url"),
    ],
)
def test_only_http_urls(url, kind):
    with pytest.raises(FetchError) as info:
        fetch(url, LOCAL, HostLimiter(4))
    assert info.value.kind == kind


def test_per_host_cap(server):
    cfg = FetchConfig(**{**LOCAL.__dict__, "per_host": 2})
    limiter = HostLimiter(cfg.per_host)
    server.max_slow = 0
    threads = [threading.Thread(target=fetch, args=(server.url(f"/slow/{i}"), cfg, limiter)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert server.max_slow == 2


INVALID_URLS = [
    "http://a..b/x.jpg",  # an empty host label (UnicodeError from the resolver before)
    "http://" + "a" * 64 + ".example/x.jpg",  # a label over 63 characters
    "http://ab\u00e9..example/x.jpg",  # non-ASCII with an empty label: IDNA refuses it
    "http://ex%41mple.com/x.jpg",  # characters no host name has
    "http://exa mple.com/x.jpg",
    "http://[::1",  # unbalanced bracket (ValueError from urlsplit before)
    "http://[::1]x/",  # text after an address literal
    "http://user@",  # no host after the credentials
    "http://127.0.0.1:99999999/x.jpg",  # port out of range
    "http://127.0.0.1:abc/x.jpg",
    "http://127.0.0.1:0/x.jpg",
    "http://127.0.0.1/a b.jpg",  # a space in the path (classed "connection", transient, before)
    "http://127.0.0.1/a\r\nX-Injected: 1",  # CR/LF: header injection
    "http://127.0.0.1/a\tb.jpg",
    "http://127.0.0.1/a\x00b.jpg",
    "http://127.0.0.1/\ud800.jpg",  # a lone surrogate cannot be UTF-8 encoded
]


@pytest.mark.parametrize("url", INVALID_URLS)
def test_invalid_urls_are_named_and_permanent(url):
    with pytest.raises(FetchError) as info:
        fetch(url, LOCAL, HostLimiter(4))
    assert info.value.kind == "invalid url" and not info.value.transient, (info.value.kind, info.value.detail)


def test_non_ascii_paths_and_hosts_are_encoded_as_browsers_do(server):
    from pipeline.download.fetch import parse_url

    got = get(server, "/any/caf\u00e9.jpg?q=\u00fc")  # IRI -> URI: UTF-8, percent-encoded
    assert got.status == 200 and server.hits["/any/caf%C3%A9.jpg?q=%C3%BC"] == 1
    got = get(server, "/redirect-utf8")  # a raw UTF-8 Location header: its bytes, percent-encoded
    assert got.status == 200 and server.hits["/any/caf%C3%A9.jpg"] == 1
    target = parse_url("https://B\u00fccher.example:8443/\u00e4/x.jpg?a=1#frag")
    assert (target.scheme, target.host, target.port, target.target) == (
        "https",
        "xn--bcher-kva.example",
        8443,
        "/%C3%A4/x.jpg?a=1",
    )
    assert parse_url("http://[::1]/x").host == "::1" and parse_url("http://example.com").target == "/"


def test_credentials_never_reach_rows_or_messages(server):
    from pipeline.download.fetch import redact_url

    url = server.url("/img/rgb.jpg").replace("http://", "http://alice:s3cret@")
    got = fetch(url, LOCAL, HostLimiter(4))
    assert got.final_url == server.url("/img/rgb.jpg")
    with pytest.raises(FetchError) as info:
        fetch(server.url("/status/404").replace("http://", "http://alice:s3cret@"), LOCAL, HostLimiter(4))
    assert "s3cret" not in str(info.value) and "alice" not in str(info.value)
    assert redact_url("https://u:p@h.example:81/a?b") == "https://h.example:81/a?b"
    assert redact_url("http://[::1]:8/x") == "http://[::1]:8/x" and redact_url("not a url [") == "not a url ["


@pytest.mark.parametrize(
    "ip",
    [
        "10.0.0.1",
        "127.0.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:10.0.0.1",
        "::ffff:127.0.0.1",  # IPv4-mapped: ipaddress already knows these
        "::10.0.0.1",
        "::169.254.169.254",  # IPv4-compatible (deprecated ::/96)
        "64:ff9b::a00:1",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",  # NAT64 (64:ff9b::/96) of private IPv4
        "64:ff9b:1::a00:1",  # local-use NAT64 (64:ff9b:1::/48)
        "2002:a00:1::1",
        "2002:a9fe:a9fe::",  # 6to4 (2002::/16) of private IPv4
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo
    ],
)
def test_private_addresses_in_every_form_are_refused(ip):
    from pipeline.download.fetch import _address_allowed

    assert not _address_allowed(ip, False, ())
    assert _address_allowed(ip, True, ())  # --allow-private-network


@pytest.mark.parametrize("ip", ["8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"])
def test_public_addresses_in_every_form_are_allowed(ip):
    from pipeline.download.fetch import _address_allowed

    assert _address_allowed(ip, False, ())


def test_allowed_networks_cover_embedded_ipv4():
    from pipeline.download.fetch import _address_allowed

    nets = ("10.0.0.0/8",)
    assert _address_allowed("10.1.2.3", False, nets) and _address_allowed("64:ff9b::a01:203", False, nets)
    assert _address_allowed("::ffff:10.1.2.3", False, nets) and not _address_allowed("::ffff:192.168.0.1", False, nets)


@pytest.mark.parametrize(
    "fields, flag",
    [
        ({"deadline": 0}, "--deadline"),
        ({"connect_timeout": -1}, "--connect-timeout"),
        ({"max_bytes": 0}, "--max-bytes"),
        ({"retries": -1}, "--retries"),
        ({"per_host": 0}, "--per-host"),
        ({"threads": 0}, "--threads"),
        ({"allowed_networks": ("10.0.0.0/33",)}, "--allow-network"),
    ],
)
def test_fetch_config_refuses_bad_values_naming_the_flag(fields, flag):
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match=flag):
        FetchConfig(**fields)


def test_fetch_config_normalizes_and_round_trips():
    cfg = FetchConfig(disallowed_directives=(" NoAI", "", "noimageai "), allowed_networks=("10.1.2.3/8",))
    assert cfg.disallowed_directives == ("noai", "noimageai") and cfg.allowed_networks == ("10.0.0.0/8",)
    assert FetchConfig.from_json(cfg.to_json()) == cfg


def test_a_local_image_that_is_a_pipe_or_a_device_is_a_file_error_not_a_hang(tmp_path):
    """Opening a FIFO for reading waits for a writer for ever: it is never opened as one. A
    device, a socket and a folder are refused alike; a regular file is read."""
    import os

    from pipeline.download.fetch import FetchError, read_local

    fifo = tmp_path / "fifo.jpg"
    os.mkfifo(fifo)
    for path, words in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file"), (tmp_path, "a folder")):
        with pytest.raises(FetchError, match=words) as err:
            read_local(str(path), 1000)
        assert err.value.kind == "file error"
    (tmp_path / "x.jpg").write_bytes(b"0" * 10)
    assert read_local(str(tmp_path / "x.jpg"), 1000).data == b"0" * 10
    with pytest.raises(FetchError, match="larger than 5 bytes"):
        read_local(str(tmp_path / "x.jpg"), 5)
