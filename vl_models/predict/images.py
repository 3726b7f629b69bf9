"""The images a predictor is asked about and their regions: a store's image by id
(`StoreImage`), an image's bytes held in memory (`ImageBytes`), a file or an ``http(s)`` URL;
and `ImageCache`, which reads each new picture and runs it through the detector of the store
the model was trained on (`pipeline.detect.like_store.StoreDetector`: the same features,
bitwise, as `vlprep extract` writes), once per picture, keeping the last `KEPT_IMAGES`."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

from pipeline.detect.like_store import ImageInputError
from pipeline.records import RegionFeatures

if TYPE_CHECKING:
    from pipeline.detect.like_store import StoreDetector
    from pipeline.store import FeatureStore

KEPT_IMAGES = 64  # extracted images kept for later questions


@dataclass(frozen=True)
class StoreImage:
    """An image of a feature store, by id (the run's store unless the predictor was given one)."""

    image_id: str


@dataclass(frozen=True)
class ImageBytes:
    """An image given as its bytes (an upload, say: nothing is written to disk), read under the
    same rules as a file (size cap, sniffing, decompression-bomb checks) and, like a file, known
    by its content: the same bytes asked about again reuse their features. ``str()`` names it
    by `name` and the start of its sha256."""

    data: bytes = field(repr=False)
    name: str = "upload"

    def __post_init__(self) -> None:
        digest = hashlib.sha256(self.data).hexdigest()
        object.__setattr__(self, "_label", f"{self.name}#{digest[:12]}")

    def __str__(self) -> str:
        return self._label


ImageLike = Union[str, Path, StoreImage, ImageBytes]


class _Records:
    """Region records by image id, read as a store's (`layout`: the store they join)."""

    def __init__(self, layout, records: dict[str, RegionFeatures]):
        self.layout, self._records = layout, records

    def __contains__(self, key) -> bool:
        return key in self._records

    def get(self, key: str) -> RegionFeatures:
        return self._records[key]


class ImageCache:
    """The regions of the images asked about, each under the store key the model's examples
    name it by: a `StoreImage` read from `store`; a file, URL or `ImageBytes` read and extracted
    by the detector `detector_of` builds (on first use), known by the sha256 of its bytes, so a
    file replaced at the same path is a new picture and the same picture under two names is
    extracted once."""

    def __init__(self, store: Optional[FeatureStore], detector_of: Callable[[], StoreDetector]):
        self.store, self.detector_of = store, detector_of
        self._detector: Optional[StoreDetector] = None
        # ("store", id) or ("content", sha256 of the bytes) -> (image id, record, image bytes or None)
        self._images: OrderedDict = OrderedDict()
        self._sources: dict[str, tuple] = {}  # a file or URL of the current batch -> its key in _images
        self.extracted = 0  # images run through the detector so far (those asked about again are not)

    @property
    def detector(self) -> StoreDetector:
        """The store's detector, built on first use."""
        if self._detector is None:
            self._detector = self.detector_of()
        return self._detector

    @detector.setter
    def detector(self, detector: StoreDetector) -> None:
        self._detector = detector

    def new_batch(self) -> None:
        """Before a batch: forget the images asked about longest ago beyond `KEPT_IMAGES` (a
        batch's images stay until it is answered), and read files and URLs again (one replaced
        since is a new picture)."""
        while len(self._images) > KEPT_IMAGES:
            self._images.popitem(last=False)
        self._sources = {}

    def clear(self) -> None:
        """Forget every image (the next question about one reads and extracts it again)."""
        self._images.clear()
        self._sources = {}

    def key_of(self, source) -> str:
        """The store key of `source`'s image (a store's image read from the store, a new one
        extracted first); an `ImageInputError` for one that cannot be used."""
        cache_key = self._key(source)
        if cache_key[0] == "content":
            self._images.move_to_end(cache_key)
            return self._images[cache_key][0]
        if cache_key in self._images:
            self._images.move_to_end(cache_key)
            return self._images[cache_key][0]
        if self.store is None or source.image_id not in self.store:
            where = self.store.path if self.store is not None else "no store"
            raise ImageInputError(source.image_id, "not in the store", f"{where} has no such id")
        self._images[cache_key] = (source.image_id, self.store.get(source.image_id), None)
        return source.image_id

    def _key(self, source) -> tuple:
        """The key `source`'s image is kept under (a file or URL is read by `extract` first)."""
        if isinstance(source, StoreImage):
            return ("store", source.image_id)
        if str(source) not in self._sources:
            error = self.extract([source]).get(str(source))
            if error is not None:
                raise error
        return self._sources[str(source)]

    def extract(self, sources: Sequence) -> dict[str, ImageInputError]:
        """Read the files and URLs among `sources` (each once per batch: a file replaced since an
        earlier batch is read anew), and extract the pictures not seen before at once (the
        detector's batches; an image the detector fails on fails alone), so that questions about
        them find them ready; returns the ones that could not be used, by source, with their
        errors."""
        given = {str(s): s for s in sources if isinstance(s, ImageBytes)}
        todo = list(dict.fromkeys(str(s) for s in sources if not isinstance(s, StoreImage)))
        todo = [source for source in todo if source not in self._sources]
        if not todo:
            return {}
        detector = self.detector
        fresh, failed = {}, {}
        for source in todo:
            try:
                data = detector.read(source) if source not in given else self._held(given[source])
                key = ("content", hashlib.sha256(data).hexdigest())
                if key not in self._images and key not in fresh:
                    fresh[key] = (source, detector.load(source, data))
                self._sources[source] = key
            except ImageInputError as err:
                failed[source] = err
        for key, (source, image), record in zip(fresh, fresh.values(), self._extract_each(list(fresh.values()))):
            if isinstance(record, ImageInputError):
                failed[source] = record
                self._sources = {s: k for s, k in self._sources.items() if k != key}
            else:
                self._images[key] = (image.image_id, record, image.data)
                self.extracted += 1
        return failed

    def _held(self, image: ImageBytes) -> bytes:
        """An in-memory image's bytes, under the size cap a file or a download has."""
        cap = self.detector.fetch_cfg.max_bytes
        if len(image.data) > cap:
            raise ImageInputError(str(image), "too large", f"{len(image.data):,} bytes, more than {cap:,}")
        return image.data

    def _extract_each(self, loaded: list) -> list:
        """The records of `loaded` (source, image) pairs in the detector's batches; where a batch
        fails, its images one by one, and an image that fails alone gets its error (an image of
        extreme aspect ratio, say, whose feature map has no pixel)."""
        try:
            return self.detector.extract([image for _, image in loaded])
        except Exception:
            if len(loaded) == 1:
                source, image = loaded[0]
                try:
                    return self.detector.extract([image])
                except Exception as err:  # the detector on this image: its error, not the batch's
                    return [ImageInputError(image.image_id, "extract error", f"{type(err).__name__}: {err}")]
            return [record for item in loaded for record in self._extract_each([item])]

    def image(self, source) -> tuple[str, RegionFeatures, Optional[bytes]]:
        """(id, regions, bytes as decoded) of an image asked about."""
        self.key_of(source)
        return self._images[self._key(source)]

    def records(self) -> _Records:
        """The images kept, as a store the examples read their regions from."""
        layout = self.store.layout if self.store is not None else None
        return _Records(layout, {key: record for key, record, _ in self._images.values()})
