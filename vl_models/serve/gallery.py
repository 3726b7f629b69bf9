"""A store's gallery pages and an image's regions, reading only what a page shows.

A plain page reads its `per` records by position (`FeatureStore.record_at`): page 40,000 of a
store of a million records costs what page 1 does. A filtered page (object or attribute label,
confidence, a part of the id) scans forward from a position for at most `SCAN` records and stops
at `per` matches: it says which records it looked at and where the next page starts, so no
request reads the whole store. An exact id is one index lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from pipeline.records import RegionFeatures

PER_PAGE = 24
MAX_PER_PAGE = 96
SCAN = 2_000  # records a filtered page looks at, at most
SHOWN_REGIONS = 10  # regions drawn on a thumbnail, at most
THUMB_CONF = 0.2  # ... and only those this confident (unless the page asks for more)
ATTR_SHOWN = 0.1  # an attribute is named when its confidence reaches this (as `vlprep show` does)


class QueryError(ValueError):
    """A page's parameter that cannot be used (shown on the page, HTTP 400)."""


@dataclass(frozen=True)
class Filter:
    objects: Optional[int] = None
    attribute: Optional[int] = None
    min_conf: float = 0.0
    text: str = ""  # a part of the image id

    @property
    def active(self) -> bool:
        return self.objects is not None or self.attribute is not None or self.min_conf > 0 or bool(self.text)

    def matches(self, rec: RegionFeatures) -> bool:
        if self.text and self.text not in rec.image_id:
            return False
        if self.objects is None and self.attribute is None and self.min_conf <= 0:
            return True
        keep = np.ones(rec.num_boxes, bool)
        if self.objects is not None or self.min_conf > 0:
            if rec.objects_id is None:
                return False
            if self.objects is not None:
                keep &= np.asarray(rec.objects_id) == self.objects
            if self.min_conf > 0:
                keep &= np.asarray(rec.objects_conf) >= self.min_conf
        if self.attribute is not None:
            if rec.attrs_id is None:
                return False
            keep &= np.asarray(rec.attrs_id) == self.attribute
        return bool(keep.any())


def label_id(value: str, names: Optional[Sequence[str]], what: str, prefix: str) -> Optional[int]:
    """An object or attribute label given on a page: its name (any case), its id, or ``obj12`` /
    ``attr3``; None when blank; QueryError naming the known labels otherwise."""
    value = (value or "").strip()
    if not value:
        return None
    if names:
        lowered = [n.lower() for n in names]
        if value.lower() in lowered:
            return lowered.index(value.lower())
    digits = value[len(prefix) :] if value.lower().startswith(prefix) else value
    if digits.isdigit():
        return int(digits)
    known = f" (this store's: {', '.join(names[:30])}{', ...' if len(names) > 30 else ''})" if names else ""
    raise QueryError(f"{what} {value!r} is not a label of this store{known}; a number is an id")


def number(value: Optional[str], name: str, default, low=None, high=None, kind=int):
    """A numeric page parameter (QueryError naming it when it is not one, or out of range)."""
    if value is None or str(value).strip() == "":
        return default
    try:
        out = kind(str(value).strip())
    except ValueError:
        raise QueryError(f"{name}={str(value)[:40]!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and out != out:
        raise QueryError(f"{name} is not a number")
    if (low is not None and out < low) or (high is not None and out > high):
        raise QueryError(f"{name}={out} is out of range ({low} to {high})")
    return out


def positions(total: int, page: int, per: int) -> range:
    """The store positions of page `page` (1-based)."""
    start = (page - 1) * per
    return range(min(start, total), min(start + per, total))


def scan(store, flt: Filter, start: int, per: int, budget: int = SCAN) -> tuple[list[tuple], int]:
    """Records matching `flt` from position `start` on: at most `per` (position, record) pairs,
    looking at no more than `budget` records. Returns (the matches, the first position not
    looked at)."""
    total, found, at = len(store), [], start
    end = min(total, start + budget)
    while at < end and len(found) < per:
        rec = store.record_at(at)
        if flt.matches(rec):
            found.append((at, rec))
        at += 1
    return found, at


def shown(rec: RegionFeatures, min_conf: float = 0.0, limit: Optional[int] = None) -> list[int]:
    """The regions to draw, most confident first (all of them for a store without labels)."""
    if rec.objects_conf is None:
        order = list(range(rec.num_boxes))
    else:
        conf = np.asarray(rec.objects_conf, np.float64)
        order = [int(i) for i in np.argsort(-conf, kind="stable") if conf[i] >= min_conf]
    return order[:limit] if limit else order


def name_of(names: Optional[Sequence[str]], i: int, prefix: str) -> str:
    return names[i] if names and 0 <= i < len(names) else f"{prefix}{i}"


def region_rows(
    rec: RegionFeatures, objects: Optional[Sequence[str]], attributes: Optional[Sequence[str]], order: Sequence[int]
) -> list[dict]:
    """One JSON-ready row per region of `order`: its box, labels, confidences and positions."""
    s5 = rec.spatial5()
    s6 = rec.spatial6()
    rows = []
    for i in order:
        row = {
            "index": int(i),
            "box": [round(float(v), 1) for v in rec.boxes[i]],
            "spatial5": [round(float(v), 3) for v in s5[i]],
            "spatial6": [round(float(v), 3) for v in s6[i]],
        }
        if rec.objects_id is not None:
            row["object"] = name_of(objects, int(rec.objects_id[i]), "obj")
            row["object_conf"] = round(float(rec.objects_conf[i]), 3)
        if rec.attrs_id is not None:
            row["attribute"] = name_of(attributes, int(rec.attrs_id[i]), "attr")
            row["attribute_conf"] = round(float(rec.attrs_conf[i]), 3)
        row["label"] = label(row)
        rows.append(row)
    return rows


def label(row: dict) -> str:
    """A region's caption on the picture: attribute (when confident enough), object, confidence."""
    parts = []
    if row.get("attribute") and row.get("attribute_conf", 0) >= ATTR_SHOWN:
        parts.append(row["attribute"])
    if row.get("object"):
        parts += [row["object"], f"{row['object_conf']:.2f}"]
    return " ".join(parts) or f"region {row['index']}"


def card(rec: RegionFeatures, objects, attributes, min_conf: float, flt: Filter, position: int) -> dict:
    """What a gallery card shows of a record: its id, size, region count and top regions (those
    the filter asks for first)."""
    everything = shown(rec, min_conf)
    confident = shown(rec, max(min_conf, THUMB_CONF)) or everything[:1]
    order = confident
    if flt.objects is not None or flt.attribute is not None:
        wanted = [
            i
            for i in everything
            if (flt.objects is None or int(rec.objects_id[i]) == flt.objects)
            and (flt.attribute is None or int(rec.attrs_id[i]) == flt.attribute)
        ]
        order = wanted + [i for i in confident if i not in wanted]
    rows = region_rows(rec, objects, attributes, order[:SHOWN_REGIONS])
    return {
        "id": rec.image_id,
        "position": position,
        "width": rec.image_w,
        "height": rec.image_h,
        "regions": rec.num_boxes,
        "rows": rows,
    }
