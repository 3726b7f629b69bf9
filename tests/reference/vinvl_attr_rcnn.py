"""Reference detections of VinVL's X152-C4 ``AttrRCNN`` (microsoft/scene_graph_benchmark with
``sgg_configs/vgattr/vinvl_x152c4.yaml``), for the vinvl-x152c4 backend's tests.

The fixture (``vinvl_attr_rcnn.json`` beside this file) holds no weights. The model is a tiny
AttrRCNN of the same architecture (`TINY_OVERRIDES` on top of the yaml, with the stage spec
`TINY_STAGES` registered as `TINY_CONV_BODY`; `TINY_SPEC` says the same in neutral terms): every
tensor of its state dict is a deterministic function of its key name and shape (`fill`), and the
inputs are three drawn images (`images`). The fixture keeps the state dict's key -> shape, the
full X152-C4 model's key -> shape (built once, never filled), and for each of the four settings
(`SETTINGS`: ROI_HEADS.NMS_FILTER 1 and 2, TEST.IGNORE_BOX_REGRESSION True and False, each with
TEST.OUTPUT_FEATURE True) and each image: the original and network-input sizes, a summary of the
preprocessed input tensor, the RPN proposals (the same in every setting), and the detections
as ``tools/test_sg_net.py`` would write them to predictions.tsv, in its order: boxes resized
back to the original image with ``BoxList.resize`` (and ``boxes_input``, before it), scores,
labels, attribute labels and scores as the reference returns them (``topk``: entries scored 0
carry an arbitrary label), the box feature sampled at `FEATURE_DIMS` plus its sum and sum of
squares (the whole feature of the first box of each image under ``filter1_ignore_reg``, as
float32 base64), and ``proposal_index``, the RPN proposal whose pooled feature the box carries.
Labels are the reference's indices: 0 is background and never output, 1..12 are classes (the
label map's label_to_idx values); attribute 0 is ``__no_attribute__`` (always scored 0), 1..7 are
attributes. ``filter2_reg`` is the reference as it is, bug included: its boxes are rows of the
(proposals x classes) box table indexed by proposal number, not the boxes NMS ran on.

Two things of the tiny model are not smaller than X152-C4's, because the reference fixes them:
the stage output widths (RES2_OUT_CHANNELS 256, BACKBONE_OUT_CHANNELS 1024: the C4 box head,
``ResNet50Conv5ROIFeatureExtractor``, inserts a ``trans_conv`` whenever the backbone width is not
1024 and takes RES2_OUT_CHANNELS * 4 input channels) and the res5 head's 3 blocks (its
``StageSpec(index=4, block_count=3)`` is written in the class). Only the bottleneck widths
(NUM_GROUPS 2 x WIDTH_PER_GROUP 4), the stem, the body's depth, the classes, the attributes and
the attribute head's sizes shrink. MAX_NUM_ATTR_PER_OBJ drops from 16 to 4 because
``torch.topk`` over 8 attributes cannot take 16.

`published_checkpoint` gives what ``torch.save`` should write to have the layout of the released
``vinvl_vg_x152c4.pth``: a flat OrderedDict (no ``{"model": ...}`` wrapper) whose keys are the
AttrRCNN state-dict keys with a ``module.`` prefix (a DistributedDataParallel model's
``state_dict()``), including ``module.rpn.anchor_generator.cell_anchors.0`` and the
``module.attribute.feature_extractor.*`` duplicates of ``module.roi_heads.box.feature_extractor.*``
(one module under two names, so the same tensors). That layout is read off third-party loaders of
the released file, not off the file (this machine cannot download it): mozuma
(``src/mozuma/models/vinvl/stores.py``) loads ``torch.hub.load_state_dict_from_url(...)`` as a
flat dict, renames ``module.`` to ``vinvl.`` and calls ``load_state_dict`` strictly on a copy of
AttrRCNN with the same module tree; another loader reads ``module.backbone.body.*`` and
``module.attribute.feature_extractor.head.*`` from ``torch.load(...)`` directly. Confidence: high
for the flat dict and the prefix, good for the exact key set (a strict load there). The
reference's own loader accepts it either way: ``DetectronCheckpointer._load_file`` wraps a dict
without "model", ``load_state_dict`` strips ``module.`` when every key has it, and
``align_and_update_state_dicts`` then matches keys by longest suffix (here: exactly).

Made once, on CPU, with the reference code (never vendored; fetch
github:microsoft/scene_graph_benchmark, e.g. ``git archive HEAD | tar -x -C /tmp/sgb``):

    python tests/reference/vinvl_attr_rcnn.py --reference /tmp/sgb [--keys-txt FILE]

It builds the model with the reference's own config system, builders (``AttrRCNN``), checkpoint
loader (``DetectronCheckpointer`` on a temporary file written from `published_checkpoint`) and
test transforms (``build_transforms(cfg, is_train=False)``, ``to_image_list`` with
DATALOADER.SIZE_DIVISIBILITY as ``BatchCollator`` does, one image per batch), runs it as
``engine/inference.py``'s ``compute_on_dataset`` does (eval, no_grad, outputs to CPU) and resizes
the outputs as ``convert_predictions_to_tsv`` does. Needs yacs (pip). What it changes around the
unchanged reference code, and why each change is numerically neutral:

- ``maskrcnn_benchmark._C`` (the C++/CUDA extension, not buildable here) is a Python module: its
  ``nms`` is `nms_cpu`, a line-by-line port of ``csrc/cpu/nms_cpu.cpp`` (areas and overlaps with
  the +1 convention, float32 arithmetic in the same order, score sort descending, suppression on
  ``ovr >= threshold``, kept indices returned in ascending index order); ``roi_align_forward`` and
  ``roi_pool_forward`` call torchvision's kernels (``roi_align`` with ``aligned=False`` is the same
  legacy Detectron ROIAlign: bins of roi_size / pooled_size, ``ceil(roi_size / pooled_size)``
  samples when sampling_ratio is 0, sizes clamped to 1; ``roi_pool`` is maskrcnn_benchmark's
  ROIPool); the training-only functions raise. At this revision none of them is called: the
  reference's ``layers/nms.py`` and ``layers/roi_align.py`` take ``torchvision.ops.nms`` and
  ``torchvision.ops.roi_align`` whenever torchvision imports (it always does: the transforms need
  it). The fixture records which ``_C`` functions ran (``c_calls_head``: none), and
  ``legacy_c_nms`` repeats ``filter1_ignore_reg`` with the ``_C.nms`` that ``layers/nms.py``
  bound before the June 2021 upgrade (462a68f; e.g. at 2df1912, the revision of the VinVL
  release months), calling it (``c_calls_legacy``).
- ``np.float`` (anchor_generator.py; removed in numpy 1.24) is set to the builtin ``float``,
  which it always aliased, and ``torch._six`` (utils/imports.py; removed in torch 2.0) to a
  module whose ``PY3`` is True, as it was on Python 3.
- Modules imported but never used at inference are empty stand-ins: ``timm``, ``einops`` (the
  ViL backbone), ``cv2`` (TSV dataset tools), ``maskrcnn_benchmark.utils.model_zoo`` (URL
  downloads for the checkpointer; it imports names torch no longer has), and the package
  ``maskrcnn_benchmark.data`` (its ``__init__`` imports every dataset; only ``data/transforms``
  is loaded, from its own files).
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import re
import subprocess
import sys
import tempfile
import time
import types
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

FIXTURE = Path(__file__).with_suffix(".json")
SOURCE = "github.com/microsoft/scene_graph_benchmark"
REFERENCE_COMMIT = "8e14944f3cc9f178b1c5626482fad509068f1395"  # the snapshot this fixture was made from
CONFIG_FILE = "sgg_configs/vgattr/vinvl_x152c4.yaml"

# The tiny body: StageSpec(index, block_count, return_features) for res2..res4, registered in
# maskrcnn_benchmark's resnet._STAGE_SPECS and modeling.registry.BACKBONES under this name.
TINY_CONV_BODY = "R-TINY-C4"
TINY_STAGES = ((1, 1, False), (2, 1, False), (3, 1, True))
# On top of vinvl_x152c4.yaml, merged after scene_graph_benchmark's sg_cfg as tools/test_sg_net.py does.
TINY_OVERRIDES = {
    "MODEL.BACKBONE.CONV_BODY": TINY_CONV_BODY,
    "MODEL.RESNETS.NUM_GROUPS": 2,
    "MODEL.RESNETS.WIDTH_PER_GROUP": 4,
    "MODEL.RESNETS.STEM_OUT_CHANNELS": 8,
    "MODEL.ROI_BOX_HEAD.NUM_CLASSES": 13,
    "MODEL.ROI_ATTRIBUTE_HEAD.NUM_ATTRIBUTES": 8,
    "MODEL.ROI_ATTRIBUTE_HEAD.CLS_EMD_DIM": 8,
    "MODEL.ROI_ATTRIBUTE_HEAD.ATTR_EMD_DIM": 16,
    "MODEL.ROI_ATTRIBUTE_HEAD.MAX_NUM_ATTR_PER_OBJ": 4,
    "MODEL.RPN.PRE_NMS_TOP_N_TEST": 600,
    "MODEL.RPN.POST_NMS_TOP_N_TEST": 60,
    "INPUT.MIN_SIZE_TEST": 160,
    "INPUT.MAX_SIZE_TEST": 256,
}
# Every run: on the CPU, and with TEST.OUTPUT_FEATURE (without it NMS_FILTER 1 attaches no
# "box_features", the field predictions.tsv's "feature" column is read from).
RUN_OVERRIDES = {"MODEL.DEVICE": "cpu", "TEST.OUTPUT_FEATURE": True}
SETTINGS = {
    "filter1_ignore_reg": {"MODEL.ROI_HEADS.NMS_FILTER": 1, "TEST.IGNORE_BOX_REGRESSION": True},
    "filter1_reg": {"MODEL.ROI_HEADS.NMS_FILTER": 1, "TEST.IGNORE_BOX_REGRESSION": False},
    "filter2_ignore_reg": {"MODEL.ROI_HEADS.NMS_FILTER": 2, "TEST.IGNORE_BOX_REGRESSION": True},
    "filter2_reg": {"MODEL.ROI_HEADS.NMS_FILTER": 2, "TEST.IGNORE_BOX_REGRESSION": False},
}
FEATURE_DIMS = list(range(0, 2048, 64))  # the box-feature entries kept for every box
FULL_FEATURE_SETTING = "filter1_ignore_reg"  # the setting whose first box per image keeps its whole feature


def _spec(stem, blocks, groups, width, classes, attributes, cls_emd, attr_emd, per_obj, pre, post, min_size, max_size):
    return {
        "stem_channels": stem,  # conv 7x7/2 pad 3 (no bias), FrozenBN, ReLU, maxpool 3x3/2 pad 1
        "blocks_per_stage": list(blocks),  # res2, res3, res4 (the backbone's output is res4's)
        "stage_out_channels": [256, 512, 1024],
        "num_groups": groups,
        "width_per_group": width,
        "bottleneck_channels": [groups * width * 2**i for i in range(3)],
        "stride_in_1x1": False,  # the stride sits on the grouped 3x3 conv
        "stage_first_stride": [1, 2, 2],
        "res5_head_blocks": 3,
        "res5_head_channels": 2048,
        "res5_head_bottleneck_channels": groups * width * 8,
        "res5_head_first_stride": 2,
        "res5_dilation": 1,
        "num_classes": classes,  # with background (index 0)
        "num_attributes": attributes,  # with __no_attribute__ (index 0)
        "attr_class_embed_dim": cls_emd,
        "attr_hidden_dim": attr_emd,
        "max_attrs_per_box": per_obj,
        "max_attrs_per_image": 100,
        "attr_score_thresh": 0.05,
        "anchor_sizes": [32, 64, 128, 256, 512],
        "anchor_ratios": [0.5, 1.0, 2.0],
        "anchor_stride": 16,
        "rpn_pre_nms_top_n": pre,
        "rpn_post_nms_top_n": post,
        "rpn_nms_thresh": 0.7,
        "rpn_min_size": 0,
        "rpn_bbox_reg_weights": [1.0, 1.0, 1.0, 1.0],
        "pooler_resolution": 14,
        "pooler_scale": 1.0 / 16,
        "pooler_sampling_ratio": 0,
        "bbox_reg_weights": [10.0, 10.0, 5.0, 5.0],
        "cls_agnostic_bbox_reg": False,
        "score_thresh": 0.2,
        "nms_thresh": 0.5,  # NMS_FILTER 2's class-agnostic NMS (and NMS_FILTER 0's per-class one)
        "filter1_class_nms_thresh": 0.3,  # written in filter_results_peter
        "detections_per_img": 100,
        "min_detections_per_img": 10,
        "min_size_test": min_size,
        "max_size_test": max_size,
        "pixel_mean_bgr": [103.53, 116.28, 123.675],
        "pixel_std": [1.0, 1.0, 1.0],
        "to_bgr255": True,
        "size_divisibility": 0,
    }


TINY_SPEC = _spec(8, (1, 1, 1), 2, 4, 13, 8, 8, 16, 4, 600, 60, 160, 256)
FULL_SPEC = _spec(64, (3, 8, 36), 32, 8, 1595, 525, 256, 512, 16, 6000, 300, 600, 1000)

ANCHORS = "rpn.anchor_generator.cell_anchors.0"
SHARED = ("attribute.feature_extractor.", "roi_heads.box.feature_extractor.")  # one module, two names
_FROZEN_BN = re.compile(r"(bn\d|downsample\.1)\.(weight|bias|running_mean|running_var)$")


def legacy_anchors(stride=16, sizes=(32, 64, 128, 256, 512), ratios=(0.5, 1.0, 2.0)) -> torch.Tensor:
    """maskrcnn_benchmark's generate_anchors (Detectron's), rows ratio-major then size, float32:
    the value the released checkpoint's rpn.anchor_generator.cell_anchors.0 buffer holds."""
    size = float(stride)
    ctr = 0.5 * (size - 1)
    rows = []
    for ratio in ratios:
        ws = np.round(np.sqrt(size * size / ratio))
        hs = np.round(ws * ratio)
        for s in sizes:
            w, h = ws * (s / stride), hs * (s / stride)
            rows.append([ctr - 0.5 * (w - 1), ctr - 0.5 * (h - 1), ctr + 0.5 * (w - 1), ctr + 0.5 * (h - 1)])
    return torch.tensor(rows, dtype=torch.float64).float()


