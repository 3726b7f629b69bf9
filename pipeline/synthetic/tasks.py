"""The shapes world's files for the transfer tasks, in their official formats: the Karpathy
Flickr30k retrieval split (5 captions per image), RefCOCO+ (`refs(unc).p` and the COCO
instances it points into) and VCR (question, answer and rationale choices over object
indices, one metadata file per image) — and the per-image draws only these files use:
retrieval's captions beyond the COCO ones and the VCR question.

`task_files` is pure: it turns what each split drew (`SplitDraws`) into file contents by
path; `world.write_world` draws, writes them under annotations/ and owns the random streams.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.synthetic.captions import captions
from pipeline.synthetic.scenes import COLORS, SHAPES, Scene

RETRIEVAL_CAPTIONS = 5  # per image, as in Flickr30k
RETRIEVAL_SPLIT = {"train": "train", "val": "val"}  # our split -> the Karpathy split
REFCOCO_VAL_SPLITS = ("val", "testA", "testB")  # RefCOCO+ split of val image i: [i % 3]
REFCOCO_VAL_IDS = 1_000_000  # RefCOCO+ image id: train i + 1, val REFCOCO_VAL_IDS + i + 1
FLICKR30K_FILE = "dataset_flickr30k.json"
REFCOCO_DIR = "refcoco+"
VCR_DIR = "vcr"


@dataclass(frozen=True)
class SplitDraws:
    """What one split of the world drew that the task files are made of; lists by image index."""

    name: str  # train | val
    file_names: list[str]  # the COCO file name of each image
    scenes: list[Scene]
    captions: list[list[str]]  # RETRIEVAL_CAPTIONS each (`retrieval_captions`)
    refexps: list[list[tuple[int, str]]]  # (object index, expression), as in refexp_<split>.json
    vcr: list[dict]  # `vcr_question` of each image


def tokens(text: str) -> list[str]:
    """Lower-cased words, punctuation dropped (as in the Karpathy and RefCOCO files)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def retrieval_captions(scene: Scene, have: Sequence[str], rng: np.random.Generator) -> list[str]:
    """Exactly RETRIEVAL_CAPTIONS captions: the image's COCO captions `have`, then new distinct
    ones drawn from `rng`, repeating earlier ones only if the scene offers no more."""
    out = list(have[:RETRIEVAL_CAPTIONS])
    for _ in range(4):
        if len(out) == RETRIEVAL_CAPTIONS:
            break
        out += [c for c in captions(scene, rng) if c not in out][: RETRIEVAL_CAPTIONS - len(out)]
    return out + [out[j % len(out)] for j in range(RETRIEVAL_CAPTIONS - len(out))]


def _because(obj: int, color: str) -> list:
    return ["because", [obj], "is", "drawn", "in", color, "."]


def _place(right, wrong: list, rng: np.random.Generator) -> tuple[list, int]:
    """The 4 choices, `right` at a uniformly drawn position, and that position."""
    label = int(rng.integers(len(wrong) + 1))
    return wrong[:label] + [right] + wrong[label:], label


def vcr_question(scene: Scene, rng: np.random.Generator) -> dict:
    """VCR's question fields for one object's colour: tokens mix words and [object index]
    lists; wrong answers name other colours, wrong rationales other colours or objects."""
    i = int(rng.integers(len(scene.objects)))
    color = scene.objects[i].color
    others = [c for c in COLORS if c != color]
    answers, answer_label = _place(
        ["it", "is", color, "."], [["it", "is", others[k], "."] for k in rng.choice(len(others), 3, replace=False)], rng
    )
    # Wrong rationales: the object in other colours, other objects in theirs; distinct even when
    # object indices are read as names (no two of the 4 name the same shape and colour).
    pool, seen = [], {(scene.objects[i].shape, color)}
    for j, c in [(i, c) for c in others] + [(j, o.color) for j, o in enumerate(scene.objects)]:
        if (scene.objects[j].shape, c) not in seen:
            seen.add((scene.objects[j].shape, c))
            pool.append((j, c))
    rationales, rationale_label = _place(
        _because(i, color), [_because(*pool[k]) for k in rng.choice(len(pool), 3, replace=False)], rng
    )
    return {
        "question": ["what", "color", "is", [i], "?"],
        "answer_choices": answers,
        "answer_label": answer_label,
        "rationale_choices": rationales,
        "rationale_label": rationale_label,
    }


