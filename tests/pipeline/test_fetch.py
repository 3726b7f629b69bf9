import threading
import time

import pytest

from pipeline.download.fetch import FetchConfig, FetchError, HostLimiter, fetch

LOCAL = FetchConfig(allowed_networks=("127.0.0.0/8",), deadline=3.0, read_timeout=2.0, connect_timeout=2.0,
                    max_bytes=1 << 20, retries=1, backoff=0.05)


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


@pytest.mark.parametrize("url, kind", [("ftp://127.0.0.1/a.jpg", "unsupported scheme"), ("file:///etc/passwd", "unsupported scheme"),
                                       ("http:///nohost", "bad url")])
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
