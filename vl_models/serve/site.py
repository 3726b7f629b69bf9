"""What `vlprep serve` shows: the stores, task datasets, mixtures and runs found under the
folders it is given, each under a URL-safe name of its own (pages name them, never a path).

A folder given is the thing itself or holds such things up to `DEPTH` levels down (``--runs
vlprep_demo`` finds ``runs/lxmert`` and ``transfer/lxmert/vqa-pretrained-seed0``); the walk
follows no symbolic link below the given folder and stops at `MAX_VISITED` folders. Opening reads
manifests only: a store of a million records opens as fast as one of ten.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Optional, Sequence

from pipeline.errors import ConfigError
from pipeline.items.folder import folder_manifest
from pipeline.mixture.mixture import FORMAT as MIXTURE_FORMAT
from pipeline.store import FeatureStore
from pipeline.store.manifest import MANIFEST_FILE
from pipeline.task_data import FORMAT as TASK_FORMAT

log = logging.getLogger(__name__)

DEPTH = 3  # levels below a given folder searched for stores, task datasets and runs
MAX_VISITED = 20_000  # folders looked at per given folder, at most
SKIP = {"shards", "checkpoints", "images", "__pycache__", "node_modules"}  # never the things themselves
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def is_loopback(host: str) -> bool:
    """Whether `host` (a --host value) is this machine's loopback only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_store(path: Path) -> bool:
    try:
        return json.loads((path / MANIFEST_FILE).read_text()).get("format") == "vlprep-feature-store"
    except (OSError, ValueError, AttributeError):
        return False


def item_kind(path: Path) -> Optional[str]:
    """``task`` or ``mixture`` for a task dataset or mixture folder, else None."""
    if folder_manifest(path, TASK_FORMAT) is not None:
        return "task"
    if folder_manifest(path, MIXTURE_FORMAT) is not None:
        return "mixture"
    return None


def is_run(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "checkpoints").is_dir()


def find(given: Path, test: Callable[[Path], bool], what: str, flag: str) -> list[Path]:
    """`given` if it passes `test`, else the folders under it that do (breadth first, `DEPTH`
    levels, sorted; no symbolic link followed below `given`); ConfigError when there is none."""
    if not given.is_dir():
        raise ConfigError(f"{flag} {given}: not a folder")
    if test(given):
        return [given]
    found, visited, queue = [], 0, deque([(given, 0)])
    while queue and visited < MAX_VISITED:
        folder, depth = queue.popleft()
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
        except OSError:
            continue
        for child in children:
            visited += 1
            if child.name.startswith(".") or child.name in SKIP:
                continue
            if test(child):
                found.append(child)
            elif depth + 1 < DEPTH:
                queue.append((child, depth + 1))
    if not found:
        raise ConfigError(f"{flag} {given}: no {what} in it (searched {DEPTH} levels down)")
    return found


def _names(paths: Sequence[tuple[Path, Path]]) -> list[str]:
    """A URL-safe name per (given folder, found folder): the found folder's path below the given
    one (its own name when it is the given one), parts joined by '-', made unique."""
    names, seen = [], set()
    for given, path in paths:
        rel = path.relative_to(given).parts if path != given else ()
        base = _UNSAFE.sub("_", "-".join(rel) or path.name or "root").strip("_") or "item"
        name, n = base, 2
        while name in seen:
            name, n = f"{base}-{n}", n + 1
        seen.add(name)
        names.append(name)
    return names


@dataclass
class StoreEntry:
    """A store served: its reader (one lock: readers are opened lazily and per process), label
    names and where its images are."""

    name: str
    path: Path
    store: FeatureStore
    objects: Optional[list[str]] = None
    attributes: Optional[list[str]] = None
    images: object = None  # images.StoreImages, set by Site
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def manifest(self):
        return self.store.manifest


@dataclass
class ItemsEntry:
    """A task dataset or a mixture served, opened on first use."""

    name: str
    path: Path
    kind: str  # task | mixture
    manifest: dict
    lock: threading.RLock = field(default_factory=threading.RLock)

    @cached_property
    def data(self):
        from pipeline.mixture import Mixture
        from pipeline.task_data import TaskData

        with self.lock:
            return TaskData.open(self.path) if self.kind == "task" else Mixture.open(self.path)

    @property
    def title(self) -> str:
        return self.manifest.get("task") or self.manifest.get("name") or self.path.name