def _json(obj) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _flickr30k(splits: Sequence[SplitDraws]) -> dict:
    images = []
    for split in splits:
        for file_name, texts in zip(split.file_names, split.captions):
            imgid, first = len(images), len(images) * RETRIEVAL_CAPTIONS
            sentences = [
                {"raw": t, "tokens": tokens(t), "imgid": imgid, "sentid": first + k} for k, t in enumerate(texts)
            ]
            images.append(
                {
                    "filename": file_name,
                    "imgid": imgid,
                    "split": RETRIEVAL_SPLIT[split.name],
                    "sentids": [s["sentid"] for s in sentences],
                    "sentences": sentences,
                }
            )
    return {"dataset": "flickr30k", "images": images}


def refcoco_image_id(split: str, i: int) -> int:
    return i + 1 + (REFCOCO_VAL_IDS if split == "val" else 0)


def _refcoco(splits: Sequence[SplitDraws]) -> tuple[list[dict], dict]:
    """(refs, instances): one ann per object, one ref per object with an expression."""
    refs, images, anns, n_sentences = [], [], [], 0
    for split in splits:
        for i, (file_name, scene, refexps) in enumerate(zip(split.file_names, split.scenes, split.refexps)):
            image_id = refcoco_image_id(split.name, i)
            images.append({"id": image_id, "file_name": file_name, "width": scene.width, "height": scene.height})
            for k, obj in enumerate(scene.objects):
                x1, y1, x2, y2 = obj.box
                ann = {
                    "id": len(anns) + 1,
                    "image_id": image_id,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                    "category_id": SHAPES.index(obj.shape) + 1,
                    "segmentation": [[x1, y1, x2, y1, x2, y2, x1, y2]],
                }
                anns.append(ann)
                texts = [text for j, text in refexps if j == k]
                if not texts:
                    continue
                sentences = [
                    {"sent": " ".join(tokens(t)), "raw": t, "tokens": tokens(t), "sent_id": n_sentences + n}
                    for n, t in enumerate(texts)
                ]
                n_sentences += len(texts)
                refs.append(
                    {
                        "ref_id": len(refs),
                        "ann_id": ann["id"],
                        "image_id": image_id,
                        "split": split.name if split.name == "train" else REFCOCO_VAL_SPLITS[i % 3],
                        "sentences": sentences,
                        "sent_ids": [s["sent_id"] for s in sentences],
                        "category_id": ann["category_id"],
                        "file_name": f"{file_name[:-4]}_{ann['id']}.jpg",
                    }
                )
    categories = [{"id": k + 1, "name": shape, "supercategory": "shape"} for k, shape in enumerate(SHAPES)]
    return refs, {"images": images, "annotations": anns, "categories": categories}


def _vcr(split: SplitDraws) -> dict[str, bytes]:
    files, rows = {}, []
    for i, (file_name, scene, question) in enumerate(zip(split.file_names, split.scenes, split.vcr)):
        names = [o.shape for o in scene.objects]
        rows.append(
            {
                "annot_id": f"{split.name}-{i}",
                "objects": names,
                "img_fn": file_name,
                "metadata_fn": f"{file_name[:-4]}.json",
                **question,
            }
        )
        files[f"{VCR_DIR}/metadata/{file_name[:-4]}.json"] = _json(
            {
                "boxes": [[*o.box, 1.0] for o in scene.objects],
                "names": names,
                "width": scene.width,
                "height": scene.height,
            }
        )
    files[f"{VCR_DIR}/{split.name}.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows).encode()
    return files


def task_files(splits: Sequence[SplitDraws]) -> dict[str, bytes]:
    """The task files' contents by path under annotations/: FLICKR30K_FILE,
    refcoco+/refs(unc).p, refcoco+/instances.json, vcr/<split>.jsonl, vcr/metadata/<COCO stem>.json."""
    refs, instances = _refcoco(splits)
    files = {
        FLICKR30K_FILE: _json(_flickr30k(splits)),
        f"{REFCOCO_DIR}/refs(unc).p": pickle.dumps(refs, protocol=2),  # the official format is a pickle
        f"{REFCOCO_DIR}/instances.json": _json(instances),
    }
    for split in splits:
        files.update(_vcr(split))
    return files


def task_counts(split: SplitDraws) -> dict[str, int]:
    """summary.json's per-split counts of the task files."""
    return {
        "retrieval_images": len(split.captions),
        "retrieval_captions": sum(map(len, split.captions)),
        "refcoco_refs": sum(len({k for k, _ in refexps}) for refexps in split.refexps),
        "vcr_questions": len(split.vcr),
    }
