"""The shapes world on disk: `write_world` writes every file, `load_scenes` reads the ground truth back.

Each image draws from its own seeded random streams (scene, texts, pairs), so the same seed
gives byte-identical files. Layout written by `write_world` (split s = train | val; image i
is 0-based within s):

    images/shapes_<s>_<i:08d>.jpg                   256x256 RGB JPEG, quality 90
    Train_GCC-training.tsv, Validation_GCC-1.1.0-Validation.tsv
                                                    caption<TAB>url, one row per image
    annotations/captions_<s>2014.json               COCO captions, image id i+1
    annotations/v2_OpenEnded_mscoco_<s>2014_questions.json, v2_mscoco_<s>2014_annotations.json
    annotations/refexp_<s>.json                     [{"image", "box", "sentence"}]
    annotations/nlvr2_<train|dev>.json              NLVR2 JSON lines, pairs within the split
    annotations/scenes_<s>.json                     ground truth (see load_scenes)
    annotations/dataset_flickr30k.json              Karpathy-format retrieval split, 5 captions per
                                                    image; train images "train", val images "val"
    annotations/refcoco+/refs(unc).p, instances.json
                                                    RefCOCO+ refs (a protocol-2 pickle) and COCO
                                                    instances; val images val/testA/testB by i % 3
    annotations/vcr/<s>.jsonl, vcr/metadata/COCO_<s>2014_<i+1:012d>.json
                                                    VCR: one 4-choice colour question per image
    image_map.tsv                                   COCO_<s>2014_<i+1:012d><TAB>cc3m-<s>-<i:08d>, then
                                                    <train|dev>-<p>-0-img<0|1><TAB>the pair's image
    vg/image_data.json, vg/region_descriptions.json Visual Genome files of the train split's images (VG id
                                                    VG_ID_BASE + i + 1; coco_id null: the world's COCO ids
                                                    repeat across splits): per object a phrase, per object
                                                    with a clearly placed neighbour a relation phrase
    vg/image_map.tsv                                <VG id><TAB>cc3m-train-<i:08d>
    objects.txt, attributes.txt                     detector vocabularies
    summary.json                                    counts, seed, vocab; written last
    .vlprep-output.json                             ownership marker: a later run may replace this folder

The task files (Flickr30k, RefCOCO+, VCR) are made by `pipeline.synthetic.tasks` from what the
splits drew, the Visual Genome files by `pipeline.synthetic.regions`; their own draws come from
streams of their own, so the other files stay as they were.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from pipeline.errors import ConfigError
from pipeline.io import atomic_write_json, replacing_output
from pipeline.synthetic.captions import captions
from pipeline.synthetic.questions import annotator_answers, questions
from pipeline.synthetic.referring import referring_expressions
from pipeline.synthetic.regions import region_descriptions
from pipeline.synthetic.render import render
from pipeline.synthetic.scenes import (
    IMAGE_SIZE,
    Scene,
    attribute_names,
    generate_scene,
    object_names,
    scene_from_json,
    scene_to_json,
)
from pipeline.synthetic.statements import pair_statements
from pipeline.synthetic.tasks import SplitDraws, retrieval_captions, task_counts, task_files, vcr_question

JPEG_QUALITY = 90


@dataclass(frozen=True)
class _Split:
    name: str  # our split name: image names, refexp/scenes files, CC ids
    index: int  # in the seed of every random stream
    coco: str  # COCO/VQA file split
    nlvr2: str  # NLVR2 file split
    tsv: str  # Conceptual Captions file


SPLITS = (
    _Split("train", 0, "train2014", "train", "Train_GCC-training.tsv"),
    _Split("val", 1, "val2014", "dev", "Validation_GCC-1.1.0-Validation.tsv"),
)
WORLD_KIND = "shapes world"  # the ownership marker's kind (pipeline.io.replacing_output)
STREAM_SCENE, STREAM_TEXT, STREAM_PAIR = 0, 1, 2
STREAM_RETRIEVAL, STREAM_VCR = 3, 4  # the task files' own draws (retrieval's extra captions, VCR)
STREAM_REGIONS = 5  # the Visual Genome region descriptions
VG_ID_BASE = 1_000_000  # VG ids of the train split's images: VG_ID_BASE + i + 1


def image_name(split: str, i: int) -> str:
    return f"shapes_{split}_{i:08d}.jpg"


def coco_file_name(coco_split: str, image_id: int) -> str:
    return f"COCO_{coco_split}_{image_id:012d}.jpg"


def store_key(split: str, i: int) -> str:
    """The feature-store key of image i of a split (the id the CC extraction gives it)."""
    return f"cc3m-{split}-{i:08d}"


def _rng(seed: int, split: _Split, index: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, split.index, index, stream])


def _dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj) + "\n", encoding="utf-8")


def _image_url(base_url: str, name: str) -> str:
    return f"{base_url.rstrip('/')}/images/{name}"


def _split_sizes(n_images: int, val_fraction: float) -> dict[str, int]:
    n_val = min(round(n_images * val_fraction), n_images - 1)
    return {"train": n_images - n_val, "val": n_val}


def write_cc_tsvs(world_dir: Path, base_url: str) -> None:
    """(Re)write the two Conceptual Captions TSVs of a world for another image base URL."""
    world_dir = Path(world_dir)
    for split in SPLITS:
        captions_json = json.loads((world_dir / "annotations" / f"captions_{split.coco}.json").read_text())
        first = {}
        for ann in captions_json["annotations"]:
            first.setdefault(ann["image_id"], ann["caption"])
        rows = [
            f"{first[i + 1]}\t{_image_url(base_url, image_name(split.name, i))}\n"
            for i in range(len(captions_json["images"]))
        ]
        (world_dir / split.tsv).write_text("".join(rows), encoding="utf-8")


def _write_vg(out: Path, split: _Split, scenes: list[Scene], seed: int, base_url: str) -> None:
    """Visual Genome's image_data.json and region_descriptions.json for a split's images, and the
    image map from their VG ids to store keys (summary.json, older than these files, does not
    count them)."""
    images, regions, lines = [], [], []
    for i, scene in enumerate(scenes):
        vg_id = VG_ID_BASE + i + 1
        url = _image_url(base_url, image_name(split.name, i))
        images.append(
            {
                "image_id": vg_id,
                "url": url,
                "width": scene.width,
                "height": scene.height,
                "coco_id": None,
                "flickr_id": None,
            }
        )
        described = region_descriptions(scene, _rng(seed, split, i, STREAM_REGIONS))
        regions.append(
            {
                "id": vg_id,
                "regions": [
                    {
                        "region_id": vg_id * 100 + j,
                        "image_id": vg_id,
                        "phrase": text,
                        "x": round(box[0]),
                        "y": round(box[1]),
                        "width": round(box[2] - box[0]),
                        "height": round(box[3] - box[1]),
                    }
                    for j, (box, text) in enumerate(described)
                ],
            }
        )
        lines.append(f"{vg_id}\t{store_key(split.name, i)}\n")
    vg = out / "vg"
    vg.mkdir()
    _dump(vg / "image_data.json", images)
    _dump(vg / "region_descriptions.json", regions)
    (vg / "image_map.tsv").write_text("".join(lines))


def _is_world(path: Path) -> bool:
    """A complete world written before the ownership marker existed: its summary.json says so."""
    try:
        return json.loads((path / "summary.json").read_text()).get("name") == "shapes"
    except (OSError, ValueError, AttributeError):
        return False


def _write_split(
    out: Path,
    split: _Split,
    n: int,
    seed: int,
    base_url: str,
    textures: bool,
    progress: Optional[Callable[[int], None]],
) -> tuple[dict, SplitDraws, list[str]]:
    """Write the split's images and files; returns its counts, its draws for the task files and
    its NLVR2 image map lines."""
    drawn = _Drawn()
    for i in range(n):
        drawn.add_image(out, split, i, seed, textures)
        if progress:
            progress(1)
    statements, nlvr2_map = _pair_statements(split, n, seed, base_url, drawn)
    _write_annotations(out / "annotations", split, seed, base_url, drawn, statements)
    counts = {
        "images": n,
        "objects": sum(len(s.objects) for s in drawn.scenes),
        "captions": len(drawn.caption_anns),
        "questions": len(drawn.question_anns),
        "refexps": len(drawn.refexps),
        "nlvr2_statements": len(statements),
        "nlvr2_true": sum(s["label"] == "True" for s in statements),
    }
    draws = SplitDraws(
        split.name,
        [coco_file_name(split.coco, i + 1) for i in range(n)],
        drawn.scenes,
        drawn.retrieval,
        drawn.referring,
        drawn.vcr,
    )
    return counts | task_counts(draws), draws, nlvr2_map


@dataclass
class _Drawn:
    """A split's images, in order, as drawn: their file names and scenes; the COCO caption
    annotations, VQA questions and answers, referring expressions; and the task files' draws
    (retrieval captions, referring expressions by object index, VCR questions)."""

    names: list = field(default_factory=list)
    scenes: list = field(default_factory=list)
    caption_anns: list = field(default_factory=list)
    question_anns: list = field(default_factory=list)
    answer_anns: list = field(default_factory=list)
    refexps: list = field(default_factory=list)
    retrieval: list = field(default_factory=list)
    referring: list = field(default_factory=list)
    vcr: list = field(default_factory=list)

    def add_image(self, out: Path, split: _Split, i: int, seed: int, textures: bool) -> None:
        """Draw image `i`'s scene and texts (each from its own random stream), save the image."""
        name = image_name(split.name, i)
        scene = generate_scene(_rng(seed, split, i, STREAM_SCENE), IMAGE_SIZE, textures)
        rng = _rng(seed, split, i, STREAM_TEXT)
        render(scene).save(out / "images" / name, "JPEG", quality=JPEG_QUALITY)
        self.names.append(name)
        self.scenes.append(scene)
        image_captions = captions(scene, rng)
        first = len(self.caption_anns) + 1
        self.caption_anns += [{"id": first + j, "image_id": i + 1, "caption": c} for j, c in enumerate(image_captions)]
        for j, qa in enumerate(questions(scene, rng)):
            qid = (i + 1) * 1000 + j
            self.question_anns.append({"image_id": i + 1, "question": qa.question, "question_id": qid})
            self.answer_anns.append(
                {
                    "question_id": qid,
                    "image_id": i + 1,
                    "question_type": qa.question_type,
                    "answer_type": qa.answer_type,
                    "multiple_choice_answer": qa.answer,
                    "answers": annotator_answers(qa, rng),
                }
            )
        image_refexps = referring_expressions(scene, rng)
        self.refexps += [{"image": name, "box": list(obj.box), "sentence": s} for obj, s in image_refexps]
        self.referring.append([(scene.objects.index(obj), s) for obj, s in image_refexps])  # boxes are unique
        self.retrieval.append(retrieval_captions(scene, image_captions, _rng(seed, split, i, STREAM_RETRIEVAL)))
        self.vcr.append(vcr_question(scene, _rng(seed, split, i, STREAM_VCR)))


