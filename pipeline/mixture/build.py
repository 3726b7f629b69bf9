"""`vlprep build-mixture`: text sources + a spec -> one reproducible mixture.

Spec (YAML, see data_manifests/mixtures/):

    name: lxmert
    root: /data            # relative file paths are under it (default: the spec's folder)
    image_data: vg/image_data.json      # VG -> COCO identity (optional)
    sources:
      - {name: mscoco, kind: coco_captions, files: [coco/captions_train2014.json, ...]}
      - {name: vg, kind: vg_regions, files: [vg/region_descriptions.json]}
      - {name: vqa, kind: vqa, files: [questions.json, annotations.json, ...]}   # pairs
      - {name: gqa, kind: gqa, files: [...]}
      - {name: visual7w, kind: vgqa, files: [vg/question_answers.json]}
      - {name: lxmert, kind: lxmert, files: [...], split: val}   # LXMERT's own json
      - {name: cc, kind: conceptual_captions, files: [Train_GCC-training.tsv], repeat: 1, weight: 1.0}
    heldout: [minival_ids.txt]       # one image id per line: those images form the val split
    drop: [test_ids.txt]             # images never used
    drop_coco_test: true
    answers: {top_k: 9500}

Items whose image is held out (or whose source says ``split: val``) go to the ``val``
split; every other item is ``train``. Items are written in spec order, file order, so the
same inputs and spec give byte-identical outputs. Output folder: ``items.arrow``,
``answers.json``, ``manifest.json``, ``report.md`` (built under a temporary name).
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import pyarrow as pa
import yaml

from pipeline import __version__
from pipeline.errors import ConfigError
from pipeline.io import atomic_write_json, commit_path, sha256_file, tmp_path_for
from pipeline.mixture.answers import answer_table
from pipeline.mixture.sources import (
    ImageIds, TextItem, read_coco_captions, read_gqa, read_lxmert, read_vg_regions, read_vgqa, read_vqa,
)

log = logging.getLogger(__name__)
KINDS = ("coco_captions", "vg_regions", "vqa", "gqa", "vgqa", "lxmert", "conceptual_captions")
MIXTURE_SCHEMA_VERSION = 1
ITEMS_SCHEMA = pa.schema(
    [
        pa.field("uid", pa.string(), nullable=False),
        pa.field("image_id", pa.string(), nullable=False),
        pa.field("store_key", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("weight", pa.float32(), nullable=False),
        pa.field("answer_ids", pa.list_(pa.int32())),
        pa.field("answer_scores", pa.list_(pa.float32())),
    ],
    metadata={"vlprep.mixture_schema_version": str(MIXTURE_SCHEMA_VERSION)},
)
BATCH = 8192


@dataclass(frozen=True)
class SourceSpec:
    name: str
    kind: str
    files: tuple[Path, ...]
    split: Optional[str] = None
    repeat: int = 1
    weight: float = 1.0


@dataclass(frozen=True)
class MixtureSpec:
    name: str
    sources: tuple[SourceSpec, ...]
    image_data: Optional[Path] = None
    image_map: Optional[Path] = None  # TSV: image id in the annotation files <TAB> id in the feature stores
    heldout: tuple[Path, ...] = ()
    drop: tuple[Path, ...] = ()
    drop_coco_test: bool = True
    top_k: int = 9500
    raw: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, root: Optional[Path] = None, top_k: Optional[int] = None) -> "MixtureSpec":
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{path}: cannot read the mixture spec: {err}") from err
        if not isinstance(raw, dict) or not raw.get("sources"):
            raise ConfigError(f"{path}: a mixture spec needs a name and a list of sources")
        base = Path(root or raw.get("root") or Path(path).parent)
        resolve = lambda p: Path(p) if Path(p).is_absolute() else base / p  # noqa: E731
        sources = []
        for i, s in enumerate(raw["sources"]):
            if not isinstance(s, dict) or s.get("kind") not in KINDS or not s.get("files"):
                raise ConfigError(f"{path}: sources[{i}] needs kind (one of {', '.join(KINDS)}) and files")
            if s["kind"] == "vqa" and len(s["files"]) % 2:
                raise ConfigError(f"{path}: sources[{i}] (vqa) lists questions/annotations files in pairs")
            if int(s.get("repeat", 1)) < 1 or float(s.get("weight", 1.0)) <= 0:
                raise ConfigError(f"{path}: sources[{i}]: repeat must be >= 1 and weight > 0")
            sources.append(SourceSpec(s.get("name", s["kind"]), s["kind"], tuple(resolve(f) for f in s["files"]),
                                      s.get("split"), int(s.get("repeat", 1)), float(s.get("weight", 1.0))))
        spec = cls(
            name=str(raw.get("name", Path(path).stem)), sources=tuple(sources),
            image_data=resolve(raw["image_data"]) if raw.get("image_data") else None,
            image_map=resolve(raw["image_map"]) if raw.get("image_map") else None,
            heldout=tuple(resolve(p) for p in raw.get("heldout", [])), drop=tuple(resolve(p) for p in raw.get("drop", [])),
            drop_coco_test=bool(raw.get("drop_coco_test", True)),
            top_k=int(top_k or (raw.get("answers") or {}).get("top_k", 9500)), raw=raw,
        )
        missing = [str(p) for p in spec.all_files() if not p.exists()]
        if missing:
            raise ConfigError(f"{path}: input files not found: {', '.join(missing[:10])}")
        return spec

    def all_files(self) -> list[Path]:
        files = [f for s in self.sources for f in s.files] + list(self.heldout) + list(self.drop)
        return files + [p for p in (self.image_data, self.image_map) if p]


def _read_ids(paths) -> set[str]:
    ids = set()
    for path in paths:
        ids.update(line.strip() for line in Path(path).read_text().splitlines() if line.strip())
    return ids


def _iter_source(spec: MixtureSpec, src: SourceSpec) -> Iterator[tuple[str, TextItem]]:
    """(source name, item) in file order."""
    if src.kind == "coco_captions":
        for f in src.files:
            yield from ((src.name, it) for it in read_coco_captions(f))
    elif src.kind == "vg_regions":
        for f in src.files:
            yield from ((src.name, it) for it in read_vg_regions(f))
    elif src.kind == "vqa":
        for q, a in zip(src.files[::2], src.files[1::2]):
            yield from ((src.name, it) for it in read_vqa(q, a))
    elif src.kind == "gqa":
        for f in src.files:
            yield from ((src.name, it) for it in read_gqa(f))
    elif src.kind == "vgqa":
        for f in src.files:
            yield from ((src.name, it) for it in read_vgqa(f))
    elif src.kind == "lxmert":
        for f in src.files:
            yield from read_lxmert(f)
    else:  # conceptual_captions: the dataset reader owns the TSV format and the ids
        from pipeline.datasets import Malformed, read_items

        for result in read_items("conceptual_captions", list(src.files)):
            if isinstance(result, Malformed):
                raise ConfigError(f"malformed Conceptual Captions row at {result}")
            for text in result.texts:
                yield src.name, TextItem(result.image_id, text.text, "caption")


def build_mixture(spec: MixtureSpec, out: Path, stores: tuple[Path, ...] = (), drop_missing: bool = False,
                  progress: Optional[Callable[[int], None]] = None) -> dict:
    """Build the mixture into `out`; returns the manifest."""
    from pipeline.store import FeatureStore

    ids = ImageIds(spec.image_data, [f for s in spec.sources if s.kind == "coco_captions" for f in s.files],
                   spec.image_map)
    heldout, dropped = _read_ids(spec.heldout), _read_ids(spec.drop)
    feature_stores = [FeatureStore.open(p) for p in stores]

    def split_of(src: SourceSpec, image: str) -> Optional[str]:
        if image in dropped or (spec.drop_coco_test and image.startswith("COCO_test")):
            return None
        return "val" if (src.split == "val" or image in heldout) else "train"

    # Pass 1: answer counts over training questions (only QA sources are read).
    counts: Counter = Counter()
    for src in spec.sources:
        if src.kind not in ("vqa", "gqa", "vgqa", "lxmert"):
            continue
        for _, item in _iter_source(spec, src):
            if item.answers and split_of(src, ids.canonical(item)) == "train":
                counts.update(a for a, s in item.answers.items() if s > 0)
    table = answer_table(counts, spec.top_k)
    index = {a: i for i, a in enumerate(table)}

    # Pass 2: items.
    tmp = tmp_path_for(out)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    stats = defaultdict(Counter)  # (source) -> split/kind counts
    images = defaultdict(set)  # source -> canonical image ids
    missing: dict[str, int] = {}
    answered = covered = 0
    score_total = score_covered = 0.0
    columns: dict[str, list] = {f.name: [] for f in ITEMS_SCHEMA}
    with pa.OSFile(str(tmp / "items.arrow"), "wb") as sink, pa.ipc.new_file(sink, ITEMS_SCHEMA) as writer:
        def flush() -> None:
            if columns["uid"]:
                writer.write_batch(pa.RecordBatch.from_pydict(columns, schema=ITEMS_SCHEMA))
                for values in columns.values():
                    values.clear()

        for src in spec.sources:
            per_image = Counter()
            for name, item in _iter_source(spec, src):
                image = ids.canonical(item)
                split = split_of(src, image)
                if split is None:
                    stats[name]["dropped"] += 1
                    continue
                if feature_stores and not any(image in s for s in feature_stores):
                    missing[image] = missing.get(image, 0) + 1
                    if drop_missing:
                        stats[name]["missing_features"] += 1
                        continue
                answer_ids, answer_scores = None, None
                if item.kind == "question" and item.answers is not None:
                    kept = sorted((index[a], s) for a, s in item.answers.items() if a in index)
                    answer_ids, answer_scores = [i for i, _ in kept], [s for _, s in kept]
                    if split == "train" and item.answers:  # all answers may normalize away ("the")
                        answered += 1
                        best = max(item.answers.items(), key=lambda kv: (kv[1], kv[0]))[0]
                        covered += best in index
                        score_total += sum(item.answers.values())
                        score_covered += sum(s for a, s in item.answers.items() if a in index)
                for r in range(src.repeat):
                    n = per_image[(name, image)]
                    per_image[(name, image)] += 1
                    columns["uid"].append(f"{image}_{name}_{n:03d}" + (f"_r{r}" if r else ""))
                    columns["image_id"].append(image)
                    columns["store_key"].append(image)
                    columns["text"].append(item.text)
                    columns["kind"].append(item.kind)
                    columns["source"].append(name)
                    columns["split"].append(split)
                    columns["weight"].append(src.weight)
                    columns["answer_ids"].append(answer_ids)
                    columns["answer_scores"].append(answer_scores)
                    stats[name][f"{split}/{item.kind}"] += 1
                    if len(columns["uid"]) >= BATCH:
                        flush()
                images[name].add(image)
                if progress:
                    progress(1)
        flush()
    if missing and not drop_missing:
        shutil.rmtree(tmp)
        examples = ", ".join(sorted(missing)[:20])
        raise ConfigError(f"{len(missing)} images have no features in the given stores (e.g. {examples}); "
                          "extract them, or pass --drop-missing to leave their items out")

    groups = _identity_groups(images, ids)
    manifest = {
        "format": "vlprep-mixture", "schema_version": MIXTURE_SCHEMA_VERSION, "name": spec.name,
        "producer": f"vlprep {__version__} build-mixture",
        "spec": spec.raw,
        "inputs": [{"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in spec.all_files()],
        "counts": {name: dict(sorted(c.items())) for name, c in stats.items()},
        "totals": dict(sorted(sum((Counter({k: v for k, v in c.items() if "/" in k}) for c in stats.values()), Counter()).items())),
        "images": {name: len(v) for name, v in images.items()},
        "identity_groups": groups,
        "answers": {"table_size": len(table), "top_k": spec.top_k, "distinct_train_answers": len(counts),
                    "questions_best_answer_covered": round(covered / answered, 4) if answered else None,
                    "score_mass_covered": round(score_covered / score_total, 4) if score_total else None},
        "stores": [str(p) for p in stores],
        "missing_features": {"images": len(missing), "items_dropped": sum(missing.values()) if drop_missing else 0,
                             "examples": sorted(missing)[:50]},
    }
    atomic_write_json(tmp / "answers.json", {"answers": table, "counts": [counts[a] for a in table]})
    atomic_write_json(tmp / "manifest.json", manifest)
    (tmp / "report.md").write_text(render_report(manifest))
    commit_path(tmp, out)
    return manifest


def _identity_groups(images: dict[str, set], ids: ImageIds) -> dict:
    """LXMERT Table 1: images split into COCO-only / COCO∩VG / VG-only, per source."""
    in_vg = set(ids.vg_to_coco.values())

    def group(image: str) -> str:
        if image.startswith("COCO_") or image in ids.coco_images:
            return "COCO∩VG" if image in in_vg else "COCO−VG"
        return "VG−COCO" if image.isdigit() else "other"

    out: dict = {}
    every = set().union(*images.values()) if images else set()
    for name, imgs in list(images.items()) + [("all", every)]:
        out[name] = dict(sorted(Counter(group(i) for i in imgs).items()))
    return out


def render_report(m: dict) -> str:
    lines = [f"# Mixture `{m['name']}`", "", f"Built by {m['producer']}.", "", "## Items per source", "",
             "| source | " + " | ".join(sorted(m["totals"])) + " | images |", "|---" * (len(m["totals"]) + 2) + "|"]
    for name, c in m["counts"].items():
        lines.append(f"| {name} | " + " | ".join(f"{c.get(k, 0):,}" for k in sorted(m["totals"])) + f" | {m['images'].get(name, 0):,} |")
    lines.append("| **all** | " + " | ".join(f"{v:,}" for _, v in sorted(m["totals"].items())) + " | |")
    groups = sorted({g for c in m["identity_groups"].values() for g in c})
    lines += ["", "## Images by identity (as LXMERT's Table 1)", "", "| source | " + " | ".join(groups) + " |",
              "|---" * (len(groups) + 1) + "|"]
    for name, c in m["identity_groups"].items():
        lines.append(f"| {name} | " + " | ".join(f"{c.get(g, 0):,}" for g in groups) + " |")
    a = m["answers"]
    lines += ["", "## Answers", "", f"- answer table: {a['table_size']:,} of {a['distinct_train_answers']:,} distinct "
              f"training answers (top {a['top_k']:,})",
              f"- training questions whose best answer is in the table: {a['questions_best_answer_covered']}",
              f"- answer score mass covered: {a['score_mass_covered']}"]
    mf = m["missing_features"]
    if m["stores"]:
        lines += ["", "## Features", "", f"- stores: {', '.join(m['stores'])}",
                  f"- images without features: {mf['images']:,} (items dropped: {mf['items_dropped']:,})"]
    return "\n".join(lines) + "\n"
