"""New images extracted exactly as a feature store's images were: `StoreDetector`.

A model trained on a store has only ever seen that store's features, so a new image must go
through the same detector, weights, preprocessing and box policy, and come back as the store
would give it back. `StoreDetector.of(store)` reads what the store records (its manifest's
``provenance``: detector name, preprocessing, box policy, weights sha256 and file name; and
the creating run's resolved ``config``: detector config, weights path, selection, batch size,
image options, dtype), loads that detector, and refuses one whose provenance differs
(`ProvenanceError`: another weights file, detector config, preprocessing or box policy).

Images are read as `vlprep extract` reads them (`read_images`): a file, a folder (its image
files, as ``--images`` lists them) or an ``http(s)`` URL, fetched under the downloader's
rules (`pipeline.download.fetch`: size cap, private-network refusal, redirects, deadline).
What happens to the bytes then is the store's own path: a store extracted from a dataset
(``--dataset``) had each downloaded image normalized by `pipeline.images.process_image` under
its image options (downscale, re-encode) before decoding; one extracted from ``--images``
decoded the bytes as they were. The regions come back through the store's column encoding
(features in its dtype, read back as float32), so for the same image they equal what
`FeatureStore.get` returns for it (bitwise: `tests/vl_models/test_predict.py`), batched as
the store's run batched (its ``--batch-size``: the detector's backbone stacks images of one
size). On a CPU the region detectors (BUTD, VinVL) compute the same bits at any thread count
(`pipeline.detect.cpu`), so new images use every core this process may run on; other extractors
(the grid) run with the store's actors' threads (``--actor-cpus``, 1 by default: their
convolutions' sums run in an order that depends on the thread count; measured, 2 threads differ
from 1 in the last bits).

Every bad input is an `ImageInputError` naming the image and the reason (the downloader's and
the decoder's reason names: ``too large``, ``private address``, ``decode error``,
``decompression bomb``, ``file not found``, ...).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import torch

from pipeline.config import from_json
from pipeline.datasets.folder import image_files
from pipeline.detect.backends import Detector, Extractor, build_extractor, detector_from_json, load_model, resolve
from pipeline.detect.config import GridPool, SelectionConfig
from pipeline.detect.cpu import cpu_threads
from pipeline.download.fetch import FetchConfig, FetchError, HostLimiter, fetch, read_local, redact_url
from pipeline.errors import EXIT_CONFIG, ConfigError, VlprepError
from pipeline.images import ImageConfig, ImageError, load_rgb, process_image
from pipeline.records import RegionFeatures
from pipeline.store import FeatureStore
from pipeline.store.columns import as_stored

log = logging.getLogger(__name__)

URL_SCHEMES = ("http://", "https://")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # a URL of any scheme


class ImageInputError(VlprepError, ValueError):
    """An image that cannot be used: `image` names it (a path or a URL without credentials),
    `kind` the reason (the downloader's and the decoder's names)."""

    exit_code = EXIT_CONFIG

    def __init__(self, image: str, kind: str, detail: str):
        self.image, self.kind, self.detail = image, kind, detail
        super().__init__(f"image {image}: {kind}: {detail}")


class ProvenanceError(ConfigError):
    """A detector that is not the one a store's features came from."""


@dataclass(frozen=True)
class Image:
    """An image to extract: `image_id` (its path or URL, credentials removed), its bytes as
    read, and `rgb` as the store's run would have decoded it (after its normalization)."""

    image_id: str
    data: bytes
    rgb: np.ndarray


def image_sources(sources: Iterable[Union[str, Path]]) -> list[str]:
    """`sources` with each folder replaced by its image files (sorted, as ``--images`` lists
    them); files and URLs as given. A path that does not exist is an `ImageInputError`."""
    out = []
    for source in sources:
        text = str(source)
        if text.lower().startswith(URL_SCHEMES):
            out.append(text)
            continue
        if _SCHEME.match(text):  # ftp://, file://, ...: the downloader's reason
            raise ImageInputError(redact_url(text), "unsupported scheme", f"{text.split(':', 1)[0]}: only http(s) URLs")
        path = Path(text)
        try:
            is_dir, exists = path.is_dir(), path.exists()
        except (OSError, ValueError) as err:  # a name too long, a NUL byte
            raise ImageInputError(text[:200], "file error", getattr(err, "strerror", None) or str(err)) from None
        if is_dir:
            files = [str(p) for p in image_files(path)]
            if not files:
                raise ImageInputError(text, "no images", "the folder holds no image files")
            out += files
        elif exists:
            out.append(text)
        else:
            raise ImageInputError(text, "file not found", "no such file or folder")
    return out


