"""`RegionFeatureExtractor`: images in, `RegionFeatures` out.

Per batch: each image is preprocessed (`preprocess="caffe"` or ``"detectron2"``, see
`pipeline.detect.preprocess`); the backbone runs once per group of images
(`backbone_groups`): by default images of identical resized size are stacked, unpadded, so
each image's features are what it would get alone — bitwise where PyTorch runs the same
convolution kernel for the stack as for one image (it picks kernels by tensor size: the
full-size VG model measured bitwise equal; tiny maps can differ in the last float bits).
With ``pad_tolerance > 0``, images of similar aspect ratio are also grouped, zero-padded
(the pixel mean) at the right and bottom to the group's size: features near those borders
then see the padding instead of the image edge, so results depend on the batch. The RPN runs
per image on its own feature map; the ROI heads (res5, class, box and attribute predictors)
run once over the regions of all images of the batch. Region selection (`select_regions`)
maps boxes back to original-image pixels by the preprocessing's convention (one scale, or
per-axis scales) — for ``butd`` before its NMS, as Caffe does. Boxes come back in
original-image pixels, `cls_prob` with the background first, objects/attributes as
argmax/max over the non-background columns (not renormalized).

On a CPU (``kernels="fast"``, the default there) the ROI heads run through `pipeline.detect.cpu`:
res5 over units of ten proposals on `threads` worker threads (default: the caller's torch thread
count), each kernel at one intra-op thread, the backbone and the RPN on the calling thread at one
intra-op thread. The results are then the same bit for bit at any thread count
(`thread_invariant`): the proposals those of a one-thread run of the model's modules, the region
features within ~1e-6 (relative) of theirs (and so the scores, and maxnms's regressed boxes);
the box deltas are computed only for maxnms. ``kernels="torch"`` runs the model's modules at the
caller's thread count as before (the GPU path; on a CPU, the reference for benchmarks and tests).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.ops import nms, roi_pool

from pipeline.detect.backends.butd_c4.config import DEFAULT_SELECTION, POLICIES
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.backends.butd_c4.selection import select_regions
from pipeline.detect.boxes import cell_anchors, clip, decode, grid_anchors
from pipeline.detect.config import SelectionConfig
from pipeline.detect.cpu import RoiHead, one_thread
from pipeline.detect.inference import OnDevice
from pipeline.detect.preprocess import check_preprocess, prepare_image
from pipeline.records import RegionFeatures, labels_from_probs


def rpn_proposals(
    model: VGDetector, cell: torch.Tensor, features: torch.Tensor, height: int, width: int
) -> torch.Tensor:
    """RPN proposals (R, 4) in resized-image pixels for one image's features."""
    cfg = model.cfg
    logits, deltas = model.proposal_generator.rpn_head(features)
    a, fh, fw = cfg.num_anchors, features.shape[-2], features.shape[-1]
    scores = logits[0].permute(1, 2, 0).reshape(-1).float()
    deltas = deltas[0].reshape(a, 4, fh, fw).permute(2, 3, 0, 1).reshape(-1, 4).float()
    anchors = grid_anchors(cell, fh, fw, cfg.feature_stride).to(features.device)
    top = scores.topk(min(cfg.rpn_pre_nms_topk, len(scores))).indices
    boxes = clip(decode(deltas[top], anchors[top]), height, width)
    scores = scores[top]
    wide = ((boxes[:, 2] - boxes[:, 0]) > cfg.rpn_min_size) & ((boxes[:, 3] - boxes[:, 1]) > cfg.rpn_min_size)
    boxes, scores = boxes[wide], scores[wide]
    keep = nms(boxes, scores, cfg.rpn_nms)[: cfg.rpn_post_nms_topk]
    return boxes[keep]


