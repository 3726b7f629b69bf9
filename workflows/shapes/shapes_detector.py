"""The shapes-world detector recipe: how the committed ``shapes-tiny`` weights
(pipeline/detect/backends/butd_c4/weights_data/) are trained and measured. `train_detector.py` and
`evaluate_detector.py` beside this file run it.

Scenes come from the world's generator (`pipeline.synthetic`), drawn on the fly from seeded
streams: `shapes_target` turns a scene into the detector's ground truth, `shapes_image`
renders it (optionally through the JPEG coding `write_world` stores). `train_shapes_detector`
trains a config from scratch with the library's losses (`pipeline.detect.backends.butd_c4.training`);
`evaluate_shapes_detector` measures weights on held-out scenes through the real extraction
path. This is workflow code, not library code: `pipeline` does not import it.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from PIL import Image
from torchvision.ops import box_iou

from pipeline.detect.backends import BACKENDS, Detector, build_extractor, load_model
from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.backends.butd_c4.training import DetectionTarget, calibrate_frozen_norms, detection_losses
from pipeline.detect.config import BoxCount, SelectionConfig
from pipeline.synthetic import Scene, attribute_names, generate_scene, object_names, render
from pipeline.synthetic.scenes import COLORS, SIZES, TEXTURES
from pipeline.synthetic.world import JPEG_QUALITY  # the world's JPEG coding: training sees it and raw renders

SHAPES_CONFIG = "shapes-tiny"
SHAPES_BOXES = "10-36"  # the extraction box count the shapes detector is measured (and demoed) with


def shapes_target(scene: Scene) -> DetectionTarget:
    """A shapes-world scene's ground truth: boxes, class = 1 + index in `object_names()`,
    attributes (N, 3) = 1 + index in `attribute_names()` of its colour, size and texture."""
    objects, attributes = object_names(), attribute_names()
    return DetectionTarget(
        boxes=np.array([o.box for o in scene.objects], np.float32).reshape(-1, 4),
        classes=np.array([1 + objects.index(o.shape) for o in scene.objects], np.int64),
        attributes=np.array(
            [[1 + attributes.index(v) for v in (o.color, o.size, o.texture)] for o in scene.objects], np.int64
        ).reshape(-1, 3),
    )


def shapes_image(scene: Scene, jpeg_quality: Optional[int] = None) -> np.ndarray:
    """The rendered scene as (H, W, 3) uint8 RGB, optionally through a JPEG round trip."""
    image = render(scene)
    if jpeg_quality is not None:
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=jpeg_quality)
        image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return np.asarray(image, dtype=np.uint8)


def shapes_scenes(seed: int, n: int) -> list[Scene]:
    """`n` scenes of the generator's random stream `seed` (`generate_scene`, 256 px, textures)."""
    rng = np.random.default_rng(seed)
    return [generate_scene(rng) for _ in range(n)]


@dataclass(frozen=True)
class ShapesTraining:
    """Hyper-parameters of `train_shapes_detector` (all recorded with the weights)."""

    steps: int = 2200
    batch: int = 4  # images per step, drawn fresh from the generator
    seed: int = 0
    lr: float = 2e-3  # AdamW, linear warm-up then cosine decay to 2 % of it
    warmup: int = 100
    weight_decay: float = 1e-4
    clip_norm: float = 10.0
    rpn_batch: int = 128
    roi_batch: int = 64
    jpeg_fraction: float = 0.5  # of the training images JPEG-coded at JPEG_QUALITY
    attr_weight: float = 1.0  # weight of the attribute loss in the total
    head_std: float = 0.01  # init std of the class / attribute layers (detectron2's 0.01)
    calibrate: bool = True  # set the frozen norms from data before training (`calibrate_frozen_norms`)


