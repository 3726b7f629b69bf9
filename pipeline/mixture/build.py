"""`vlprep build-mixture`: text sources + a spec -> one reproducible mixture.

Spec (YAML, see data_manifests/mixtures/):

    name: lxmert
    root: /data            # relative file paths are under it (default: the spec's folder)
    image_data: vg/image_data.json      # VG -> COCO identity (optional)
    image_map: image_map.tsv            # annotation id <TAB> store key (optional; one file or a list)
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
    answers: {top_k: 9500}           # the 9500 most frequent training answers; 0: no answer table
    # answers_from: lxmert/all_ans.json   # or exactly this table, in its order (answers.top_k: its first K)

The spec is checked against `SPEC_SCHEMA` (pipeline.schema): unknown keys, wrong types,
``split`` other than train/val, ``repeat`` < 1, ``weight`` not finite and > 0, ``top_k`` < 0
are ConfigErrors naming the file and the key.

Answers: normalized (`pipeline.items.answers`), with the official VQA soft scores (0.3 /
0.6 / 0.9 / 1.0 for 1 / 2 / 3 / 4+ annotators; mixture schema 2; schema 1 used min(1, k/3)).
The answer table is the ``top_k`` most frequent training answers, or, with ``answers_from``,
a fixed table read from that file (``.json``: a list of strings, a list of ``{"ans": ...}``
objects as LXMERT's ``all_ans.json``, or a mixture's ``{"answers": [...]}``; other files: one
answer a line), in the file's order; ``answers.top_k`` (or ``--top-k``) then keeps its first
K entries. Answers outside the table are dropped and counted in the coverage figures.

Items whose image is held out (or whose source says ``split: val``) go to the ``val``
split; every other item is ``train``. Held-out and drop lists may name an image as the
annotation files do (VG id, COCO file stem) or by its store key: they go through the same
identity as the items, and the manifest counts how many of their ids matched an image (a
held-out list matching none is an error). Annotations with a null or blank text, or a null
answer, are skipped and counted per source and reason. Items are written in spec order,
file order, so the same inputs and spec give byte-identical outputs. Output folder:
``items.arrow``, ``answers.json``, ``manifest.json``, ``report.md``, built under a
temporary name beside it and swapped in when complete; an existing folder is replaced only
when it is an earlier mixture (`pipeline.io.replacing_output`).

The format written (`ITEMS_SCHEMA`, schema version) and its reader, `Mixture.open`, are
`pipeline.mixture.mixture`'s, the folder's files and writer `pipeline.items`'; the sources' files are read through
`pipeline.mixture.sources` (which reads them with `pipeline.sources`).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from pipeline import __version__
from pipeline.errors import ConfigError
from pipeline.io import load_yaml, replacing_output, sha256_file
from pipeline.items import ItemsWriter
from pipeline.items.answers import answer_table, fixed_table, read_answer_file
from pipeline.mixture.mixture import ANSWER_SCORES, FORMAT, ITEMS_SCHEMA, MIXTURE_SCHEMA_VERSION, mixture_manifest
from pipeline.mixture.sources import KINDS, QUESTION_KINDS, ImageIds, read_source
from pipeline.schema import Field, Schema
from pipeline.sources.base import Skip

__all__ = ["KINDS", "SPEC_SCHEMA", "MixtureSpec", "SourceSpec", "build_mixture", "render_report"]
log = logging.getLogger(__name__)
SPLITS = ("train", "val")
DEFAULT_TOP_K = 9500
LISTED_EXAMPLES = 20

SOURCE_SCHEMA = Schema(
    {
        "name": Field(str),  # default: the kind
        "kind": Field(str, required=True, choices=KINDS),
        "files": Field(str, many=True, required=True),
        "split": Field(str, choices=SPLITS),  # val: every item of the source is val
        "repeat": Field(int, default=1, ge=1),
        "weight": Field(float, default=1.0, gt=0),
    }
)
SPEC_SCHEMA = Schema(
    {
        "name": Field(str),  # default: the spec file's stem
        "root": Field(str),
        "image_data": Field(str),
        "image_map": Field(str, many=True, default=()),  # one file, or a list of them
        "sources": Field(SOURCE_SCHEMA, many=True, required=True),
        "heldout": Field(str, many=True, default=()),
        "drop": Field(str, many=True, default=()),
        "drop_coco_test": Field(bool, default=True),
        "answers": Field(Schema({"top_k": Field(int, ge=0)})),  # default: DEFAULT_TOP_K, or all of answers_from
        "answers_from": Field(str),
    }
)


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
    image_map: tuple[Path, ...] = ()  # TSVs: image id in the annotation files <TAB> id in the feature stores
    heldout: tuple[Path, ...] = ()
    drop: tuple[Path, ...] = ()
    drop_coco_test: bool = True
    top_k: Optional[int] = DEFAULT_TOP_K  # None: every entry of answers_from
    answers_from: Optional[Path] = None  # a fixed answer table (see the module docstring)
    raw: dict = field(default_factory=dict)
    path: Optional[Path] = None  # the spec file (an input: the output may not overlap it)

    @classmethod
    def load(cls, path: Path, root: Optional[Path] = None, top_k: Optional[int] = None) -> "MixtureSpec":
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: cannot read the mixture spec: {err}") from err
        raw = load_yaml(text, str(path))  # no aliases, bounded depth, one-line errors
        one_map = isinstance(raw, dict) and isinstance(raw.get("image_map"), str)
        spec = SPEC_SCHEMA.validate({**raw, "image_map": [raw["image_map"]]} if one_map else raw, str(path))
        if top_k is not None and top_k < 0:
            raise ConfigError(f"--top-k must be >= 0 (got {top_k})")
        top_k = top_k if top_k is not None else spec["answers"]["top_k"]
        if spec["answers_from"] is None and top_k is None:
            top_k = DEFAULT_TOP_K
        if spec["answers_from"] is not None and top_k == 0:
            raise ConfigError(
                f"{path}: answers.top_k: 0 (or --top-k 0: no answer table) contradicts answers_from: "
                f"{spec['answers_from']}; drop one of them"
            )
        base = Path(root or spec["root"] or Path(path).parent)
        resolve = lambda p: Path(p) if Path(p).is_absolute() else base / p  # noqa: E731
        sources: list[SourceSpec] = []
        for i, s in enumerate(spec["sources"]):
            if s["kind"] == "vqa" and len(s["files"]) % 2:
                raise ConfigError(f"{path}: sources[{i}] (vqa) lists questions/annotations files in pairs")
            name = s["name"] or s["kind"]
            if any(other.name == name for other in sources):
                raise ConfigError(
                    f"{path}: sources[{i}]: the name {name!r} is taken by another source; "
                    "give each source its own name (it is part of the item uids)"
                )
            sources.append(
                SourceSpec(name, s["kind"], tuple(resolve(f) for f in s["files"]), s["split"], s["repeat"], s["weight"])
            )
        mixture = cls(
            name=spec["name"] or Path(path).stem,
            sources=tuple(sources),
            image_data=resolve(spec["image_data"]) if spec["image_data"] else None,
            image_map=tuple(resolve(p) for p in spec["image_map"]),
            heldout=tuple(resolve(p) for p in spec["heldout"]),
            drop=tuple(resolve(p) for p in spec["drop"]),
            drop_coco_test=spec["drop_coco_test"],
            top_k=top_k,
            answers_from=resolve(spec["answers_from"]) if spec["answers_from"] else None,
            raw=raw,
            path=Path(path),
        )
        missing = [str(p) for p in mixture.all_files() if not p.exists()]
        if missing:
            raise ConfigError(f"{path}: input files not found: {', '.join(missing[:10])}")
        return mixture

    def all_files(self) -> list[Path]:
        files = [f for s in self.sources for f in s.files] + list(self.heldout) + list(self.drop)
        return files + list(self.image_map) + [p for p in (self.image_data, self.answers_from) if p]


def _read_id_list(path: Path, ids: ImageIds) -> dict[str, str]:
    """Held-out or drop list, one image id a line: id as written -> canonical id."""
    raw = (line.strip() for line in Path(path).read_text().splitlines())
    return {image: ids.canonical_id(image) for image in raw if image}


def _list_matches(path: Path, listed: dict[str, str], seen: set[str]) -> dict:
    unmatched = sorted(image for image, canonical in listed.items() if canonical not in seen)
    return {
        "path": str(path),
        "ids": len(listed),
        "matched": len(listed) - len(unmatched),
        "unmatched": len(unmatched),
        "unmatched_examples": unmatched[:LISTED_EXAMPLES],
    }


def _is_mixture(path: Path) -> bool:
    """A mixture written before the ownership marker existed: its manifest.json says so."""
    return mixture_manifest(path) is not None


def build_mixture(
    spec: MixtureSpec,
    out: Path,
    stores: tuple[Path, ...] = (),
    drop_missing: bool = False,
    progress: Optional[Callable[[int], None]] = None,
) -> dict:
    """Build the mixture into `out`; returns the manifest.

    Before any work: every store must exist, and `out` must be a new or empty folder or an
    earlier mixture (not `.`, a folder above the current one, a symbolic link, or a folder
    overlapping the spec, its input files or the stores): ConfigError otherwise. The build
    holds a lock beside `out` (a second build of the same `out` gets BusyError), removes the
    temporary folders of killed builds of `out`, and removes its own on any failure."""
    from pipeline.store import FeatureStore

    missing_stores = [str(p) for p in stores if not Path(p).exists()]
    if missing_stores:
        raise ConfigError(f"--stores: not found: {', '.join(missing_stores)}")
    inputs = ([spec.path] if spec.path else []) + spec.all_files() + [Path(p) for p in stores]
    with replacing_output(Path(out), FORMAT, inputs=inputs, what="vlprep build-mixture", also_ours=_is_mixture) as tmp:
        tmp.mkdir()
        return _build(spec, tmp, stores, [FeatureStore.open(p) for p in stores], drop_missing, progress)


def _build(
    spec: MixtureSpec,
    tmp: Path,
    stores: tuple[Path, ...],
    feature_stores: list,
    drop_missing: bool,
    progress: Optional[Callable[[int], None]],
) -> dict:
    """Two passes over the sources (the training answers' counts, then the items) into the
    folder `tmp`, then the checks of what they found, the manifest and the answer table."""
    selection = _Selection.of(spec, feature_stores)
    counts = _train_answer_counts(spec, selection, drop_missing)
    answers = _AnswerTable.of(spec, counts)
    with ItemsWriter(tmp, ITEMS_SCHEMA) as writer:
        written = _write_items(writer, spec, selection, answers.index, drop_missing, progress)
    if written.missing and not drop_missing:
        examples = ", ".join(sorted(written.missing)[:LISTED_EXAMPLES])
        raise ConfigError(
            f"{len(written.missing)} images have no features in the given stores (e.g. {examples}); "
            "extract them, or pass --drop-missing to leave their items out"
        )
    heldout_matches = [_list_matches(p, listed, written.seen) for p, listed in selection.heldout_lists.items()]
    drop_matches = [_list_matches(p, listed, written.seen) for p, listed in selection.drop_lists.items()]
    _check_lists(heldout_matches, drop_matches)
    for name, reasons in written.skipped.items():
        log.warning("%s: skipped %s", name, ", ".join(f"{n:,} x {reason}" for reason, n in sorted(reasons.items())))

    manifest = {
        "format": FORMAT,
        "schema_version": MIXTURE_SCHEMA_VERSION,
        "answer_scores": ANSWER_SCORES,
        "name": spec.name,
        "producer": f"vlprep {__version__} build-mixture",
        "spec": spec.raw,
        "inputs": [{"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in spec.all_files()],
        **written.counts(),
        "identity_groups": _identity_groups(written.images, selection.ids),
        "heldout": heldout_matches,
        "drop": drop_matches,
        "answers": {**answers.info(spec), "distinct_train_answers": len(counts), **written.coverage()},
        "stores": [str(p) for p in stores],
        "missing_features": {
            "images": len(written.missing),
            "items_dropped": sum(written.missing.values()) if drop_missing else 0,
            "examples": sorted(written.missing)[:50],
        },
    }
    dead = set(answers.unreachable)
    table_counts = [0 if i in dead else counts[a] for i, a in enumerate(answers.table)]
    writer.finish(
        answers={"answers": answers.table, "counts": table_counts, "unreachable": answers.unreachable},
        report=render_report(manifest),
        manifest=manifest,
    )
    return manifest


@dataclass
class _Selection:
    """Which split an annotation's image goes to: the identity of image ids, the held-out and
    drop lists (each: id as written -> canonical id) and the feature stores to look in."""

    spec: MixtureSpec
    ids: ImageIds
    heldout_lists: dict[Path, dict[str, str]]
    drop_lists: dict[Path, dict[str, str]]
    feature_stores: list

    @classmethod
    def of(cls, spec: MixtureSpec, feature_stores: list) -> "_Selection":
        ids = ImageIds(
            spec.image_data, [f for s in spec.sources if s.kind == "coco_captions" for f in s.files], spec.image_map
        )
        heldout_lists = {p: _read_id_list(p, ids) for p in spec.heldout}
        drop_lists = {p: _read_id_list(p, ids) for p in spec.drop}
        return cls(spec, ids, heldout_lists, drop_lists, feature_stores)

    def __post_init__(self) -> None:
        self.heldout = {c for listed in self.heldout_lists.values() for c in listed.values()}
        self.dropped = {c for listed in self.drop_lists.values() for c in listed.values()}
        self.listed = self.heldout | self.dropped

    def has_features(self, image: str) -> bool:
        return not self.feature_stores or any(image in s for s in self.feature_stores)

    def split_of(self, src: SourceSpec, image: str) -> Optional[str]:
        """ "train" or "val", None when the image is dropped."""
        if image in self.dropped or (self.spec.drop_coco_test and image.startswith("COCO_test")):
            return None
        return "val" if (src.split == "val" or image in self.heldout) else "train"


def _train_answer_counts(spec: MixtureSpec, selection: _Selection, drop_missing: bool) -> Counter:
    """Pass 1: answer counts over the training questions that will be written (QA sources only)."""
    counts: Counter = Counter()
    for src in spec.sources:
        if src.kind not in QUESTION_KINDS:
            continue
        for _, item in read_source(src.kind, src.name, src.files):
            if isinstance(item, Skip) or not item.answers:
                continue
            image = selection.ids.canonical(item)
            if selection.split_of(src, image) == "train" and (selection.has_features(image) or not drop_missing):
                counts.update(a for a, s in item.answers.items() if s > 0)
    return counts


@dataclass
class _AnswerTable:
    """The answer table: the file's entries (`answers_from`; else none), the answers by id,
    the id of each answer, and the ids of entries no answer maps to."""

    entries: list
    table: list[str]
    index: dict[str, int]
    unreachable: list[int]

    @classmethod
    def of(cls, spec: MixtureSpec, counts: Counter) -> "_AnswerTable":
        """The ``top_k`` most frequent of `counts`, or the fixed table of `spec.answers_from`."""
        if spec.answers_from is None:
            table = answer_table(counts, top_k=spec.top_k)
            return cls([], table, {a: i for i, a in enumerate(table)}, [])
        entries = read_answer_file(spec.answers_from)
        fixed = fixed_table(entries[: spec.top_k] if spec.top_k is not None else entries, spec.answers_from)
        table, index, unreachable = fixed.answers, fixed.index, fixed.unreachable
        if unreachable:
            log.warning(
                "%s: %d of its %d entries normalize to nothing or to an earlier entry's answer (e.g. entry "
                "%d %r); they keep their answer ids, but no item maps to them",
                spec.answers_from,
                len(unreachable),
                len(table),
                unreachable[0],
                entries[unreachable[0]],
            )
        return cls(entries, table, index, unreachable)

    def info(self, spec: MixtureSpec) -> dict:
        """The manifest's description of the table."""
        info: dict = {"table_size": len(self.table), "top_k": spec.top_k}
        if spec.answers_from is not None:
            info["file"] = {
                "path": str(spec.answers_from),
                "name": spec.answers_from.name,
                "entries": len(self.entries),
                "sha256": sha256_file(spec.answers_from),
            }
            info["unreachable"] = len(self.unreachable)
            info["unreachable_examples"] = [
                {"id": i, "entry": self.entries[i], "answer": self.table[i], "first_id": self.index.get(self.table[i])}
                for i in self.unreachable[:LISTED_EXAMPLES]
            ]
        return info


@dataclass
class _Written:
    """What pass 2 wrote and met, per source: split/kind counts, skips by reason, canonical
    image ids; the listed images the annotations name, the images without features (->
    their items), and the training questions' answer coverage."""

    stats: defaultdict = field(default_factory=lambda: defaultdict(Counter))
    skipped: defaultdict = field(default_factory=lambda: defaultdict(Counter))
    images: defaultdict = field(default_factory=lambda: defaultdict(set))
    seen: set = field(default_factory=set)
    missing: dict = field(default_factory=dict)
    answered: int = 0
    covered: int = 0
    score_total: float = 0.0
    score_covered: float = 0.0

    def counts(self) -> dict:
        """The manifest's counts, totals, skips and images per source."""
        stats = self.stats
        totals = sum((Counter({k: v for k, v in c.items() if "/" in k}) for c in stats.values()), Counter())
        return {
            "counts": {name: dict(sorted(c.items())) for name, c in stats.items()},
            "totals": dict(sorted(totals.items())),
            "skipped": {name: dict(sorted(c.items())) for name, c in self.skipped.items()},
            "images": {name: len(v) for name, v in self.images.items()},
        }

    def coverage(self) -> dict:
        """How much of the training questions' answers the table covers."""
        answered, total = self.answered, self.score_total
        return {
            "questions_best_answer_covered": round(self.covered / answered, 4) if answered else None,
            "score_mass_covered": round(self.score_covered / total, 4) if total else None,
        }


def _write_items(
    writer: ItemsWriter,
    spec: MixtureSpec,
    selection: _Selection,
    index: dict[str, int],
    drop_missing: bool,
    progress: Optional[Callable[[int], None]],
) -> _Written:
    """Pass 2: every source's items, in spec order, file order (each `repeat` times), their
    answers as ids of `index`."""
    written = _Written()
    for src in spec.sources:
        per_image = Counter()
        for name, item in read_source(src.kind, src.name, src.files):
            if isinstance(item, Skip):
                written.skipped[name][item.reason] += 1
                continue
            image = selection.ids.canonical(item)
            if image in selection.listed:
                written.seen.add(image)
            split = selection.split_of(src, image)
            if split is None:
                written.stats[name]["dropped"] += 1
                continue
            if not selection.has_features(image):
                written.missing[image] = written.missing.get(image, 0) + 1
                if drop_missing:
                    written.stats[name]["missing_features"] += 1
                    continue
            answer_ids, answer_scores = None, None
            if item.kind == "question" and item.answers is not None:
                kept = sorted((index[a], s) for a, s in item.answers.items() if a in index)
                answer_ids, answer_scores = [i for i, _ in kept], [s for _, s in kept]
                if split == "train" and item.answers:  # all answers may normalize away ("the")
                    written.answered += 1
                    best = max(item.answers.items(), key=lambda kv: (kv[1], kv[0]))[0]
                    written.covered += best in index
                    written.score_total += sum(item.answers.values())
                    written.score_covered += sum(s for a, s in item.answers.items() if a in index)
            for r in range(src.repeat):
                n = per_image[(name, image)]
                per_image[(name, image)] += 1
                writer.add(
                    {
                        "uid": f"{image}_{name}_{n:03d}" + (f"_r{r}" if r else ""),
                        "image_id": image,
                        "store_key": image,
                        "text": item.text,
                        "kind": item.kind,
                        "source": name,
                        "split": split,
                        "weight": src.weight,
                        "answer_ids": answer_ids,
                        "answer_scores": answer_scores,
                    }
                )
                written.stats[name][f"{split}/{item.kind}"] += 1
            written.images[name].add(image)
            if progress:
                progress(1)
    return written


def _check_lists(heldout: list[dict], drop: list[dict]) -> None:
    """A held-out list that matches no image is an error (its images would all reach train);
    unmatched ids of any list are a warning."""
    for entry in heldout:
        if not entry["matched"]:
            examples = ", ".join(entry["unmatched_examples"][:5])
            raise ConfigError(
                f"{entry['path']}: none of its {entry['ids']} ids names an image of the mixture "
                f"(e.g. {examples}); list the annotation files' image ids (COCO file stems, VG ids) "
                "or the store keys"
            )
    for what, entries in (("held-out", heldout), ("drop", drop)):
        for entry in entries:
            if entry["unmatched"]:
                log.warning(
                    "%s list %s: %d of its %d ids match no image (e.g. %s)",
                    what,
                    entry["path"],
                    entry["unmatched"],
                    entry["ids"],
                    ", ".join(entry["unmatched_examples"][:5]),
                )


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
    lines = [
        f"# Mixture `{m['name']}`",
        "",
        f"Built by {m['producer']}.",
        "",
        "## Items per source",
        "",
        "| source | " + " | ".join(sorted(m["totals"])) + " | images |",
        "|---" * (len(m["totals"]) + 2) + "|",
    ]
    for name, c in m["counts"].items():
        lines.append(
            f"| {name} | "
            + " | ".join(f"{c.get(k, 0):,}" for k in sorted(m["totals"]))
            + f" | {m['images'].get(name, 0):,} |"
        )
    lines.append("| **all** | " + " | ".join(f"{v:,}" for _, v in sorted(m["totals"].items())) + " | |")
    groups = sorted({g for c in m["identity_groups"].values() for g in c})
    lines += [
        "",
        "## Images by identity (as LXMERT's Table 1)",
        "",
        "| source | " + " | ".join(groups) + " |",
        "|---" * (len(groups) + 1) + "|",
    ]
    for name, c in m["identity_groups"].items():
        lines.append(f"| {name} | " + " | ".join(f"{c.get(g, 0):,}" for g in groups) + " |")
    a = m["answers"]
    lines += [
        "",
        "## Answers",
        "",
        f"- soft scores: {m['answer_scores']} (0.3 / 0.6 / 0.9 / 1.0 for 1 / 2 / 3 / 4+ annotators)",
    ]
    if "file" in a:
        f = a["file"]
        lines += [
            f"- answer table: {a['table_size']:,} answers from {f['name']} (`{f['path']}`, sha256 {f['sha256']}"
            + (f"; its first {a['table_size']:,} of {f['entries']:,} entries)" if a["top_k"] is not None else ")"),
            f"- table entries no item maps to (empty, or an earlier entry's answer once normalized): "
            f"{a['unreachable']:,}",
            f"- distinct training answers: {a['distinct_train_answers']:,}",
        ]
    else:
        lines += [
            f"- answer table: {a['table_size']:,} of {a['distinct_train_answers']:,} distinct "
            f"training answers (top {a['top_k']:,})"
        ]
    lines += [
        f"- training questions whose best answer is in the table: {a['questions_best_answer_covered']}",
        f"- answer score mass covered: {a['score_mass_covered']}",
    ]
    reasons = sorted({r for c in m["skipped"].values() for r in c})
    if reasons:
        lines += [
            "",
            "## Skipped annotations",
            "",
            "| source | " + " | ".join(reasons) + " |",
            "|---" * (len(reasons) + 1) + "|",
        ]
        for name, c in m["skipped"].items():
            lines.append(f"| {name} | " + " | ".join(f"{c.get(r, 0):,}" for r in reasons) + " |")
    if m["heldout"] or m["drop"]:
        lines += ["", "## Held-out and drop lists", ""]
        for what in ("heldout", "drop"):
            for e in m[what]:
                lines.append(
                    f"- {what} `{e['path']}`: {e['matched']:,} of {e['ids']:,} ids matched an image"
                    + (f" (unmatched e.g. {', '.join(e['unmatched_examples'][:5])})" if e["unmatched"] else "")
                )
    mf = m["missing_features"]
    if m["stores"]:
        lines += [
            "",
            "## Features",
            "",
            f"- stores: {', '.join(m['stores'])}",
            f"- images without features: {mf['images']:,} (items dropped: {mf['items_dropped']:,})",
        ]
    return "\n".join(lines) + "\n"
