"""`VinvlExtractor`: images in, VinVL's regions out, as scene_graph_benchmark's ``test_sg_net.py``
extracts them with ``TEST.OUTPUT_FEATURE True`` (one image per batch: no padding reaches a map).

Per image: maskrcnn-benchmark's test input (`pipeline.detect.preprocess`, ``maskrcnn``), the
ResNeXt C4 backbone, the RPN (sigmoid objectness; the top ``rpn_pre_nms_topk`` anchors decoded by
its +1-pixel box coder from the checkpoint's anchors, clipped to ``[0, w - 1] x [0, h - 1]``,
NMS at ``rpn_nms``, the first ``rpn_post_nms_topk``), the res5 box head on 14 x 14 ROIAlign maps
(each proposal's 2048-d average-pooled feature, the class softmax, the deltas), the selection
(`postprocess`), then the attribute head on the selected boxes (the box head run again on them,
as the reference does: the same features when the boxes are the proposals, so they are reused),
its softmax over the attributes. Boxes come back in original pixels (per-axis scales, not
clipped), `cls_prob` with the background first, ``objects_id`` / ``objects_conf`` the selection's
label (0-based) and score, ``attr_prob`` the attribute softmax ("no attribute" at 0) and
``attrs_id`` / ``attrs_conf`` its best attribute. With given boxes, features and predictions
are those of exactly those boxes (the label and score: the best foreground class, as the
reference's ``FORCE_BOXES``).

On a CPU (``kernels="fast"``, the default there) the box head runs through `pipeline.detect.cpu`
as BUTD's does: ROIAlign and res5 over units of ten boxes on `threads` worker threads, every kernel
at one intra-op thread, so the records are the same bit for bit at any thread count.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.ops import nms

from pipeline.detect.backends.vinvl_x152c4.config import DEFAULT_SELECTION
from pipeline.detect.backends.vinvl_x152c4.model import AttrRCNN
from pipeline.detect.backends.vinvl_x152c4.postprocess import select
from pipeline.detect.boxes import clip, decode, grid_anchors
from pipeline.detect.config import SelectionConfig
from pipeline.detect.cpu import RoiHead, one_thread
from pipeline.detect.inference import OnDevice
from pipeline.detect.preprocess import prepare_image
from pipeline.records import RegionFeatures, labels_from_probs


class VinvlExtractor(OnDevice):
    def __init__(
        self,
        model: AttrRCNN,
        selection: SelectionConfig = DEFAULT_SELECTION,
        device: str = "cpu",
        fp16: bool = False,
        preprocess: str = "maskrcnn",
        kernels: str = "fast",
        threads: Optional[int] = None,
    ):
        self.place(model, device, fp16, kernels, threads)
        self.selection = selection.resolved(DEFAULT_SELECTION)
        self.preprocess = preprocess
        cfg = self.cfg
        self._head = RoiHead(model.roi_heads.res5, cfg.res4_channels, cfg.pooler_resolution, model.pooled_maps)
        self._threads: Optional[int] = None  # the fast path's workers during a call

    def box_features(self, fmap: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """(R, D) features of `boxes` (resized pixels): the model's `box_features`, or on the fast
        CPU path the same through `RoiHead`."""
        if self._threads is not None:
            return self._head(fmap, boxes, self._threads)
        return self.model.box_features(fmap, boxes)

    def proposals(self, features: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(R, 4) RPN proposals in resized-image pixels, by descending objectness."""
        cfg, rpn = self.cfg, self.model.rpn
        logits, deltas = rpn(features)
        a, fh, fw = rpn.cell_anchors.shape[0], features.shape[-2], features.shape[-1]
        objectness = logits[0].permute(1, 2, 0).reshape(-1).float().sigmoid()
        deltas = deltas[0].reshape(a, 4, fh, fw).permute(2, 3, 0, 1).reshape(-1, 4).float()
        anchors = grid_anchors(rpn.cell_anchors, fh, fw, cfg.feature_stride).to(features.device)
        top = objectness.topk(min(cfg.rpn_pre_nms_topk, len(objectness))).indices
        boxes = clip(decode(deltas[top], anchors[top], plus_one=True), height - 1, width - 1)
        scores = objectness[top]
        sane = (boxes[:, 2] - boxes[:, 0] + 1 >= cfg.rpn_min_size) & (boxes[:, 3] - boxes[:, 1] + 1 >= cfg.rpn_min_size)
        boxes, scores = boxes[sane], scores[sane]
        return boxes[nms(boxes, scores, cfg.rpn_nms)[: cfg.rpn_post_nms_topk]]

    @torch.no_grad()
    def __call__(
        self,
        images: Sequence[np.ndarray],
        image_ids: Sequence[str],
        given_boxes: Optional[Sequence[Optional[np.ndarray]]] = None,
    ) -> list[RegionFeatures]:
        given_boxes = list(given_boxes) if given_boxes is not None else [None] * len(images)
        if not self.thread_invariant:
            return [self._one(rgb, image_id, given) for rgb, image_id, given in zip(images, image_ids, given_boxes)]
        with one_thread() as threads:
            self._threads = self.threads or threads
            try:
                return [self._one(rgb, image_id, given) for rgb, image_id, given in zip(images, image_ids, given_boxes)]
            finally:
                self._threads = None

    def _one(self, rgb: np.ndarray, image_id: str, given: Optional[np.ndarray]) -> RegionFeatures:
        cfg, model = self.cfg, self.model
        x, resize = prepare_image(rgb, cfg, self.preprocess)
        h, w = resize.new_height, resize.new_width
        with self._autocast():
            fmap = model.backbone(x.to(self.device))
            if given is not None:
                proposals = resize.to_resized(torch.as_tensor(np.asarray(given, np.float32).reshape(-1, 4)))
                proposals = proposals.to(self.device)
            else:
                proposals = self.proposals(fmap, h, w)
            feat = self.box_features(fmap, proposals).float()
            predictor = model.roi_heads.box_predictor
            probs = F.softmax(predictor.cls_score(feat).float(), -1)
            if given is not None:
                keep = torch.arange(len(proposals), device=self.device)
                scores, labels = probs[:, 1:].max(1)
                labels, boxes = labels + 1, proposals
            else:
                regress = self.selection.regression
                deltas = predictor.bbox_pred(feat).float() if regress else None
                keep, labels, scores, boxes = select(
                    proposals, probs, deltas, self.selection, h, w, cfg.bbox_reg_weights
                )
            fields = {"cls_prob": probs[keep].cpu().numpy().astype(np.float32)}
            fields["objects_id"] = (labels - 1).cpu().numpy().astype(np.int64)
            fields["objects_conf"] = scores.cpu().numpy().astype(np.float32)
            if model.attribute is not None and len(keep):
                same = given is not None or not self.selection.regression  # the boxes are the proposals
                attr_feat = feat[keep] if same else self.box_features(fmap, boxes).float()
                attr_logits = model.attribute(attr_feat.to(model.attribute.fc_attr.weight.dtype), labels)
                attr_prob = F.softmax(attr_logits.float(), -1).cpu().numpy().astype(np.float32)
                fields["attr_prob"] = attr_prob
                fields["attrs_id"], fields["attrs_conf"] = labels_from_probs(attr_prob)
        original = given if given is not None else resize.to_original(boxes.float().cpu()).numpy()
        return RegionFeatures(
            image_id=image_id,
            image_h=int(rgb.shape[0]),
            image_w=int(rgb.shape[1]),
            boxes=np.asarray(original, np.float32).reshape(-1, 4),
            features=feat[keep].cpu().numpy().astype(np.float32),
            **fields,
        )