def _jitter(boxes: np.ndarray, rng: np.random.Generator, copies: int = 4) -> np.ndarray:
    """The boxes plus `copies` randomly shifted and scaled versions of each (calibration regions)."""
    w = (boxes[:, 2] - boxes[:, 0])[:, None]
    h = (boxes[:, 3] - boxes[:, 1])[:, None]
    moved = [boxes + rng.uniform(-0.3, 0.3, boxes.shape) * np.concatenate([w, h, w, h], 1) for _ in range(copies)]
    out = np.concatenate([boxes, *moved]).astype(np.float32)
    out[:, 2:] = np.maximum(out[:, 2:], out[:, :2] + 4)
    return out


def _lr_factor(step: int, t: ShapesTraining) -> float:
    if step < t.warmup:
        return (step + 1) / t.warmup
    progress = (step - t.warmup) / max(1, t.steps - t.warmup)
    return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_shapes_detector(
    cfg: DetectorConfig,
    t: ShapesTraining = ShapesTraining(),
    on_step: Optional[Callable[[int, dict[str, float]], None]] = None,
) -> tuple[VGDetector, dict]:
    """Train `cfg` from scratch on scenes generated on the fly (seeded: the same `t` gives the
    same weights on the same torch build and thread count). `on_step(step, losses)` is called
    after every step. Returns the model (eval mode) and a summary: final losses (mean of the
    last 50 steps), seconds, parameter count."""
    torch.manual_seed(t.seed)
    rng = np.random.default_rng([t.seed, 1])  # scenes; evaluation uses other streams
    model = VGDetector(cfg).train()
    predictor = model.roi_heads.box_predictor
    heads = [predictor.cls_score] + ([predictor.fc_attr, predictor.attr_score] if predictor.has_attributes else [])
    for layer in heads:
        torch.nn.init.normal_(layer.weight, std=t.head_std)
    if t.calibrate:
        calibration = [generate_scene(np.random.default_rng([t.seed, 2, i])) for i in range(16)]
        calibrate_frozen_norms(
            model,
            [shapes_image(s) for s in calibration],
            [_jitter(shapes_target(s).boxes, np.random.default_rng([t.seed, 3, i])) for i, s in enumerate(calibration)],
        )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    recent: list[dict[str, float]] = []
    start = time.perf_counter()
    for step in range(t.steps):
        for group in opt.param_groups:
            group["lr"] = t.lr * _lr_factor(step, t)
        scenes = [generate_scene(rng) for _ in range(t.batch)]
        images = [shapes_image(s, JPEG_QUALITY if rng.random() < t.jpeg_fraction else None) for s in scenes]
        losses = detection_losses(
            model, images, [shapes_target(s) for s in scenes], t.rpn_batch, t.roi_batch, seed=t.seed * 1_000_003 + step
        )
        total = sum(v * (t.attr_weight if k == "attr" else 1.0) for k, v in losses.items())
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, t.clip_norm)
        opt.step()
        values = {k: float(v.detach()) for k, v in losses.items()}
        values["total"] = float(total.detach())
        recent = (recent + [values])[-50:]
        if on_step is not None:
            on_step(step, values)
    seconds = time.perf_counter() - start
    final = {k: round(float(np.mean([r[k] for r in recent])), 4) for k in recent[0]} if recent else {}
    summary = {
        "seconds": round(seconds, 1),
        "final_losses": final,
        "parameters": sum(v.numel() for v in model.state_dict().values()),
        "trainable_parameters": sum(p.numel() for p in params),
    }
    return model.eval(), summary


def _box_iou_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return box_iou(
        torch.as_tensor(a, dtype=torch.float32).reshape(-1, 4), torch.as_tensor(b, dtype=torch.float32).reshape(-1, 4)
    ).numpy()


