"""`vlprep serve` on the shapes site, in a real headless Chromium (Debian's chromium and
chromedriver, driven by Selenium) and over HTTP: the gallery, its filters, an image's regions
(hover), its task items, a run's page, the card; asking the fine-tuned model about a store's
image and an upload gives what `load_predictor` gives (the same API), a second ask reuses the
features, parallel asks equal sequential ones, uploads get the downloader's checks, and no
page writes anything. Each page's screenshot goes into the test's tmp_path.

The browser tests fail (never skip) when chromium or chromedriver is missing, unless
VLPREP_SKIP_BROWSER=1 is set: `apt-get install -y chromium chromium-driver`."""

import os
import shutil
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest
from serve_helpers import fetch, multipart

from pipeline.task_data import TaskData
from vl_models.predict import load_predictor
from vl_models.serve.app import Running, make_app
from vl_models.serve.images import MAX_BYTES
from vl_models.serve.site import open_site

# Debian's paths; VLPREP_CHROMIUM / VLPREP_CHROMEDRIVER name them elsewhere
CHROMIUM = os.environ.get("VLPREP_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("VLPREP_CHROMEDRIVER", "/usr/bin/chromedriver")
SKIP_ENV = "VLPREP_SKIP_BROWSER"
SHOTS_ENV = "VLPREP_SCREENSHOTS"  # a folder: the screenshots are copied there too (docs/img)


def scene(site: Path, key: str) -> Path:
    """The world's JPEG of a store key (cc3m-val-00000001 -> images/shapes_val_00000001.jpg)."""
    _, split, number = key.split("-")
    return site / "world" / "images" / f"shapes_{split}_{number}.jpg"


@pytest.fixture(scope="module")
def served(shapes_site):
    site = open_site(
        [shapes_site / "features"],
        tasks=[shapes_site / "tasks", shapes_site / "mixture"],
        runs=[shapes_site / "run"],
        roots=[shapes_site / "world"],
    )
    with Running(make_app(site)) as running:
        yield running


@pytest.fixture(scope="module")
def predictor(shapes_site):
    """The model as `vltrain predict` loads it (its best checkpoint, as the page asks)."""
    return load_predictor(shapes_site / "run", step="best")


def ask(served, fields: dict, upload=None):
    if upload is None:
        import json

        return fetch(served.url, "/api/ask", "POST", json.dumps(fields).encode(), {"Content-Type": "application/json"})
    body, kind = multipart({k: str(v) for k, v in fields.items()}, {"image": upload})
    return fetch(served.url, "/api/ask", "POST", body, {"Content-Type": kind})


def comparable(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("seconds", "features")}


# -- over HTTP -----------------------------------------------------------------------------------


def test_the_page_answers_as_load_predictor_does(served, predictor, shapes_site):
    vqa = TaskData.open(shapes_site / "tasks" / "vqa")
    row = int(vqa.rows("val")[0])
    key, question = vqa.images(row)[0], vqa.column("text")[row]
    got = ask(served, {"run": "run", "store": "features", "image_id": key, "kind": "question", "text": question})
    assert got.status == 200, got.text
    result = got.json()["result"]
    from vl_models.predict import StoreImage

    expected = predictor.ask([{"image": StoreImage(key), "question": question}])[0]
    assert comparable(result) == expected and result["features"] == "store"
    # an upload of the scene's JPEG: the run's detector extracts it, once
    data = scene(shapes_site, key).read_bytes()
    first = ask(served, {"run": "run", "kind": "question", "text": question}, ("scene.jpg", data)).json()["result"]
    from_file = predictor.ask([{"image": str(scene(shapes_site, key)), "question": question}])[0]
    assert comparable(first) == from_file and first["features"] == "extracted"
    again = ask(served, {"run": "run", "kind": "question", "text": "how many shapes are there?"}, ("other.jpg", data))
    assert again.json()["result"]["features"] == "reused"  # the same bytes: their features are kept
    from vl_models.predict import ImageBytes  # the API the page uses: an in-memory image, a file's rules

    same = predictor.ask([{"image": ImageBytes(data, "scene.jpg"), "question": question}])[0]
    assert same == from_file
    held = predictor.ask([{"image": ImageBytes(b"\xff\xd8\xff" + bytes(MAX_BYTES)), "question": question}])[0]
    assert held["error"] == "too large"
    # a referring expression: the grounded box
    refs = TaskData.open(shapes_site / "tasks" / "refcoco+")
    ref = int(refs.rows("val")[0])
    key, expression = refs.images(ref)[0], refs.column("text")[ref]
    got = ask(served, {"run": "run", "store": "features", "image_id": key, "kind": "expression", "text": expression})
    box, score = predictor.ground(StoreImage(key), expression)
    assert got.json()["result"]["box"] == box and got.json()["result"]["score"] == score


def test_parallel_asks_equal_sequential_ones(served, shapes_site):
    vqa = TaskData.open(shapes_site / "tasks" / "vqa")
    rows = [int(r) for r in vqa.rows("val")[:6]]
    queries = [
        ({"run": "run", "store": "features", "image_id": vqa.images(r)[0], "kind": "question", "text": t}, None)
        for r in rows
        for t in (vqa.column("text")[r], "what shape is at the top?")
    ]
    queries += [
        ({"run": "run", "kind": "question", "text": "is there a red shape?"}, (f"u{i}.jpg", scene(shapes_site, k)))
        for i, k in enumerate(["cc3m-train-00000004", "cc3m-train-00000005", "cc3m-val-00000002"])
    ]
    queries = [(f, (u[0], u[1].read_bytes()) if u else None) for f, u in queries]
    sequential = [comparable(ask(served, f, u).json()["result"]) for f, u in queries]
    parallel: list = [None] * (2 * len(queries))

    def client(n: int) -> None:
        for i in range(n, len(parallel), 8):
            fields, upload = queries[i % len(queries)]
            parallel[i] = comparable(ask(served, fields, upload).json()["result"])

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert parallel == sequential + sequential


def test_uploads_get_the_downloaders_checks(served):
    fields = {"run": "run", "kind": "question", "text": "what is it?"}

    def png_header(width: int, height: int) -> bytes:
        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
        return b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))

    for upload, says in (
        (("notes.txt", b"just some text, no image"), "not an image"),
        (("bomb.png", png_header(30_000, 30_000)), "decompression bomb"),
        (("cut.jpg", b"\xff\xd8\xff\xe0" + b"\0" * 64), "decode error"),
        (("big.jpg", b"\xff\xd8\xff" + b"\0" * MAX_BYTES), "too large"),
    ):
        reply = ask(served, fields, upload)
        assert reply.status in (400, 413) and says in reply.json()["detail"], (upload[0], reply.text[:300])