def read_bytes(source: str, fetch_cfg: FetchConfig = FetchConfig()) -> bytes:
    """The bytes of one image file or ``http(s)`` URL, under the downloader's rules (at most
    ``fetch_cfg.max_bytes``; URLs: private networks refused unless allowed, redirects,
    deadline); `ImageInputError` with the downloader's reason otherwise."""
    url = source.lower().startswith(URL_SCHEMES)
    if not url and _SCHEME.match(source):
        raise ImageInputError(redact_url(source), "unsupported scheme", f"{source.split(':', 1)[0]}: only http(s) URLs")
    try:
        folder = not url and Path(source).is_dir()
    except (OSError, ValueError) as err:  # a name too long, a NUL byte
        raise ImageInputError(source[:200], "file error", getattr(err, "strerror", None) or str(err)) from None
    if folder:
        raise ImageInputError(source, "a folder", "one image is asked for here, not a folder of them")
    try:
        return (fetch(source, fetch_cfg, HostLimiter(1)) if url else read_local(source, fetch_cfg.max_bytes)).data
    except FetchError as err:
        raise ImageInputError(redact_url(source), err.kind, err.detail) from err


def _recorded_detector(provenance: dict, run: dict) -> Detector:
    """The backend and config a store's features came from: its provenance's ``extractor``
    (``{"backend", "config"}``), or, in a store written before extraction had backends, the
    BUTD config its run named."""
    if isinstance(provenance.get("extractor"), dict):
        return detector_from_json(provenance["extractor"])
    return resolve(run.get("detector") or provenance["detector"])