def evaluate_shapes_detector(
    weights,
    n_images: int = 200,
    seed: int = 1_000_000,
    boxes: str = SHAPES_BOXES,
    jpeg_quality: Optional[int] = JPEG_QUALITY,
    batch_size: int = 8,
    cfg: Optional[DetectorConfig] = None,
) -> dict:
    """Measure a shapes detector on `n_images` held-out scenes (`shapes_scenes(seed, n)`;
    training draws from other streams) through the real extraction path: the backend
    registry's `load_model` (strict) and `build_extractor` with policy ``butd`` and `boxes`, on the renders
    JPEG-coded at `jpeg_quality` (what `write_world` stores; None: raw renders).

    `weights` is a path, or a `VGDetector` already built. For each ground-truth object its
    *best box* is the output box of highest IoU with it. Returned metrics:

    * ``recall``: fraction of ground-truth objects whose best box has IoU >= 0.5.
    * ``class_accuracy``: over the recalled objects, the best box's ``objects_id`` (argmax
      of cls_prob over the 5 shapes, background excluded) is the object's shape.
    * ``attribute_accuracy``: over the recalled objects, the object's colour is among the
      best box's top-3 attributes (``attr_prob`` columns 1..12, "no attribute" excluded; 3
      because every object carries three attributes: colour, size and texture).
    * ``color_accuracy`` / ``size_accuracy`` / ``texture_accuracy``: over the recalled
      objects, the argmax of ``attr_prob`` restricted to that group's columns is right.
    * ``attributes_exact``: over the recalled objects, the top-3 attributes are exactly the
      object's three.
    * ``mean_boxes``: output boxes per image; ``objects``, ``images``, ``seconds``.
    """
    detector = Detector(BACKENDS.get("butd-c4"), cfg or DetectorConfig.load(SHAPES_CONFIG))
    model = weights if isinstance(weights, VGDetector) else load_model(detector, weights)[0]
    extractor = build_extractor(detector, model.eval(), selection=SelectionConfig("butd", BoxCount.parse(boxes)))
    scenes = shapes_scenes(seed, n_images)
    shapes = object_names()
    groups = {
        "color": (1, COLORS),
        "size": (1 + len(COLORS), SIZES),
        "texture": (1 + len(COLORS) + len(SIZES), TEXTURES),
    }
    counts = dict(objects=0, recalled=0, cls=0, attr=0, exact=0, boxes=0, color=0, size=0, texture=0)
    start = time.perf_counter()
    for first in range(0, len(scenes), batch_size):
        chunk = scenes[first : first + batch_size]
        records = extractor(
            [shapes_image(s, jpeg_quality) for s in chunk], [f"eval-{first + i}" for i in range(len(chunk))]
        )
        for scene, rec in zip(chunk, records):
            counts["boxes"] += rec.num_boxes
            iou = _box_iou_np(np.array([o.box for o in scene.objects]), rec.boxes)  # (objects, boxes)
            for j, obj in enumerate(scene.objects):
                counts["objects"] += 1
                best = int(iou[j].argmax()) if rec.num_boxes else -1
                if best < 0 or iou[j, best] < 0.5:
                    continue
                counts["recalled"] += 1
                counts["cls"] += int(shapes[int(rec.objects_id[best])] == obj.shape)
                if rec.attr_prob is None:
                    continue
                probs = rec.attr_prob[best]
                top3 = set((1 + np.argsort(-probs[1:], kind="stable")[:3]).tolist())
                wanted = {groups[g][0] + groups[g][1].index(getattr(obj, g)) for g in groups}
                counts["attr"] += int(groups["color"][0] + COLORS.index(obj.color) in top3)
                counts["exact"] += int(top3 == wanted)
                for g, (offset, names) in groups.items():
                    counts[g] += int(int(probs[offset : offset + len(names)].argmax()) == names.index(getattr(obj, g)))
    recalled = max(1, counts["recalled"])
    return {
        "images": len(scenes),
        "objects": counts["objects"],
        "seed": seed,
        "boxes": boxes,
        "jpeg_quality": jpeg_quality,
        "recall": round(counts["recalled"] / max(1, counts["objects"]), 4),
        "class_accuracy": round(counts["cls"] / recalled, 4),
        "attribute_accuracy": round(counts["attr"] / recalled, 4),
        "color_accuracy": round(counts["color"] / recalled, 4),
        "size_accuracy": round(counts["size"] / recalled, 4),
        "texture_accuracy": round(counts["texture"] / recalled, 4),
        "attributes_exact": round(counts["exact"] / recalled, 4),
        "mean_boxes": round(counts["boxes"] / max(1, len(scenes)), 2),
        "seconds": round(time.perf_counter() - start, 1),
    }
