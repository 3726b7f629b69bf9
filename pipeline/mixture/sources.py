"""The text items of a pretraining mixture, from the records of `pipeline.sources`.

`pipeline.sources` parses the official files (one reader per format: COCO captions, VG
region descriptions and QA, VQA, GQA, LXMERT's json, the CC TSV); this module turns a spec
source (`read_source`: its kind and files) into `TextItem`s in file order, with answers
normalized and soft-scored (`pipeline.items.answers`), and passes `Skip`s through to be
counted (null or blank texts, null answers). A mixture is built from clean inputs: the first
malformed row of any file is a ConfigError naming it (``file:where: reason``), and so is a
file that cannot be read at all (`pipeline.sources.base.reading`).

Image identity: COCO images are named by their file stem (``COCO_train2014_000000000009``),
VG images by their VG id; `ImageIds` maps a VG image that is also in COCO to the COCO name
(through VG's ``coco_id``), as LXMERT does, then renames ids through an image map.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence, TypeVar, Union

from pipeline.errors import ConfigError
from pipeline.items.answers import normalize_answer, soft_scores
from pipeline.items.image_map import read_image_maps
from pipeline.sources import coco, conceptual_captions, gqa, lxmert, visual_genome, vqa
from pipeline.sources.base import Malformed, Skip, named_read_errors, reading

T = TypeVar("T")


@dataclass(frozen=True)
class TextItem:
    """One text of a mixture — a caption, region description or question — about an image,
    with its normalized answers: it becomes a row of ``items.arrow``. Not a
    `pipeline.download.source_item.SourceItem`, which is an image to fetch (URL or path, carrying its
    texts along): a mixture item is one text (many per image), needs no URL, and names its
    image as the annotation file does, before `ImageIds` makes it canonical."""

    image: str  # a COCO stem, a VG id, or another source's image id
    text: str  # whitespace-normalized, not blank (`pipeline.sources.base.clean_text`)
    kind: str  # "caption" | "question"
    answers: Optional[dict[str, float]] = None  # normalized answer -> soft score (questions)
    in_vg: bool = False  # `image` is a VG id (a VG image that is also in COCO takes its COCO name)


Read = Union[TextItem, Skip]


def _refused(row: Malformed) -> ConfigError:
    return ConfigError(f"{row.path}:{row.where}: {row.reason}")


def refuse_malformed(results: Iterable[Union[T, Malformed]]) -> Iterator[T]:
    """`results` with the first `Malformed` raised as a ConfigError naming file and row."""
    for result in results:
        if isinstance(result, Malformed):
            raise _refused(result)
        yield result


def _coco_captions(path: Path) -> coco.CocoCaptions:
    """A COCO captions file; ConfigError naming its first malformed row."""
    with reading(str(path)):
        captions = coco.read_captions(path)
    if captions.malformed:
        raise _refused(captions.malformed[0])
    return captions


def _one_answer(answer: str) -> dict[str, float]:
    """A single given answer (GQA, VG-QA) as soft scores; empty when it normalizes away ("the")."""
    key = normalize_answer(answer)
    return {key: 1.0} if key else {}


def _labels(label: dict[str, float]) -> dict[str, float]:
    """LXMERT's answer -> score label, normalized (answers that merge keep the highest score)."""
    answers: dict[str, float] = {}
    for answer, score in label.items():
        key = normalize_answer(answer)
        if key:
            answers[key] = max(answers.get(key, 0.0), float(score))
    return answers


def read_coco_captions(path: Path) -> Iterator[Read]:
    for c in _coco_captions(path).captions:
        yield c if isinstance(c, Skip) else TextItem(c.image, c.text, "caption")


def read_vg_regions(path: Path) -> Iterator[Read]:
    for r in refuse_malformed(visual_genome.read_region_descriptions(path)):
        yield r if isinstance(r, Skip) else TextItem(r.image, r.text, "caption", in_vg=True)


def read_vgqa(path: Path) -> Iterator[Read]:
    for q in refuse_malformed(visual_genome.read_question_answers(path)):
        yield q if isinstance(q, Skip) else TextItem(q.image, q.text, "question", _one_answer(q.answer), in_vg=True)


