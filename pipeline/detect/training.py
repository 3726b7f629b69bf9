"""Training losses for `VGDetector` (RPN + box head + attribute head), Faster R-CNN style.

Used to train small variants (the embedded demo's detector); the backbone's norms stay
frozen. Per image:

* RPN: anchors with IoU >= 0.7 to a ground-truth box (and each box's best anchor) are
  positive, IoU < 0.3 negative; `rpn_batch` anchors sampled, half positive at most;
  binary cross-entropy on objectness, smooth-L1 on the deltas of positives.
* Box head: RPN proposals (detached) plus the ground-truth boxes; IoU >= 0.5 is
  foreground (its box's class, background 0 otherwise); `roi_batch` sampled, a quarter
  foreground at most; cross-entropy over the background-first classes, smooth-L1 on the
  foreground class's deltas (weights 10, 10, 5, 5).
* Attributes: cross-entropy on foreground regions with the ground-truth class fed to
  the embedding (attribute 0 = "no attribute"). A target may give one attribute per box,
  ``(N,)``, or several, ``(N, K)`` with 0 as padding (Visual Genome boxes carry up to 16);
  then each box's loss is the mean cross-entropy over its given attributes (a box with none
  is trained towards 0, "no attribute", as the 1-D label 0 is), averaged over the boxes —
  so ``(N, 1)`` gives exactly the 1-D loss. See `attribute_loss`.

The second half of the module is the shapes-world recipe (`pipeline.datasets.shapes`):
targets from scenes, the training loop behind ``workflows/shapes/train_detector.py`` and
`evaluate_shapes_detector`, the held-out measurement of the committed ``shapes-tiny``
weights.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.ops import box_iou, roi_pool

from pipeline.detect.boxes import BoxCount, cell_anchors, encode, grid_anchors
from pipeline.detect.config import DetectorConfig
from pipeline.detect.extractor import RegionFeatureExtractor, SelectionConfig, pooled_region_features, rpn_proposals
from pipeline.detect.model import VGDetector
from pipeline.detect.preprocess import preprocess


@dataclass(frozen=True)
class DetectionTarget:
    boxes: np.ndarray  # (N, 4) x1y1x2y2, original pixels
    classes: np.ndarray  # (N,) 1..num_classes (0 is background)
    attributes: np.ndarray  # (N,) 0..num_attributes (0 = none), or (N, K): several per box, 0 = padding


def _sample(labels: torch.Tensor, total: int, positive_fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a random subset: at most `positive_fraction` positives (label >= 1)."""
    pos = torch.nonzero(labels >= 1).flatten()
    neg = torch.nonzero(labels == 0).flatten()
    n_pos = min(len(pos), int(total * positive_fraction))
    n_neg = min(len(neg), total - n_pos)
    pos = pos[torch.randperm(len(pos), generator=generator)[:n_pos]]
    neg = neg[torch.randperm(len(neg), generator=generator)[:n_neg]]
    return torch.cat([pos, neg])


def attribute_loss(logits: torch.Tensor, attributes: torch.Tensor) -> torch.Tensor:
    """Attribute cross-entropy for `logits` (n, A+1) against `attributes`: (n,) one label
    per box (0 = "no attribute", a class like any other), or (n, K) several labels per box
    with 0 as padding. For (n, K): a box's loss is the mean negative log-likelihood of its
    non-zero labels (softmax over the A+1 columns; a row of zeros means "no attribute",
    label 0, as in the 1-D case); the result is the mean over the boxes."""
    if attributes.dim() == 1:
        return F.cross_entropy(logits, attributes)
    if attributes.dim() != 2:
        raise ValueError(f"attributes must be (N,) or (N, K), got shape {tuple(attributes.shape)}")
    given = attributes > 0
    given[:, 0] |= ~given.any(dim=1)  # no attribute at all: one target, label 0 (the row holds 0 there)
    labels = torch.where(given, attributes, torch.zeros_like(attributes))
    nll = -F.log_softmax(logits, dim=1).gather(1, labels)
    per_box = (nll * given).sum(dim=1) / given.sum(dim=1)
    return per_box.mean()