def test_images_come_from_the_stores_dataset_files_under_the_root(served, shapes_site):
    for key in ("cc3m-train-00000003", "cc3m-val-00000001"):
        reply = fetch(served.url, f"/stores/features/file?id={key}")
        assert reply.status == 200 and reply.body == scene(shapes_site, key).read_bytes()
        assert reply.headers["content-type"] == "image/jpeg"


def test_an_images_page_lists_its_items_in_the_tasks_and_mixtures(served, shapes_site):
    key = "cc3m-train-00000000"
    page = fetch(served.url, f"/stores/features/image?id={key}").text
    vqa = TaskData.open(shapes_site / "tasks" / "vqa")
    refs = TaskData.open(shapes_site / "tasks" / "refcoco+")
    for data in (vqa, refs):
        texts = [data.column("text")[r] for r in range(len(data)) if data.images(r) == [key]]
        assert texts and all(t in page for t in texts[:5])
    assert 'data-box="' in page and "caption" in page  # refexps with their boxes; the mixture's captions


def test_no_page_writes_anything(served, shapes_site):
    def snapshot() -> dict:
        return {
            str(p): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(shapes_site.rglob("*"))
            if p.is_file() and not p.name.startswith(".vlprep.lock")
        }

    before = snapshot()
    for path in (
        "/",
        "/stores/features",
        "/stores/features?object=circle&min_conf=0.5",
        "/stores/features/image?id=cc3m-train-00000001&pos=1",
        "/stores/features/card",
        "/stores/features/thumb?id=cc3m-train-00000002",
        "/tasks/vqa",
        "/tasks/mixture",
        "/runs/run",
        "/runs/run/curves.png",
        "/ask",
    ):
        assert fetch(served.url, path).status == 200, path
    data = scene(shapes_site, "cc3m-val-00000000").read_bytes()
    assert ask(served, {"run": "run", "kind": "question", "text": "what color?"}, ("s.jpg", data)).status == 200
    assert snapshot() == before