def _pair_statements(split: _Split, n: int, seed: int, base_url: str, drawn: _Drawn) -> tuple[list, list[str]]:
    """NLVR2 statements about image pairs (one pair drawn per image), and the NLVR2 image map
    lines of the pairs that got any."""
    statements, nlvr2_map = [], []
    names, scenes = drawn.names, drawn.scenes
    for p in range(n if n > 1 else 0):
        rng = _rng(seed, split, p, STREAM_PAIR)
        left, right = (int(v) for v in rng.choice(n, 2, replace=False))
        pair = pair_statements(scenes[left], scenes[right], rng)
        if pair:  # the pair's official image names: the identifier, less the statement number, + -img0|1
            nlvr2_map += [
                f"{split.nlvr2}-{p}-0-img{k}\t{store_key(split.name, side)}\n" for k, side in enumerate((left, right))
            ]
        for j, (text, label) in enumerate(pair):
            statements.append(
                {
                    "identifier": f"{split.nlvr2}-{p}-0-{j}",
                    "sentence": text,
                    "left_url": _image_url(base_url, names[left]),
                    "right_url": _image_url(base_url, names[right]),
                    "label": str(label),
                }
            )
    return statements, nlvr2_map


def _write_annotations(ann: Path, split: _Split, seed: int, base_url: str, drawn: _Drawn, statements: list) -> None:
    """The split's official-format files: COCO captions, VQA questions and annotations,
    referring expressions, the scenes, NLVR2 statements."""
    info = {"description": f"shapes world ({split.name} split), seed {seed}", "version": "1.0"}
    names, scenes = drawn.names, drawn.scenes
    _dump(
        ann / f"captions_{split.coco}.json",
        {
            "info": info,
            "images": [
                {
                    "id": i + 1,
                    "file_name": coco_file_name(split.coco, i + 1),
                    "width": s.width,
                    "height": s.height,
                    "coco_url": _image_url(base_url, names[i]),
                }
                for i, s in enumerate(scenes)
            ],
            "annotations": drawn.caption_anns,
        },
    )
    _dump(
        ann / f"v2_OpenEnded_mscoco_{split.coco}_questions.json",
        {
            "info": info,
            "task_type": "Open-Ended",
            "data_type": "mscoco",
            "data_subtype": split.coco,
            "questions": drawn.question_anns,
        },
    )
    _dump(
        ann / f"v2_mscoco_{split.coco}_annotations.json",
        {"info": info, "data_type": "mscoco", "data_subtype": split.coco, "annotations": drawn.answer_anns},
    )
    _dump(ann / f"refexp_{split.name}.json", drawn.refexps)
    _dump(ann / f"scenes_{split.name}.json", [scene_to_json(s, names[i]) for i, s in enumerate(scenes)])
    (ann / f"nlvr2_{split.nlvr2}.json").write_text("".join(json.dumps(s) + "\n" for s in statements), encoding="utf-8")