def detection_losses(model: VGDetector, images: list[np.ndarray], targets: list[DetectionTarget],
                     rpn_batch: int = 256, roi_batch: int = 128, seed: int = 0) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    cell = cell_anchors(cfg.anchor_sizes, cfg.anchor_ratios)
    losses = {k: torch.zeros(()) for k in ("rpn_cls", "rpn_loc", "cls", "box", "attr")}
    for rgb, target in zip(images, targets):
        x, scale = preprocess(rgb, cfg)
        h, w = x.shape[-2:]
        gt = torch.as_tensor(target.boxes, dtype=torch.float32) * scale
        gt_cls = torch.as_tensor(target.classes, dtype=torch.long)
        gt_attr = torch.as_tensor(target.attributes, dtype=torch.long)
        fmap = model.backbone(x)

        # RPN
        logits, deltas = model.proposal_generator.rpn_head(fmap)
        a, fh, fw = cfg.num_anchors, fmap.shape[-2], fmap.shape[-1]
        logits = logits[0].permute(1, 2, 0).reshape(-1)
        deltas = deltas[0].reshape(a, 4, fh, fw).permute(2, 3, 0, 1).reshape(-1, 4)
        anchors = grid_anchors(cell, fh, fw, cfg.feature_stride)
        iou = box_iou(anchors, gt)  # (anchors, gt)
        best, match = iou.max(dim=1)
        labels = torch.full((len(anchors),), -1, dtype=torch.long)
        labels[best < 0.3] = 0
        labels[best >= 0.7] = 1
        labels[iou.argmax(dim=0)] = 1
        picked = _sample(labels, rpn_batch, 0.5, gen)
        losses["rpn_cls"] = losses["rpn_cls"] + F.binary_cross_entropy_with_logits(
            logits[picked], labels[picked].float())
        pos = picked[labels[picked] == 1]
        target_deltas = encode(anchors[pos], gt[match[pos]])
        losses["rpn_loc"] = losses["rpn_loc"] + F.smooth_l1_loss(deltas[pos], target_deltas, beta=0.0, reduction="sum") / max(1, len(picked))

        # Box head on proposals + ground truth
        with torch.no_grad():
            proposals = torch.cat([rpn_proposals(model, cell, fmap.detach(), h, w), gt])
        iou = box_iou(proposals, gt)
        best, match = iou.max(dim=1)
        roi_labels = torch.where(best >= 0.5, gt_cls[match], torch.zeros_like(match))
        picked = _sample(roi_labels, roi_batch, 0.25, gen)
        feats = pooled_region_features(model, fmap, proposals[picked])
        predictor = model.roi_heads.box_predictor
        labels = roi_labels[picked]
        losses["cls"] = losses["cls"] + F.cross_entropy(predictor.cls_score(feats), labels)
        fg = torch.nonzero(labels > 0).flatten()
        if len(fg):
            box_deltas = predictor.bbox_pred(feats[fg]).reshape(len(fg), -1, 4)[torch.arange(len(fg)), labels[fg] - 1]
            wanted = encode(proposals[picked][fg], gt[match[picked][fg]], cfg.bbox_reg_weights)
            losses["box"] = losses["box"] + F.smooth_l1_loss(box_deltas, wanted, beta=0.0, reduction="sum") / len(picked)
            if predictor.has_attributes:
                attr_logits = predictor.attribute_logits(feats[fg], labels[fg])
                losses["attr"] = losses["attr"] + attribute_loss(attr_logits, gt_attr[match[picked][fg]])
    n = max(1, len(images))
    return {k: v / n for k, v in losses.items()}


# --------------------------------------------------------------------------- the shapes-world recipe

SHAPES_CONFIG = "shapes-tiny"
SHAPES_BOXES = "10-36"  # the extraction box count the shapes detector is measured (and demoed) with
SHAPES_JPEG_QUALITY = 90  # what `write_world` stores; training sees both raw and JPEG-coded renders