def read_vqa(questions: Path, annotations: Path) -> Iterator[Read]:
    for q in refuse_malformed(vqa.read_vqa(questions, annotations)):
        yield q if isinstance(q, Skip) else TextItem(q.image, q.text, "question", soft_scores(q.answers))


def read_gqa(path: Path) -> Iterator[Read]:
    """A question without an answer (test files) is kept without answers."""
    for q in refuse_malformed(gqa.read_questions(path)):
        if isinstance(q, Skip):
            yield q
        else:
            yield TextItem(
                q.image, q.text, "question", _one_answer(q.answer) if q.answer is not None else None, in_vg=True
            )


def read_lxmert(path: Path) -> Iterator[tuple[str, Read]]:
    """(LXMERT source, item): its mscoco / vg sentences are captions, vqa / gqa / visual7w ones questions."""
    for s in refuse_malformed(lxmert.read_lxmert(path)):
        if isinstance(s, Skip):
            yield s.source, s
        else:
            yield s.source, TextItem(s.image, s.text, s.kind, _labels(s.label) if s.label is not None else None)


def read_conceptual_captions(path: Path) -> Iterator[Read]:
    for row in refuse_malformed(conceptual_captions.read_tsv(path)):
        yield row.caption if isinstance(row.caption, Skip) else TextItem(row.image_id, row.caption, "caption")


# Spec kind -> reader of one file. "vqa" reads (questions, annotations) pairs, "lxmert" files
# name their own sources: `read_source` handles both.
_FILE_READERS: dict[str, Callable[[Path], Iterator[Read]]] = {
    "coco_captions": read_coco_captions,
    "vg_regions": read_vg_regions,
    "gqa": read_gqa,
    "vgqa": read_vgqa,
    "conceptual_captions": read_conceptual_captions,
}
KINDS = ("coco_captions", "vg_regions", "vqa", "gqa", "vgqa", "lxmert", "conceptual_captions")
QUESTION_KINDS = ("vqa", "gqa", "vgqa", "lxmert")  # the kinds whose items may have answers


def read_source(kind: str, name: str, files: Sequence[Path]) -> Iterator[tuple[str, Read]]:
    """(source name, item or skip) of a spec source of `kind` named `name`, in file order;
    LXMERT's files name their own sources (mscoco, vg, vqa, gqa, visual7w)."""
    if kind == "lxmert":
        for path in files:
            yield from named_read_errors(read_lxmert(path), str(path))
        return
    if kind == "vqa":
        reads = [(f"{q}, {a}", read_vqa(q, a)) for q, a in zip(files[::2], files[1::2])]
    else:
        reads = [(str(path), _FILE_READERS[kind](path)) for path in files]
    for what, items in reads:
        for item in named_read_errors(items, what):
            yield name, item


class ImageIds:
    """VG id -> COCO stem for VG images that are also COCO images; then, with an image map
    (``source id <TAB> store key`` lines), annotation ids -> the ids the feature stores use
    (e.g. COCO-style question files over images extracted from a Conceptual-Captions TSV)."""

    def __init__(self, image_data: Optional[Path], coco_files: list[Path], image_maps: Sequence[Path] = ()):
        self.aliases = read_image_maps(image_maps)
        stems: dict[int, str] = {}
        for path in coco_files:
            stems.update((img.id, img.stem) for img in _coco_captions(path).images)
        self.vg_to_coco: dict[str, str] = {}
        self.unmatched_coco = 0
        if image_data is not None:
            for img in named_read_errors(refuse_malformed(visual_genome.read_image_data(image_data)), str(image_data)):
                if img.coco_id is not None:
                    stem = stems.get(img.coco_id)
                    if stem is None:
                        self.unmatched_coco += 1
                    else:
                        self.vg_to_coco[img.id] = stem
        self.coco_images = set(stems.values())

    def canonical(self, item: TextItem) -> str:
        image = self.vg_to_coco.get(item.image, item.image) if item.in_vg else item.image
        return self.aliases.get(image, image)

    def canonical_id(self, image: str) -> str:
        """An id from a held-out or drop list, which may name an image as the annotation files
        do (a VG id, as GQA's lists do, or a COCO file stem) or by its store key."""
        image = self.vg_to_coco.get(image, image)
        return self.aliases.get(image, image)