def fill(key: str, shape) -> torch.Tensor:
    """The tensor of state-dict `key` (no ``module.`` prefix): random, seeded by the key's name
    (``attribute.feature_extractor.*`` as its ``roi_heads.box.feature_extractor.*`` twin), scaled
    so the random network acts like a detector: He-scaled convs, FrozenBN near identity (the
    stem's running_var absorbs the 0-255 pixel scale; bn3 and downsample scales 0.7; a negative
    shift in the head's last bn3 sparsifies the box features), peaky RPN and class logits with a
    background bias, peaky attribute logits. The anchor buffer is the real anchors."""
    if key.startswith(SHARED[0]):
        key = SHARED[1] + key[len(SHARED[0]) :]
    shape = tuple(shape)
    if key == ANCHORS:
        anchors = legacy_anchors()
        assert tuple(anchors.shape) == shape, (key, shape)
        return anchors
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    n = torch.randn(shape, generator=g)
    bn = _FROZEN_BN.search(key)
    if bn:
        last = bn.group(1) in ("bn3", "downsample.1")
        if bn.group(2) == "weight":
            return (0.7 if last else 1.0) + 0.1 * n
        if bn.group(2) == "bias":
            return (-1.0 if key.endswith("head.layer4.2.bn3.bias") else 0.0) + 0.1 * n
        if bn.group(2) == "running_mean":
            return 0.1 * n
        return (3000.0 if key.endswith("stem.bn1.running_var") else 1.0) * (1.0 + 0.2 * n.abs())
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
    if key == "rpn.head.cls_logits.weight":
        return n * 4.0 / math.sqrt(fan_in)
    if key == "rpn.head.cls_logits.bias":
        return -1.0 + 0.5 * n
    if key == "rpn.head.bbox_pred.weight":
        return n * 0.2 / math.sqrt(fan_in)
    if key.endswith("cls_score.weight"):
        return n * 4.0 / math.sqrt(fan_in)
    if key.endswith("cls_score.bias"):
        bias = 0.5 * n
        bias[0] += 3.7  # background
        return bias
    if key.endswith("predictor.bbox_pred.weight"):
        return n * 2.0 / math.sqrt(fan_in)
    if key.endswith("predictor.bbox_pred.bias"):
        return 0.1 * n
    if key.endswith("cls_embedding.weight"):
        return n
    if key.endswith("attr_score.weight"):
        return n * 8.0 / math.sqrt(fan_in)
    if key.endswith("attr_score.bias"):
        return 0.5 * n
    if key.endswith(".bias"):
        return 0.05 * n
    return n * math.sqrt(2.0 / fan_in)