def shapes_target(scene) -> DetectionTarget:
    """A shapes-world scene's ground truth: boxes, class = 1 + index in `object_names()`,
    attributes (N, 3) = 1 + index in `attribute_names()` of its colour, size and texture."""
    from pipeline.datasets.shapes import attribute_names, object_names

    objects, attributes = object_names(), attribute_names()
    return DetectionTarget(
        boxes=np.array([o.box for o in scene.objects], np.float32).reshape(-1, 4),
        classes=np.array([1 + objects.index(o.shape) for o in scene.objects], np.int64),
        attributes=np.array([[1 + attributes.index(v) for v in (o.color, o.size, o.texture)] for o in scene.objects],
                            np.int64).reshape(-1, 3),
    )


def shapes_image(scene, jpeg_quality: Optional[int] = None) -> np.ndarray:
    """The rendered scene as (H, W, 3) uint8 RGB, optionally through a JPEG round trip."""
    from PIL import Image

    from pipeline.datasets.shapes import render

    image = render(scene)
    if jpeg_quality is not None:
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=jpeg_quality)
        image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return np.asarray(image, dtype=np.uint8)


def shapes_scenes(seed: int, n: int) -> list:
    """`n` scenes of the generator's random stream `seed` (`generate_scene`, 256 px, textures)."""
    from pipeline.datasets.shapes import generate_scene

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
    jpeg_fraction: float = 0.5  # of the training images JPEG-coded at SHAPES_JPEG_QUALITY
    attr_weight: float = 1.0  # weight of the attribute loss in the total
    head_std: float = 0.01  # init std of the class / attribute layers (detectron2's 0.01)
    calibrate: bool = True  # set the frozen norms from data before training (`calibrate_frozen_norms`)