# -- in a browser --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: the browser tests are skipped")
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).is_file()]
    if missing:
        pytest.fail(
            f"the browser tests need Debian's chromium and chromedriver ({', '.join(missing)} missing): "
            f"apt-get install -y chromium chromium-driver (or set {SKIP_ENV}=1 to skip them)",
            pytrace=False,
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # no driver download
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def shot(driver, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"serve-{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    if os.environ.get(SHOTS_ENV):
        Path(os.environ[SHOTS_ENV]).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(os.environ[SHOTS_ENV]) / path.name)


def wait_for(condition, seconds: float = 60, driver=None):
    """`condition()` once it is true (polled), else AssertionError with the page's text."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    shown = "" if driver is None else driver.find_element("tag name", "body").text[:1500]
    raise AssertionError(f"timed out after {seconds} s; the page shows:\n{shown}")


def loaded_images(driver) -> bool:
    return driver.execute_script("return Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")


def test_the_gallery_filters_and_an_image_highlights_its_regions(browser, served, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    browser.get(served.url + "stores/features")
    cards = browser.find_elements(By.CSS_SELECTOR, "#gallery a.card")
    assert len(cards) == 12 and "page 1 of 1" in browser.page_source
    shot(browser, tmp_path, "gallery")
    browser.find_element(By.ID, "f-object").send_keys("circle")
    browser.find_element(By.ID, "f-conf").send_keys("0.5")
    browser.find_element(By.ID, "f-apply").click()
    wait_for(lambda: "object=circle" in browser.current_url)
    cards = browser.find_elements(By.CSS_SELECTOR, "#gallery a.card")
    assert 0 < len(cards) < 12
    for card in cards:  # every image shown has a circle, drawn first
        assert card.find_element(By.CSS_SELECTOR, ".chip").get_attribute("data-label") == "circle"
    shot(browser, tmp_path, "filtered")
    key = cards[0].get_attribute("data-id")
    cards[0].click()
    wait_for(lambda: browser.find_elements(By.ID, "regions"))
    assert browser.find_element(By.ID, "image-id").text.startswith(key)
    row = browser.find_elements(By.CSS_SELECTOR, "#regions tr.region")[1]
    region = row.get_attribute("data-region")
    ActionChains(browser).move_to_element(row).perform()
    drawn = browser.find_element(By.CSS_SELECTOR, f'svg.pic g.region[data-region="{region}"]')
    wait_for(lambda: "hl" in drawn.get_attribute("class"))
    assert "hl" in row.get_attribute("class")
    shot(browser, tmp_path, "image")
    referring = browser.find_elements(By.CSS_SELECTOR, "li.item[data-box]")
    assert referring, "the image's referring expressions"
    ActionChains(browser).move_to_element(referring[0]).perform()
    refbox = browser.find_element(By.ID, "refbox")
    wait_for(lambda: "on" in refbox.get_attribute("class"))
    x1, y1 = (float(v) for v in referring[0].get_attribute("data-box").split()[:2])
    assert (float(refbox.get_attribute("x")), float(refbox.get_attribute("y"))) == (x1, y1)


def test_asking_in_the_browser_shows_the_models_answer(browser, served, predictor, shapes_site, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from vl_models.predict import StoreImage

    key = "cc3m-val-00000000"
    browser.get(served.url + f"ask?store=features&image_id={key}")
    Select(browser.find_element(By.ID, "a-kind")).select_by_value("question")
    question = "what color is the circle?"
    browser.find_element(By.ID, "a-text").send_keys(question)
    browser.find_element(By.ID, "a-submit").click()
    answers = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#answers tr.best .answer-text"), driver=browser)
    expected = predictor.ask([{"image": StoreImage(key), "question": question}])[0]
    assert answers[0].text == expected["answer"]
    wait_for(lambda: loaded_images(browser))
    shot(browser, tmp_path, "ask")
    # a referring expression about an uploaded scene: the grounded box is drawn
    browser.get(served.url + "ask")
    Select(browser.find_element(By.ID, "a-kind")).select_by_value("expression")
    browser.find_element(By.ID, "a-upload").send_keys(str(scene(shapes_site, "cc3m-val-00000001")))
    browser.find_element(By.ID, "a-text").send_keys("the large square")
    browser.find_element(By.ID, "a-submit").click()
    grounded = wait_for(lambda: browser.find_elements(By.ID, "grounded"), driver=browser)
    box, _ = predictor.ground(str(scene(shapes_site, "cc3m-val-00000001")), "the large square")
    assert " ".join(str(round(v, 1)) for v in box) in grounded[0].text
    assert browser.find_elements(By.CSS_SELECTOR, "svg.pic rect.answer-box")
    shot(browser, tmp_path, "ground")
    # an empty question is a message on the page
    browser.get(served.url + f"ask?store=features&image_id={key}")
    Select(browser.find_element(By.ID, "a-kind")).select_by_value("question")
    browser.find_element(By.ID, "a-text").send_keys("   ")
    browser.find_element(By.ID, "a-submit").click()
    error = wait_for(lambda: browser.find_elements(By.ID, "error"), driver=browser)
    assert "empty text" in error[0].text


def test_the_run_card_and_task_pages_in_the_browser(browser, served, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(served.url + "runs/run")
    curves = browser.find_element(By.ID, "curves")
    wait_for(lambda: browser.execute_script("return arguments[0].naturalWidth", curves) > 0)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#evals tr")) == 3  # the header, steps 2 and 4
    assert "best" in browser.find_element(By.ID, "checkpoints").text
    shot(browser, tmp_path, "run")
    browser.get(served.url + "stores/features/card")
    assert "shapes-tiny" in browser.find_element(By.ID, "card").text
    assert "regions" in browser.find_element(By.ID, "card").text and "Provenance" in browser.page_source
    shot(browser, tmp_path, "card")
    browser.get(served.url + "tasks/refcoco%2B")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#task-items tr")) > 10
    shot(browser, tmp_path, "task")
    browser.get(served.url)
    assert "features" in browser.find_element(By.TAG_NAME, "main").text
    shot(browser, tmp_path, "home")