def pooled_region_features(model: VGDetector, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """(R, C5) mean-pooled res5 features of `boxes` (resized-image pixels): ROIPool at
    1/16 to `pooler_resolution`, res5, mean over the map."""
    cfg = model.cfg
    pooled = roi_pool(
        features, [boxes.to(features.dtype)], output_size=cfg.pooler_resolution, spatial_scale=1.0 / cfg.feature_stride
    )
    return model.roi_heads.res5(pooled).mean(dim=(2, 3))


def backbone_groups(sizes: Sequence[tuple[int, int]], pad_tolerance: float = 0.0) -> list[list[int]]:
    """Indices of `sizes` ((h, w) backbone inputs) grouped for one backbone run each: in
    order of aspect ratio, an image joins the previous group while the group padded to its
    largest height and width has at most ``1 + pad_tolerance`` times its real pixels. At 0,
    only identical sizes group (no padding)."""
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i][0] / sizes[i][1], sizes[i]))
    groups: list[list[int]] = []
    for i in order:
        if groups:
            group = groups[-1] + [i]
            height, width = max(sizes[j][0] for j in group), max(sizes[j][1] for j in group)
            if height * width * len(group) <= (1 + pad_tolerance) * sum(sizes[j][0] * sizes[j][1] for j in group):
                groups[-1] = group
                continue
        groups.append([i])
    return groups