@torch.no_grad()
def calibrate_frozen_norms(model: VGDetector, images: list[np.ndarray], boxes: list[np.ndarray],
                           scale: float = 1.0) -> None:
    """Set every frozen norm of a freshly initialized model from data, as a batch norm's
    statistics would be (the norms stay frozen afterwards): each conv's output over
    `images` (backbone) or over the regions `boxes` (original pixels; res5) gets mean 0 and
    standard deviation `scale`. Layers are calibrated in forward order, each seeing the
    calibrated outputs of the layers before it. Training from scratch needs this: the
    generic initialization keeps a deep random tower tame by shrinking activations, which
    leaves a small network's features orders of magnitude below its heads' scale."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    def hook(norm: FrozenBatchNorm2d, args: tuple) -> None:
        x = args[0].transpose(0, 1).reshape(norm.weight.shape[0], -1)
        norm.running_mean.copy_(x.mean(dim=1))
        var = x.var(dim=1)
        norm.running_var.copy_(var.clamp(min=0.01 * float(var.mean()) + 1e-12))  # a dead channel: at most 10x gain
        norm.weight.fill_(scale)
        norm.bias.zero_()

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, FrozenBatchNorm2d)]
    try:
        batch, scales = zip(*(preprocess(rgb, model.cfg) for rgb in images))
        if len({tuple(x.shape) for x in batch}) != 1:
            raise ValueError("calibration images must share one size")
        fmap = model.backbone(torch.cat(batch))
        regions = [torch.as_tensor(b, dtype=torch.float32).reshape(-1, 4) * s for b, s in zip(boxes, scales)]
        pooled = roi_pool(fmap, regions, model.cfg.pooler_resolution, 1.0 / model.cfg.feature_stride)
        model.roi_heads.res5(pooled)
    finally:
        for h in handles:
            h.remove()


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


def train_shapes_detector(cfg: DetectorConfig, t: ShapesTraining = ShapesTraining(),
                          on_step: Optional[Callable[[int, dict[str, float]], None]] = None) -> tuple[VGDetector, dict]:
    """Train `cfg` from scratch on scenes generated on the fly (seeded: the same `t` gives the
    same weights on the same torch build and thread count). `on_step(step, losses)` is called
    after every step. Returns the model (eval mode) and a summary: final losses (mean of the
    last 50 steps), seconds, parameter count."""
    from pipeline.datasets.shapes import generate_scene

    torch.manual_seed(t.seed)
    rng = np.random.default_rng([t.seed, 1])  # scenes; evaluation uses other streams
    model = VGDetector(cfg).train()
    predictor = model.roi_heads.box_predictor
    heads = [predictor.cls_score] + ([predictor.fc_attr, predictor.attr_score] if predictor.has_attributes else [])
    for layer in heads:
        torch.nn.init.normal_(layer.weight, std=t.head_std)
    if t.calibrate:
        calibration = [generate_scene(np.random.default_rng([t.seed, 2, i])) for i in range(16)]
        calibrate_frozen_norms(model, [shapes_image(s) for s in calibration],
                               [_jitter(shapes_target(s).boxes, np.random.default_rng([t.seed, 3, i]))
                                for i, s in enumerate(calibration)])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    recent: list[dict[str, float]] = []
    start = time.perf_counter()
    for step in range(t.steps):
        for group in opt.param_groups:
            group["lr"] = t.lr * _lr_factor(step, t)
        scenes = [generate_scene(rng) for _ in range(t.batch)]
        images = [shapes_image(s, SHAPES_JPEG_QUALITY if rng.random() < t.jpeg_fraction else None) for s in scenes]
        losses = detection_losses(model, images, [shapes_target(s) for s in scenes], t.rpn_batch, t.roi_batch,
                                  seed=t.seed * 1_000_003 + step)
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
    summary = {"seconds": round(seconds, 1), "final_losses": final,
               "parameters": sum(v.numel() for v in model.state_dict().values()),
               "trainable_parameters": sum(p.numel() for p in params)}
    return model.eval(), summary


def _box_iou_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return box_iou(torch.as_tensor(a, dtype=torch.float32).reshape(-1, 4),
                   torch.as_tensor(b, dtype=torch.float32).reshape(-1, 4)).numpy()


def evaluate_shapes_detector(weights, n_images: int = 200, seed: int = 1_000_000, boxes: str = SHAPES_BOXES,
                             jpeg_quality: Optional[int] = SHAPES_JPEG_QUALITY, batch_size: int = 8,
                             cfg: Optional[DetectorConfig] = None) -> dict:
    """Measure a shapes detector on `n_images` held-out scenes (`shapes_scenes(seed, n)`;
    training draws from other streams) through the real extraction path: `load_detector`
    (strict), `RegionFeatureExtractor` with policy ``butd`` and `boxes`, on the renders
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
    from pipeline.datasets.shapes import COLORS, SIZES, TEXTURES, object_names
    from pipeline.detect.weights import load_detector

    cfg = cfg or DetectorConfig.load(SHAPES_CONFIG)
    model = weights if isinstance(weights, VGDetector) else load_detector(weights, cfg)[0]
    extractor = RegionFeatureExtractor(model.eval(), SelectionConfig("butd", BoxCount.parse(boxes)))
    scenes = shapes_scenes(seed, n_images)
    shapes = object_names()
    groups = {"color": (1, COLORS), "size": (1 + len(COLORS), SIZES), "texture": (1 + len(COLORS) + len(SIZES), TEXTURES)}
    counts = dict(objects=0, recalled=0, cls=0, attr=0, exact=0, boxes=0, color=0, size=0, texture=0)
    start = time.perf_counter()
    for first in range(0, len(scenes), batch_size):
        chunk = scenes[first:first + batch_size]
        records = extractor([shapes_image(s, jpeg_quality) for s in chunk], [f"eval-{first + i}" for i in range(len(chunk))])
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
                    counts[g] += int(int(probs[offset:offset + len(names)].argmax()) == names.index(getattr(obj, g)))
    recalled = max(1, counts["recalled"])
    return {
        "images": len(scenes), "objects": counts["objects"], "seed": seed, "boxes": boxes,
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