def write_world(
    out: Path,
    n_images: int,
    seed: int,
    val_fraction: float = 0.1,
    base_url: str = "http://127.0.0.1:8000",
    textures: bool = True,
    progress: Optional[Callable[[int], None]] = None,
) -> dict:
    """Write a complete shapes world into `out` (layout in the module docstring); returns the summary.

    The world is built under a temporary name beside `out` and renamed into place when
    complete (`pipeline.io.replacing_output`): an earlier world in `out` is replaced; a
    non-empty folder that is not a world, `.`, a folder above the current one or a symbolic
    link is refused with a ConfigError before anything is written. summary.json is written
    last. `progress(1)` is called after each image.
    """
    if n_images < 1:
        raise ConfigError(f"--n-images must be at least 1 (got {n_images})")
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"--val-fraction must be in [0, 1) (got {val_fraction})")
    if seed < 0:
        raise ConfigError(f"--seed must be non-negative (got {seed})")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"--base-url must start with http:// or https:// (got {base_url!r})")
    with replacing_output(Path(out), WORLD_KIND, what="vlprep make-shapes", also_ours=_is_world) as tmp:
        (tmp / "images").mkdir(parents=True)
        (tmp / "annotations").mkdir()
        sizes = _split_sizes(n_images, val_fraction)
        written = {s.name: _write_split(tmp, s, sizes[s.name], seed, base_url, textures, progress) for s in SPLITS}
        splits = {name: counts for name, (counts, _, _) in written.items()}
        _write_vg(tmp, SPLITS[0], written[SPLITS[0].name][1].scenes, seed, base_url)
        for path, data in task_files([draws for _, draws, _ in written.values()]).items():
            (tmp / "annotations" / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "annotations" / path).write_bytes(data)
        write_cc_tsvs(tmp, base_url)
        coco_map = [
            f"{coco_file_name(s.coco, i + 1)[:-4]}\t{store_key(s.name, i)}\n"
            for s in SPLITS
            for i in range(sizes[s.name])
        ]
        nlvr2_map = [line for *_, lines in written.values() for line in lines]  # appended: earlier lines stay
        (tmp / "image_map.tsv").write_text("".join(coco_map + nlvr2_map))
        (tmp / "objects.txt").write_text("".join(f"{n}\n" for n in object_names()))
        (tmp / "attributes.txt").write_text("".join(f"{n}\n" for n in attribute_names()))
        summary = {
            "name": "shapes",
            "seed": seed,
            "n_images": n_images,
            "val_fraction": val_fraction,
            "textures": textures,
            "image_size": IMAGE_SIZE,
            "base_url": base_url,
            "splits": splits,
            "vocab": {"objects": object_names(), "attributes": attribute_names()},
        }
        atomic_write_json(tmp / "summary.json", summary)
    return summary


def load_scenes(world_dir: Path, split: str) -> dict[str, Scene]:
    """The ground-truth scenes of a split ("train" or "val"), by image name, in image order."""
    path = Path(world_dir) / "annotations" / f"scenes_{split}.json"
    if not path.exists():
        raise ConfigError(f"{path} not found (is {world_dir} a shapes world? splits: train, val)")
    return {entry["image"]: scene_from_json(entry) for entry in json.loads(path.read_text(encoding="utf-8"))}