class RegionFeatureExtractor(OnDevice):
    def __init__(
        self,
        model: VGDetector,
        selection: SelectionConfig = SelectionConfig(),
        device: str = "cpu",
        fp16: bool = False,
        preprocess: str = "caffe",
        pad_tolerance: float = 0.0,
        kernels: str = "fast",
        threads: Optional[int] = None,
    ):
        if pad_tolerance < 0:
            raise ValueError(f"pad_tolerance must be >= 0, got {pad_tolerance}")
        self.place(model, device, fp16, kernels, threads)
        cfg = self.cfg
        self._head = RoiHead(
            model.roi_heads.res5,
            cfg.res4_channels,
            cfg.pooler_resolution,
            lambda fmap, boxes: roi_pool(fmap, [boxes], cfg.pooler_resolution, 1.0 / cfg.feature_stride),
        )
        self.pad_tolerance = pad_tolerance
        self.selection = selection.resolved(DEFAULT_SELECTION)
        if self.selection.policy not in POLICIES:
            raise ValueError(f"the BUTD detector selects by {' or '.join(POLICIES)}, not {self.selection.policy}")
        self.preprocess = check_preprocess(preprocess)
        self._cell = cell_anchors(self.cfg.anchor_sizes, self.cfg.anchor_ratios).to(self.device)

    def proposals(self, features: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return rpn_proposals(self.model, self._cell, features, height, width)

    def region_features(
        self, features: torch.Tensor, boxes: torch.Tensor, threads: Optional[int] = None
    ) -> torch.Tensor:
        """(R, C5) region features of `boxes`: with `threads`, through the CPU ROI head on that many
        workers (`pipeline.detect.cpu.RoiHead`), else through the model's modules."""
        if threads is not None:
            return self._head(features, boxes, threads)
        return pooled_region_features(self.model, features, boxes)

    def backbone_features(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """(1, C, h, w) features of each (1, 3, H, W) input, the backbone run once per
        `backbone_groups` group (padded groups cropped back to each image's own map)."""
        out: list[Optional[torch.Tensor]] = [None] * len(inputs)
        backbone = self.model.backbone
        for group in backbone_groups([tuple(x.shape[-2:]) for x in inputs], self.pad_tolerance):
            height = max(inputs[i].shape[-2] for i in group)
            width = max(inputs[i].shape[-1] for i in group)
            stacked = torch.cat(
                [F.pad(inputs[i], (0, width - inputs[i].shape[-1], 0, height - inputs[i].shape[-2])) for i in group]
            ).to(self.device)
            fmaps = backbone(stacked)
            for k, i in enumerate(group):
                fh, fw = backbone.output_size(*inputs[i].shape[-2:])
                out[i] = fmaps[k : k + 1, :, :fh, :fw].contiguous()
        return out

    @torch.no_grad()
    def __call__(
        self,
        images: Sequence[np.ndarray],
        image_ids: Sequence[str],
        given_boxes: Optional[Sequence[Optional[np.ndarray]]] = None,
    ) -> list[RegionFeatures]:
        """Extract regions for a batch of (H, W, 3) uint8 RGB images. With `given_boxes`
        (per image, (N, 4) x1y1x2y2 original pixels, or None to detect), features and
        predictions are computed for exactly those boxes."""
        if self.thread_invariant:
            with one_thread() as threads:
                return self._extract(images, image_ids, given_boxes, self.threads or threads)
        return self._extract(images, image_ids, given_boxes, None)

    def _extract(self, images, image_ids, given_boxes, threads: Optional[int]) -> list[RegionFeatures]:
        given_boxes = list(given_boxes) if given_boxes is not None else [None] * len(images)
        per_image = []
        feats = []
        prepared = [prepare_image(rgb, self.cfg, self.preprocess) for rgb in images]
        with self._autocast():
            fmaps = self.backbone_features([x for x, _ in prepared])
            for (_, resize), fmap, given in zip(prepared, fmaps, given_boxes):
                if given is not None:
                    given_t = torch.as_tensor(np.asarray(given, np.float32).reshape(-1, 4), device=self.device)
                    boxes = resize.to_resized(given_t)
                else:
                    boxes = self.proposals(fmap, resize.new_height, resize.new_width)
                feats.append(self.region_features(fmap, boxes, threads).float())
                per_image.append((resize, boxes.float()))
            region = torch.cat(feats)
            predictor = self.model.roi_heads.box_predictor
            cls_prob = F.softmax(predictor.cls_score(region).float(), dim=1)
            # the box deltas only serve maxnms's regressed boxes (the fast path skips them otherwise)
            needed = self.selection.policy == "maxnms" and any(g is None for g in given_boxes)
            deltas = predictor.bbox_pred(region).float() if needed or threads is None else None
        out = []
        start = 0
        for image_id, given, (resize, boxes) in zip(image_ids, given_boxes, per_image):
            sl = slice(start, start + len(boxes))
            start += len(boxes)
            probs, feat = cls_prob[sl], region[sl]
            if given is not None:
                keep = torch.arange(len(boxes), device=self.device)
                kept_boxes = torch.as_tensor(np.asarray(given, np.float32).reshape(-1, 4))
            else:
                keep, kept_boxes = select_regions(
                    self.selection,
                    boxes,
                    probs,
                    None if deltas is None else deltas[sl],
                    resize,
                    self.cfg.bbox_reg_weights,
                )
            out.append(
                self._record(
                    image_id, resize.height, resize.width, kept_boxes.cpu(), feat[keep], probs[keep], given is None
                )
            )
        return out

    def _record(
        self,
        image_id: str,
        height: int,
        width: int,
        boxes: torch.Tensor,
        feat: torch.Tensor,
        probs: torch.Tensor,
        clip_boxes: bool,
    ) -> RegionFeatures:
        boxes = boxes.float()
        if clip_boxes:
            boxes = clip(boxes, height, width)
        cls_prob = probs.cpu().numpy().astype(np.float32)
        objects_id, objects_conf = labels_from_probs(cls_prob)
        fields = dict(objects_id=objects_id, objects_conf=objects_conf, cls_prob=cls_prob)
        predictor = self.model.roi_heads.box_predictor
        if predictor.has_attributes:
            # The attribute head embeds the argmax over all classes, background included
            # (what the detectron2/HF ports feed it).
            classes = torch.as_tensor(cls_prob.argmax(axis=1), device=self.device)
            with self._autocast():
                logits = predictor.attribute_logits(feat.to(predictor.cls_embedding.weight.dtype), classes)
            attr_prob = F.softmax(logits.float(), dim=1).cpu().numpy().astype(np.float32)
            fields["attrs_id"], fields["attrs_conf"] = labels_from_probs(attr_prob)
            fields["attr_prob"] = attr_prob
        return RegionFeatures(
            image_id=image_id,
            image_h=int(height),
            image_w=int(width),
            boxes=boxes.numpy().astype(np.float32),
            features=feat.float().cpu().numpy().astype(np.float32),
            **fields,
        )