def published_checkpoint(shapes: dict) -> OrderedDict:
    """What to ``torch.save`` for a file laid out as the released vinvl_vg_x152c4.pth (see the
    module docstring): {"module." + key: fill(key, shape)} in state-dict order, the two names of
    the shared box feature extractor holding one tensor."""
    state: OrderedDict = OrderedDict()
    made: dict = {}
    for key, shape in shapes.items():
        twin = SHARED[1] + key[len(SHARED[0]) :] if key.startswith(SHARED[0]) else key
        if twin not in made:
            made[twin] = fill(twin, shape)
        state["module." + key] = made[twin]
    return state


def images() -> list[np.ndarray]:
    """Three RGB uint8 images (120x200, 233x151, 96x96): colour gradients with a checker
    texture, under filled rectangles and ellipses."""
    scenes = [
        (
            120,
            200,
            [
                ("rect", (20, 30, 90, 100), (230, 40, 40)),
                ("ellipse", (110, 20, 190, 80), (40, 200, 60)),
                ("rect", (60, 70, 150, 115), (30, 60, 220)),
            ],
        ),
        (
            233,
            151,
            [
                ("ellipse", (10, 15, 120, 110), (250, 220, 30)),
                ("rect", (30, 120, 140, 220), (120, 30, 160)),
                ("rect", (70, 60, 100, 180), (20, 20, 20)),
            ],
        ),
        (
            96,
            96,
            [
                ("ellipse", (8, 8, 60, 60), (255, 255, 255)),
                ("rect", (40, 45, 90, 90), (200, 80, 20)),
            ],
        ),
    ]
    out = []
    for h, w, shapes in scenes:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
        img = np.stack([40 + 150 * xx / w, 60 + 120 * yy / h, 200 - 150 * (xx + yy) / (w + h)], -1)
        for kind, (x1, y1, x2, y2), colour in shapes:
            if kind == "rect":
                inside = (xx >= x1) & (xx < x2) & (yy >= y1) & (yy < y2)
            else:
                cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
                inside = ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1
            img[inside] = colour
        checker = ((xx // 6 + yy // 6) % 2) * 12
        out.append(np.clip(np.round(img + checker[..., None]), 0, 255).astype(np.uint8))
    return out


# ----------------------------------------------------------------------------------------------
# Below: only for making the fixture with the reference code.


def nms_cpu(dets: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """maskrcnn_benchmark/csrc/cpu/nms_cpu.cpp in float32 torch ops, in its order of operations."""
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    x1, y1, x2, y2 = (dets[:, i].contiguous() for i in range(4))
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.sort(0, descending=True)[1]
    one, zero = torch.ones((), dtype=dets.dtype), torch.zeros((), dtype=dets.dtype)
    thresh = torch.tensor(threshold, dtype=torch.float32).to(dets.dtype)  # the C++ takes a float
    suppressed = torch.zeros(dets.shape[0], dtype=torch.bool)
    for pos in range(order.numel()):
        i = int(order[pos])
        if suppressed[i]:
            continue
        js = order[pos + 1 :]
        js = js[~suppressed[js]]
        if js.numel() == 0:
            continue
        w = torch.maximum(zero, torch.minimum(x2[i], x2[js]) - torch.maximum(x1[i], x1[js]) + one)
        h = torch.maximum(zero, torch.minimum(y2[i], y2[js]) - torch.maximum(y1[i], y1[js]) + one)
        inter = w * h
        ovr = inter / (areas[i] + areas[js] - inter)
        suppressed[js[ovr >= thresh]] = True
    return torch.nonzero(~suppressed).squeeze(1)


C_CALLS: dict = {}


def fake_c_module() -> types.ModuleType:
    """The stand-in for maskrcnn_benchmark._C (see the module docstring)."""
    import torchvision  # noqa: F401  (registers torch.ops.torchvision)

    module = types.ModuleType("maskrcnn_benchmark._C")

    def counted(name, fn):
        def call(*args, **kwargs):
            C_CALLS[name] = C_CALLS.get(name, 0) + 1
            return fn(*args, **kwargs)

        return call

    def roi_align_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
        return torch.ops.torchvision.roi_align(
            input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, False
        )

    def roi_pool_forward(input, rois, spatial_scale, pooled_height, pooled_width):
        return torch.ops.torchvision.roi_pool(input, rois, spatial_scale, pooled_height, pooled_width)

    def missing(name):
        def call(*args, **kwargs):
            raise NotImplementedError(f"maskrcnn_benchmark._C.{name}: not used at inference")

        return call

    module.nms = counted("nms", nms_cpu)
    module.roi_align_forward = counted("roi_align_forward", roi_align_forward)
    module.roi_pool_forward = counted("roi_pool_forward", roi_pool_forward)
    for name in (
        "roi_align_backward",
        "roi_pool_backward",
        "sigmoid_focalloss_forward",
        "sigmoid_focalloss_backward",
        "deform_conv_forward",
        "deform_conv_backward_input",
        "deform_conv_backward_parameters",
        "modulated_deform_conv_forward",
        "modulated_deform_conv_backward",
        "deform_psroi_pooling_forward",
        "deform_psroi_pooling_backward",
    ):
        setattr(module, name, missing(name))
    return module


def prepare_reference(reference: Path) -> None:
    """Make the reference importable here (the stand-ins of the module docstring), and register
    the tiny stage spec through the reference's registries."""
    np.float = float  # what anchor_generator.py's np.float always was
    six = types.ModuleType("torch._six")  # utils/imports.py asks torch._six.PY3 (gone since torch 2.0)
    six.PY3 = True
    torch._six = sys.modules["torch._six"] = six
    c_module = fake_c_module()
    sys.modules["maskrcnn_benchmark._C"] = c_module
    for name in ("timm", "timm.models", "timm.models.layers", "einops", "cv2"):
        sys.modules.setdefault(name, types.ModuleType(name))
    timm_layers = sys.modules["timm.models.layers"]
    timm_layers.DropPath = timm_layers.trunc_normal_ = timm_layers.to_2tuple = None
    sys.modules["einops"].rearrange = None
    sys.path.insert(0, str(reference))
    import maskrcnn_benchmark

    maskrcnn_benchmark._C = c_module
    zoo = types.ModuleType("maskrcnn_benchmark.utils.model_zoo")  # URL downloads; needs torch<1.x names
    zoo.cache_url = None
    sys.modules["maskrcnn_benchmark.utils.model_zoo"] = zoo
    data = types.ModuleType("maskrcnn_benchmark.data")
    data.__path__ = [str(reference / "maskrcnn_benchmark" / "data")]
    sys.modules["maskrcnn_benchmark.data"] = data

    from maskrcnn_benchmark.modeling import registry
    from maskrcnn_benchmark.modeling.backbone import backbone, resnet

    stages = tuple(resnet.StageSpec(index=i, block_count=c, return_features=r) for i, c, r in TINY_STAGES)
    resnet._STAGE_SPECS.register(TINY_CONV_BODY, stages)
    registry.BACKBONES.register(TINY_CONV_BODY, backbone.build_resnet_backbone)


def make_cfg(reference: Path, *overrides: dict):
    """tools/test_sg_net.py's config: defaults + sg_cfg, the yaml, then the overrides."""
    from maskrcnn_benchmark.config import cfg as defaults
    from scene_graph_benchmark.config import sg_cfg

    cfg = defaults.clone()
    cfg.set_new_allowed(True)
    cfg.merge_from_other_cfg(sg_cfg)
    cfg.set_new_allowed(False)
    cfg.merge_from_file(str(reference / CONFIG_FILE))
    for override in overrides:
        cfg.merge_from_list([item for pair in override.items() for item in pair])
    cfg.freeze()
    return cfg


def spec_of(cfg) -> dict:
    """`TINY_SPEC`'s fields as the config gives them (checked against it)."""
    from maskrcnn_benchmark.modeling.backbone import resnet

    m, r, rpn, heads, attr = (
        cfg.MODEL,
        cfg.MODEL.RESNETS,
        cfg.MODEL.RPN,
        cfg.MODEL.ROI_HEADS,
        cfg.MODEL.ROI_ATTRIBUTE_HEAD,
    )
    body = resnet._STAGE_SPECS[m.BACKBONE.CONV_BODY]
    assert r.RES2_OUT_CHANNELS == 256 and r.BACKBONE_OUT_CHANNELS == 1024 and not m.CLS_AGNOSTIC_BBOX_REG
    assert r.STRIDE_IN_1X1 is False and r.RES5_DILATION == 1 and len(rpn.ANCHOR_STRIDE) == 1
    assert tuple(heads.BBOX_REG_WEIGHTS) == (10.0, 10.0, 5.0, 5.0) and heads.NMS == 0.5
    assert (heads.SCORE_THRESH, heads.DETECTIONS_PER_IMG, heads.MIN_DETECTIONS_PER_IMG) == (0.2, 100, 10)
    assert (attr.MAX_NUM_ATTR_PER_IMG, attr.POSTPROCESS_ATTRIBUTES_THRESHOLD) == (100, 0.05)
    assert attr.SHARE_BOX_FEATURE_EXTRACTOR and attr.PREDICTOR == "AttributeRCNNPredictor"
    assert list(rpn.ANCHOR_SIZES) == [32, 64, 128, 256, 512] and list(rpn.ASPECT_RATIOS) == [0.5, 1.0, 2.0]
    assert (rpn.ANCHOR_STRIDE[0], rpn.NMS_THRESH, rpn.MIN_SIZE, rpn.USE_FPN) == (16, 0.7, 0, False)
    box = m.ROI_BOX_HEAD
    assert (box.POOLER_RESOLUTION, tuple(box.POOLER_SCALES), box.POOLER_SAMPLING_RATIO) == (14, (1.0 / 16,), 0)
    assert box.FEATURE_EXTRACTOR == "ResNet50Conv5ROIFeatureExtractor" and box.PREDICTOR == "FastRCNNPredictor"
    i = cfg.INPUT
    assert list(i.PIXEL_MEAN) == [103.53, 116.28, 123.675] and list(i.PIXEL_STD) == [1.0, 1.0, 1.0] and i.TO_BGR255
    assert cfg.DATALOADER.SIZE_DIVISIBILITY == 0
    return _spec(
        r.STEM_OUT_CHANNELS,
        [s.block_count for s in body],
        r.NUM_GROUPS,
        r.WIDTH_PER_GROUP,
        box.NUM_CLASSES,
        attr.NUM_ATTRIBUTES,
        attr.CLS_EMD_DIM,
        attr.ATTR_EMD_DIM,
        attr.MAX_NUM_ATTR_PER_OBJ,
        rpn.PRE_NMS_TOP_N_TEST,
        rpn.POST_NMS_TOP_N_TEST,
        i.MIN_SIZE_TEST,
        i.MAX_SIZE_TEST,
    )


def _g(x: float) -> float:
    return float(f"{float(x):.6g}")


def _rows(t: torch.Tensor) -> list:
    return [[_g(v) for v in row] for row in t.tolist()]


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.detach().to(torch.float32).contiguous().numpy().tobytes()).decode()


def load_model(reference: Path, cfg, workdir: Path):
    """AttrRCNN(cfg), loaded by DetectronCheckpointer from a file in the released layout."""
    from maskrcnn_benchmark.utils.checkpoint import DetectronCheckpointer
    from scene_graph_benchmark.AttrRCNN import AttrRCNN

    model = AttrRCNN(cfg)
    model.to(cfg.MODEL.DEVICE)
    assert torch.equal(model.state_dict()[ANCHORS], legacy_anchors()), "the anchors the reference makes differ"
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    path = workdir / "vinvl_vg_x152c4.pth"
    torch.save(published_checkpoint(shapes), path)
    DetectronCheckpointer(cfg, model, save_dir=str(workdir)).load(str(path), use_latest=False)
    for key, value in model.state_dict().items():
        assert torch.equal(value, fill(key, value.shape)), f"{key} was not loaded"
    return model.eval(), shapes


def preprocess(cfg, image: np.ndarray):
    """The dataset's PIL RGB image through build_transforms(cfg, is_train=False), batched alone."""
    from maskrcnn_benchmark.data.transforms import build_transforms
    from maskrcnn_benchmark.data.transforms import transforms as T
    from maskrcnn_benchmark.structures.image_list import to_image_list
    from PIL import Image

    pil = Image.fromarray(image)
    resized, _ = T.Resize(cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST)(pil)
    tensor, _ = build_transforms(cfg, is_train=False)(pil, None)
    batch = to_image_list((tensor,), cfg.DATALOADER.SIZE_DIVISIBILITY)
    positions = [(c, (7 * k) % tensor.shape[1], (13 * k) % tensor.shape[2]) for k in range(8) for c in range(3)]
    summary = {
        "shape": list(tensor.shape),
        "resized_rgb_crc32": zlib.crc32(np.asarray(resized).tobytes()),
        "sum": _g(tensor.double().sum()),
        "mean_per_channel": [_g(v) for v in tensor.double().mean((1, 2))],
        "abs_sum": _g(tensor.double().abs().sum()),
        "samples": [[c, y, x, _g(tensor[c, y, x])] for c, y, x in positions],
    }
    return batch, summary


def run_image(model, cfg, image: np.ndarray, full_feature: bool) -> tuple:
    """One image through the model as compute_on_dataset runs it; the outputs as
    convert_predictions_to_tsv reads them (resized to the original image)."""
    batch, summary = preprocess(cfg, image)
    seen: dict = {}

    def keep(name, get):
        def hook(module, inputs, output):  # returns None: leaves the output alone
            seen.setdefault(name, get(output))

        return hook

    hooks = [
        model.rpn.register_forward_hook(keep("proposals", lambda o: o[0][0])),
        model.roi_heads.box.feature_extractor.register_forward_hook(keep("roi", lambda o: o)),
        model.roi_heads.box.predictor.register_forward_hook(keep("class_logits", lambda o: o[0])),
        model.attribute.predictor.register_forward_hook(keep("attr_logits", lambda o: o[0])),
    ]
    with torch.no_grad():
        output = model(batch)
    for hook in hooks:
        hook.remove()
    result = output[0].to(torch.device("cpu"))
    height, width = image.shape[:2]
    resized = result.resize((width, height))
    proposals = seen["proposals"]
    pooled = model.roi_heads.box.post_processor.avgpool(seen["roi"]).flatten(1)  # every proposal's feature
    features = resized.get_field("box_features")
    index = []  # the proposal each detection's feature is (NMS_FILTER keeps the proposal's feature)
    for row in features:
        match = (pooled == row).all(1).nonzero().flatten().tolist()
        index.append(match[0] if match else -1)
    scores = resized.get_field("scores")
    out = {
        "rpn_proposals": len(proposals),
        "boxes": _rows(resized.bbox),
        "boxes_input": _rows(result.bbox),
        "scores": [_g(s) for s in scores],
        "labels": resized.get_field("labels").tolist(),
        "attr_labels": resized.get_field("attr_labels").tolist(),
        "attr_scores": _rows(resized.get_field("attr_scores")),
        "proposal_index": index,
        "feature_sampled": _rows(features[:, FEATURE_DIMS]),
        "feature_sum": [_g(v) for v in features.double().sum(1)],
        "feature_sq_sum": [_g(v) for v in (features.double() ** 2).sum(1)],
    }
    if full_feature and len(features):
        out["feature0_b64"] = _b64(features[0])
    # How far the probabilities the thresholds compare lie from them (printed, to judge robustness).
    class_probs = torch.softmax(seen["class_logits"], -1)[:, 1:]
    attr_probs = torch.softmax(seen["attr_logits"], -1)[:, 1:]
    margins = {
        "score": float((class_probs - cfg.MODEL.ROI_HEADS.SCORE_THRESH).abs().min()),
        "attr": float((attr_probs - cfg.MODEL.ROI_ATTRIBUTE_HEAD.POSTPROCESS_ATTRIBUTES_THRESHOLD).abs().min()),
    }
    extra = {"input": summary, "proposals": proposals, "size": [height, width], "margins": margins}
    return out, extra


def run_setting(reference: Path, name: str, workdir: Path, legacy_nms: bool = False) -> tuple:
    cfg = make_cfg(reference, TINY_OVERRIDES, RUN_OVERRIDES, SETTINGS[name])
    assert spec_of(cfg) == TINY_SPEC
    model, shapes = load_model(reference, cfg, workdir)
    boxlist_ops = sys.modules["maskrcnn_benchmark.structures.boxlist_ops"]
    box_inference = sys.modules["maskrcnn_benchmark.modeling.roi_heads.box_head.inference"]
    saved = boxlist_ops._box_nms, box_inference.box_nms
    if legacy_nms:  # what layers/nms.py bound before commit 462a68f: nms = _C.nms
        boxlist_ops._box_nms = box_inference.box_nms = sys.modules["maskrcnn_benchmark._C"].nms
    try:
        runs = [run_image(model, cfg, image, name == FULL_FEATURE_SETTING and not legacy_nms) for image in images()]
    finally:
        boxlist_ops._box_nms, box_inference.box_nms = saved
    return runs, shapes


def summary_line(name: str, per_image: list) -> str:
    parts = []
    for result in per_image:
        scores = np.array(result["scores"])
        parts.append(f"{len(scores)} boxes ({int((scores >= 0.2).sum())} >= 0.2)")
    return f"{name}: " + "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="a scene_graph_benchmark checkout")
    parser.add_argument("--keys-txt", type=Path, help="also write the full model's key<TAB>shape list here")
    args = parser.parse_args()
    start = time.time()
    reference = args.reference.resolve()
    prepare_reference(reference)
    commit = REFERENCE_COMMIT  # an exported tree (git archive) has no history: the snapshot's commit
    try:
        git = ["git", "-C", str(reference), "rev-parse", "--show-toplevel", "HEAD"]
        found = subprocess.run(git, capture_output=True, text=True).stdout.split()
        if len(found) == 2 and Path(found[0]).resolve() == reference:
            commit = found[1]
    except OSError:
        pass

    from maskrcnn_benchmark.layers import nms as layers_nms
    from maskrcnn_benchmark.layers import roi_align as layers_roi_align
    from scene_graph_benchmark.AttrRCNN import AttrRCNN

    full_cfg = make_cfg(reference, RUN_OVERRIDES)
    assert spec_of(full_cfg) == FULL_SPEC
    full_shapes = {k: list(v.shape) for k, v in AttrRCNN(full_cfg).state_dict().items()}
    if args.keys_txt:
        head = (
            f"# AttrRCNN(cfg).state_dict() for {CONFIG_FILE} at {SOURCE}@{commit}: {len(full_shapes)} tensors,\n"
            "# all float32, in state-dict order (key<TAB>shape). The released vinvl_vg_x152c4.pth has each key\n"
            "# with a 'module.' prefix; attribute.feature_extractor.* is roi_heads.box.feature_extractor.* again.\n"
        )
        args.keys_txt.write_text(head + "".join(f"{k}\t{tuple(s)}\n" for k, s in full_shapes.items()))

    out: dict = {
        "source": f"{SOURCE} ({CONFIG_FILE}, scene_graph_benchmark/AttrRCNN.py)",
        "commit": commit,
        "tiny_conv_body": TINY_CONV_BODY,
        "tiny_stages": [list(s) for s in TINY_STAGES],
        "tiny_overrides": TINY_OVERRIDES,
        "run_overrides": RUN_OVERRIDES,
        "settings": SETTINGS,
        "tiny_spec": TINY_SPEC,
        "nms": f"{layers_nms.__module__}.{layers_nms.__name__}",
        "roi_align": f"{layers_roi_align.__module__}.{layers_roi_align.__name__}",
        "feature_dims": FEATURE_DIMS,
        "anchors": legacy_anchors().tolist(),
        "full_shapes": full_shapes,
    }
    images_out = [{} for _ in images()]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SETTINGS:
            runs, shapes = run_setting(reference, name, Path(tmp))
            out.setdefault("shapes", {k: list(s) for k, s in shapes.items()})
            results[name] = [r for r, _ in runs]
            for slot, (_, extra) in zip(images_out, runs):
                if not slot:
                    slot.update(
                        size=extra["size"],
                        input=extra["input"],
                        proposals=_rows(extra["proposals"].bbox),
                        objectness=[_g(v) for v in extra["proposals"].get_field("objectness")],
                    )
                assert slot["input"] == extra["input"] and slot["proposals"] == _rows(extra["proposals"].bbox)
            print(summary_line(name, results[name]))
            print("  smallest |probability - threshold|:", [extra["margins"] for _, extra in runs])
        out["c_calls_head"] = dict(C_CALLS)
        runs, _ = run_setting(reference, "filter1_ignore_reg", Path(tmp), legacy_nms=True)
        out["legacy_c_nms"] = {"setting": "filter1_ignore_reg", "results": [r for r, _ in runs]}
        print(summary_line("legacy_c_nms", out["legacy_c_nms"]["results"]))
        out["c_calls_legacy"] = {k: v - out["c_calls_head"].get(k, 0) for k, v in C_CALLS.items()}
    out["images"] = images_out
    out["results"] = results
    FIXTURE.write_text(json.dumps(out) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes) in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