class StoreDetector:
    """The detector of a feature store, extracting new images as the store's run did."""

    def __init__(
        self,
        extractor: Extractor,
        store: FeatureStore,
        normalize: Optional[ImageConfig],
        batch_size: int,
        threads: int,
        fetch_cfg: FetchConfig,
    ):
        self.extractor, self.store, self.normalize = extractor, store, normalize
        self.batch_size, self.threads, self.fetch_cfg = batch_size, threads, fetch_cfg

    @classmethod
    def of(
        cls,
        store: Union[str, Path],
        weights: Optional[Union[str, Path]] = None,
        detector: Optional[str] = None,
        device: str = "cpu",
        fetch_cfg: FetchConfig = FetchConfig(),
        threads: Optional[int] = None,
    ) -> "StoreDetector":
        """The detector `store`'s features came from: its recorded weights file (or `weights`,
        checked against the recorded sha256) and detector config (or `detector`), preprocessing
        and box policy. On a CPU with `threads` threads: for an extractor whose results do not
        depend on the thread count (`thread_invariant`: BUTD, VinVL), default every CPU this
        process may run on; for another, default the store's actors' thread count (more are
        faster, but the features then differ from the store's in the last bits), set for the
        process around each `extract`: one predictor per process, not shared between threads.
        ConfigError when the store records no extraction (imported features, ground-truth
        boxes) or the weights are not there; `ProvenanceError` on a mismatch."""
        opened = FeatureStore.open(store, dtype="float32")
        provenance = opened.manifest.provenance
        run = provenance.get("config")
        if not isinstance(run, dict) or not provenance.get("detector") or "preprocess" not in run:
            raise ConfigError(
                f"{store}: its features were not extracted by vlprep extract (no detector in its provenance): "
                "there is no detector to run on new images; use a store's image ids instead"
            )
        if run.get("given_boxes"):
            raise ConfigError(
                f"{store} holds features of given (ground-truth) boxes: new images need the detections' store"
            )
        recorded_detector = _recorded_detector(provenance, run)
        det = resolve(detector) if detector else recorded_detector
        if det.name != provenance["detector"] or det.backend is not recorded_detector.backend:
            raise ProvenanceError(
                f"--detector {detector}: config {det.name!r} ({det.backend.name}), but {store} was extracted with "
                f"{provenance['detector']!r} ({recorded_detector.backend.name})"
            )
        recorded = provenance.get("weights_sha256", "")
        if provenance.get("random_weights") or str(recorded).startswith("random-seed-"):
            if weights is not None:
                raise ProvenanceError(
                    f"{store} was extracted with random weights (seed {run.get('seed')}), not {weights}"
                )
            model, _ = load_model(det, None, int(run.get("seed", 0)))
        else:
            path = Path(weights or run.get("weights") or "")
            if not path.is_file():
                raise ConfigError(
                    f"--weights: {store} was extracted with {provenance.get('weights_file') or 'a weights file'} "
                    f"(sha256 {str(recorded)[:16]}...), which is not at {path}: name it"
                )
            model, report = load_model(det, path)
            if report.sha256 != recorded:
                raise ProvenanceError(
                    f"--weights {path}: sha256 {report.sha256[:16]}..., but {store} was extracted with "
                    f"{provenance.get('weights_file')} (sha256 {str(recorded)[:16]}...): not the same detector"
                )
        backend = det.backend
        selection = backend.check_selection(SelectionConfig.from_json(run.get("selection") or {}))
        options = {"grid_pool": GridPool.parse(run["grid_pool"])} if run.get("grid_pool") else {}
        described = backend.describe_selection(selection, options)
        if described != provenance.get("box_policy"):
            raise ProvenanceError(
                f"{store}: its box policy {provenance.get('box_policy')!r} is not its run's selection ({described!r})"
            )
        if provenance.get("fp16") and str(device).startswith("cuda"):
            log.info("%s was extracted in fp16 on a GPU: so are the new images", store)
        if str(device).split(":")[0] != str(provenance.get("device", "cpu")).split(":")[0]:
            log.warning(
                "%s was extracted on %s, these images run on %s: their features match the store's to float "
                "precision, not bitwise",
                store,
                provenance.get("device"),
                device,
            )
        extractor = build_extractor(
            det,
            model,
            selection=selection,
            preprocess=provenance["preprocess"],
            device=device,
            fp16=bool(provenance.get("fp16")),
            **options,
        )
        normalize = from_json(ImageConfig, run.get("image") or {}, "image options") if run.get("dataset") else None
        if getattr(extractor, "thread_invariant", False):
            threads = extractor.threads = threads or cpu_threads()
        else:
            threads = threads or max(1, int(run.get("actor_cpus") or 1))
        return cls(extractor, opened, normalize, int(run.get("batch_size") or 1), threads, fetch_cfg)

    def read(self, source: str) -> bytes:
        """The bytes of one image (a file or URL) as `load` reads them."""
        return read_bytes(source, self.fetch_cfg)

    def load(self, source: str, data: Optional[bytes] = None) -> Image:
        """One image (a file or URL; its bytes `data` when already `read`) read and decoded as
        the store's run would have."""
        data = self.read(source) if data is None else data
        image_id = redact_url(source)
        try:
            if self.normalize is not None:
                data = process_image(data, self.normalize).data
            return Image(image_id, data, load_rgb(data, (self.normalize or ImageConfig()).max_pixels))
        except ImageError as err:
            raise ImageInputError(image_id, err.kind, err.detail) from err

    def extract(self, images: Sequence[Image]) -> list[RegionFeatures]:
        """Each image's regions as the store returns its own (float32), in `images`' order."""
        out, threads = [], torch.get_num_threads()
        # the actor's threads: CPU kernels sum in an order that depends on the thread count
        # (a thread-invariant extractor runs its own workers, `self.threads` of them)
        cpu = self.extractor.device.type == "cpu" and not getattr(self.extractor, "thread_invariant", False)
        if cpu:
            torch.set_num_threads(self.threads)
        try:
            for start in range(0, len(images), self.batch_size):
                batch = images[start : start + self.batch_size]
                records = self.extractor([im.rgb for im in batch], [im.image_id for im in batch])
                out += [as_stored(rec, self.store.layout, np.float32) for rec in records]
        finally:
            if cpu:
                torch.set_num_threads(threads)
        return out