@dataclass
class RunEntry:
    name: str
    path: Path

    @property
    def config(self) -> dict:
        try:
            config = json.loads((self.path / "config.json").read_text())
        except (OSError, ValueError):
            return {}
        return config if isinstance(config, dict) else {}


@dataclass
class Site:
    stores: dict[str, StoreEntry]
    items: dict[str, ItemsEntry]
    runs: dict[str, RunEntry]
    roots: tuple[Path, ...]  # --images


def labels_of(store: FeatureStore, objects_vocab: Optional[Path], attributes_vocab: Optional[Path]) -> tuple:
    """The names of a store's ``objects_id`` / ``attrs_id``: the vocab files given, else the label
    map its extraction recorded (``--labelmap``), else those shipped beside the packaged weights
    it was extracted with (the shapes detector's); None where unknown (ids are shown)."""
    from pipeline.detect.show import read_vocab

    recorded = store.manifest.provenance.get("labels") or {}
    objects = read_vocab(objects_vocab) or recorded.get("objects")
    attributes = read_vocab(attributes_vocab) or recorded.get("attributes")
    if objects is None or attributes is None:
        shipped = _shipped_labels(store.manifest.provenance.get("weights_sha256"))
        objects = objects or shipped[0]
        attributes = attributes or shipped[1]
    return objects, attributes


def _shipped_labels(weights_sha256) -> tuple:
    from pipeline.detect.backends.butd_c4.weights import WEIGHTS_DATA_DIR
    from pipeline.detect.show import read_vocab

    if not isinstance(weights_sha256, str):
        return None, None
    for digest in WEIGHTS_DATA_DIR.glob("*.sha256"):
        try:
            known = digest.read_text().split()[0]
        except (OSError, IndexError):
            continue
        if known == weights_sha256:
            names = [WEIGHTS_DATA_DIR / f"{kind}_{digest.stem.split('-')[0]}.txt" for kind in ("objects", "attributes")]
            return tuple(read_vocab(p) if p.is_file() else None for p in names)
    return None, None


def open_site(
    stores: Sequence[Path],
    tasks: Sequence[Path] = (),
    runs: Sequence[Path] = (),
    roots: Sequence[Path] = (),
    objects_vocab: Optional[Path] = None,
    attributes_vocab: Optional[Path] = None,
) -> Site:
    """The site of the given folders (ConfigError naming a folder that holds nothing to show, an
    unreadable store manifest, or an --images root that is no folder or file)."""
    from vl_models.serve.images import StoreImages

    for root in roots:
        if not root.exists():
            raise ConfigError(f"--images {root}: not found")
    if not (stores or tasks or runs):
        raise ConfigError("give a feature store, --tasks or --runs: there is nothing to serve")
    found_stores = [(s, p) for s in stores for p in find(s, is_store, "feature store", "STORE")]
    found_items = [
        (t, p) for t in tasks for p in find(t, lambda p: item_kind(p) is not None, "task dataset", "--tasks")
    ]
    found_runs = [(r, p) for r in runs for p in find(r, is_run, "run of vltrain", "--runs")]
    site_roots = tuple(Path(r).resolve() for r in roots)
    entries = {}
    for name, (_, path) in zip(_names(found_stores), found_stores):
        store = FeatureStore.open(path)  # the manifest only
        objects, attributes = labels_of(store, objects_vocab, attributes_vocab)
        entry = StoreEntry(name, path, store, objects, attributes)
        entry.images = StoreImages(store, site_roots)
        entries[name] = entry
    items = {}
    for name, (_, path) in zip(_names(found_items), found_items):
        kind = item_kind(path)
        items[name] = ItemsEntry(
            name, path, kind, folder_manifest(path, TASK_FORMAT if kind == "task" else MIXTURE_FORMAT)
        )
    run_entries = {name: RunEntry(name, path) for name, (_, path) in zip(_names(found_runs), found_runs)}
    return Site(entries, items, run_entries, site_roots)
