"""Reference grid features of facebookresearch/grid-feats-vqa (``extract_grid_feature.py``: the
conv5 map of the attribute-pretrained Faster R-CNN backbone, saved as ``<image_id>.pth``), for
the grid-feature tests.

The fixture (``grid_feats.json`` beside this file) holds no weights: every tensor of the tiny
model's state dict is a deterministic function of its key name and shape (`fill`), the
checkpoint file is laid out as the published ``X-152.pth`` / ``X-101.pth`` / ``R-50.pth`` are
(`published_checkpoint`), and the images are integer drawings (`images`, written to PNG by
`write_png`), so a test rebuilds the same checkpoint and image files from this module alone.
The fixture keeps: the source commits, `TINY_OVERRIDES`, the tiny model's key -> shape (and the
keys the grid path reads), the full key -> shape of the X-152 / X-101 / R-50 grid models, and
per case (`CASES`) the decoded, resized and normalised input (shapes, a digest of the resized
uint8 image, summaries) and the conv5 map read back from the ``.pth`` file the reference wrote
(float32, little-endian, base64).

Made once, on CPU, with the reference code (never vendored; fetch
github:facebookresearch/grid-feats-vqa and github:facebookresearch/detectron2 and check the
latter out at ``DETECTRON2_COMMIT``, the commit grid-feats-vqa's README pins, ``ffff8ac``):

    python tests/reference/grid_feats.py --grid /path/to/grid-feats-vqa --detectron2 /path/to/detectron2

with torch, torchvision, fvcore 0.1.1.post200513 (the oldest on PyPI, the one nearest to
``ffff8ac``; it still has ``fvcore.common.file_io``), pycocotools, yacs and Pillow 9.5 (the last
release with ``Image.LINEAR``, which ``detectron2/data/transforms/transform.py`` reads at import).
Both repositories run unchanged from source. The one stand-in: detectron2's compiled extension
``detectron2._C`` is an empty module put in ``sys.modules`` by this script (`stub_extension`)
whose every op raises when called. The grid path (mapper, ``preprocess_image``, the ResNet
backbone, ``get_conv5_features``, checkpoint loading) calls none of them (they are ROIAlign,
deformable conv, rotated NMS / boxes); nothing is substituted. Only the two version strings
that ``collect_env_info`` logs in ``default_setup`` return ``"stub"``.

The run follows ``extract_grid_feature.py``'s ``main`` with its own functions: ``setup`` (the
config file ``configs/X-152-grid.yaml`` after ``add_attribute_config``, `TINY_OVERRIDES` and
`RUN_OPTS` as the command-line opts, ``RES5_DILATION`` forced to 1 there, ``default_setup``),
``build_model``, ``DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(
cfg.MODEL.WEIGHTS, resume=True)`` on a file written with `published_checkpoint`, and
``do_feature_extraction``. Its dataset is a detectron2 dataset registered here with COCO-style
records (``file_name``, ``height`` and ``width`` of the decoded image, ``image_id``, empty
``annotations``, as ``load_coco_json`` makes for ``coco_2015_test``), since the script's own
choices are COCO splits on disk; ``dataset_to_folder_mapper`` gets an entry for it. The loader,
mapper and extraction loop are the reference's. The X-101 std case is a second model built the
same way with ``MODEL.PIXEL_STD`` added to the opts. Then the same loader runs once more to
record what ``preprocess_image`` made, and the conv5 map recomputed from it must equal the file.
`RUN_OPTS` only place the run (CPU, no loader workers, where files go); they change no number.
About 15 s on 2 cores; two runs give the same fixture.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
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
GRID_REPO = "github.com/facebookresearch/grid-feats-vqa"
GRID_COMMIT = "26773876a2c77f67a8e89820bea6536845381765"
DETECTRON2_REPO = "github.com/facebookresearch/detectron2"
DETECTRON2_COMMIT = "ffff8acc35ea88ad1cb1806ab0f00b4c1c5dbfd9"
BASE_CONFIG = "configs/X-152-grid.yaml"
FULL_CONFIGS = {
    "X-152": "configs/X-152-grid.yaml",
    "X-101": "configs/X-101-grid.yaml",
    "R-50": "configs/R-50-grid.yaml",
}

# detectron2 cfg overrides, on X-152-grid.yaml after add_attribute_config: a tiny model of the
# same family (ResNeXt with stride in the 3x3, FrozenBN, res5 output, attribute head).
TINY_OVERRIDES = {
    "MODEL.RESNETS.DEPTH": 50,
    "MODEL.RESNETS.NUM_GROUPS": 2,
    "MODEL.RESNETS.WIDTH_PER_GROUP": 4,
    "MODEL.RESNETS.STEM_OUT_CHANNELS": 8,
    "MODEL.RESNETS.RES2_OUT_CHANNELS": 16,
    "MODEL.RESNETS.STRIDE_IN_1X1": False,
    "INPUT.MIN_SIZE_TEST": 160,
    "INPUT.MAX_SIZE_TEST": 256,
    "MODEL.ROI_HEADS.NUM_CLASSES": 7,
    "MODEL.ROI_BOX_HEAD.FC_DIM": 16,
    "MODEL.ROI_ATTRIBUTE_HEAD.NUM_CLASSES": 5,
    "MODEL.ROI_ATTRIBUTE_HEAD.OBJ_EMBED_DIM": 4,
    "MODEL.ROI_ATTRIBUTE_HEAD.FC_DIM": 8,
}
# Placement only: CPU, the loader in-process, and the checkpoint / output paths (set at run time).
RUN_OPTS = {"MODEL.DEVICE": "cpu", "DATALOADER.NUM_WORKERS": 0}
X101_PIXEL_STD = [57.375, 57.12, 58.395]  # configs/X-101-grid.yaml's MODEL.PIXEL_STD

# The same tiny backbone in neutral terms (what the resolved cfg gives).
TINY_SPEC = {
    "blocks_per_stage": [3, 4, 6, 3],  # res2..res5 (DEPTH 50)
    "num_groups": 2,
    "width_per_group": 4,  # res2 bottleneck = 2 * 4 = 8, doubled each stage
    "stem_out_channels": 8,
    "res2_out_channels": 16,  # doubled each stage: res5 out = 128
    "out_channels": 128,
    "stride_in_1x1": False,  # stride 2 of res3/res4/res5's first block on the 3x3 conv
    "res5_dilation": 1,  # extract_grid_feature.py forces it (the training config says 2)
    "norm": "FrozenBN",
    "frozen_bn_eps": 1e-5,
    "pixel_mean": [103.53, 116.28, 123.675],  # BGR order
    "pixel_std": [1.0, 1.0, 1.0],
    "input_format": "BGR",
    "min_size_test": 160,
    "max_size_test": 256,
    "resize_interp": "PIL.Image.BILINEAR on uint8",
    "size_divisibility": 0,
}

# (height, width) of `images`: two bind MAX_SIZE_TEST (0: 120x200 -> 154x256, 3: 480x1100 ->
# 112x256), one does not (1: 233x151 -> 247x160, round-half-up matters), one is upscaled (2).
IMAGE_HW = [(120, 200), (233, 151), (96, 96), (480, 1100)]
# What each case writes and runs: an image of `images`, written as RGB PNG, or as a one-channel
# (mode "L") PNG of its `gray` drawing, optionally with an EXIF orientation tag; pixel_std
# overrides MODEL.PIXEL_STD (X-101's values).
CASES = [
    {"name": "wide", "image": 0},
    {"name": "tall", "image": 1},
    {"name": "small_square", "image": 2},
    {"name": "large", "image": 3},
    {"name": "tall_x101_std", "image": 1, "pixel_std": X101_PIXEL_STD},
    {"name": "gray", "image": 2, "gray": True},
    {"name": "exif_rotate", "image": 0, "exif_orientation": 6},
]
SAMPLE_POINTS = [(0, 0, 0), (1, 7, 11), (2, 40, 3), (0, 100, 99), (2, -1, -1)]  # (c, y, x) of the input
FIRST_IMAGE_ID = 1000


def fill(key: str, shape) -> torch.Tensor:
    """The tensor of `key`: random, seeded by the key's name. Conv weights ~ N(0, 1/fan_in) (the
    stem's 1/16 of that, as it sees unscaled pixels); FrozenBN weight ~ 1, bias and running mean
    small, running var in [0.5, 1.5); anything else small."""
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    shape = tuple(shape)
    noise = torch.randn(shape, generator=g)
    if key.endswith("norm.running_var"):
        return 0.5 + torch.rand(shape, generator=g)
    if key.endswith("norm.running_mean"):
        return 0.1 * noise
    if key.endswith("norm.weight"):
        return 1 + 0.1 * noise
    if key.endswith("norm.bias"):
        return 0.05 * noise
    if len(shape) == 4:
        fan_in = shape[1] * shape[2] * shape[3]
        scale = fan_in**-0.5 / (16 if key.endswith("stem.conv1.weight") else 1)
        return scale * noise
    return 0.05 * noise


def _draw(h: int, w: int, k: int) -> np.ndarray:
    """Coloured shapes on a gradient, in integer arithmetic only (identical everywhere)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    r = (x * 255) // max(w - 1, 1)
    g = (y * 255) // max(h - 1, 1)
    b = ((x + y) * 127) // max(h + w - 2, 1) + 64 * (k % 2)
    img = np.stack([r, g, b], -1)
    cy, cx, rad = h // 3, w // 3, min(h, w) // 4
    img[(y - cy) ** 2 + (x - cx) ** 2 <= rad**2] = [230, 40 + 30 * k, 60]
    img[(y > h // 2) & (y < h // 2 + h // 4) & (x > w // 2) & (x < w - w // 8)] = [30, 90, 200 - 20 * k]
    checker = ((x // 3 + y // 3) % 2 == 0) & (y > h - h // 5) & (x < w // 2)
    img[checker] = [250, 250, 250]
    img[(np.abs((x - w // 2) - (y - h // 2)) <= 1)] = [10, 200, 120]  # a diagonal line
    return img.astype(np.uint8)


def images() -> list[np.ndarray]:
    """The RGB uint8 images (H, W, 3) of sizes `IMAGE_HW`."""
    return [_draw(h, w, k) for k, (h, w) in enumerate(IMAGE_HW)]


def gray(image: np.ndarray) -> np.ndarray:
    """A one-channel (H, W) uint8 drawing of `image` for the mode-"L" case: (r + 2g + b) // 4."""
    i = image.astype(np.int64)
    return ((i[..., 0] + 2 * i[..., 1] + i[..., 2]) // 4).astype(np.uint8)


def write_png(path, case: dict) -> None:
    """Write `case`'s image file (lossless PNG; mode RGB, or L with "gray"; an EXIF orientation
    tag with "exif_orientation")."""
    from PIL import Image

    array = images()[case["image"]]
    pil = Image.fromarray(gray(array), mode="L") if case.get("gray") else Image.fromarray(array, mode="RGB")
    kwargs = {}
    if case.get("exif_orientation"):
        exif = Image.Exif()
        exif[0x0112] = case["exif_orientation"]
        kwargs["exif"] = exif.tobytes()
    pil.save(path, format="PNG", **kwargs)


def _is_trainable_param(key: str) -> bool:
    """Whether `key` is a parameter the training optimizer held: not a FrozenBN buffer, not the
    anchor buffer, not in the stem or res2 (frozen by BACKBONE.FREEZE_AT = 2)."""
    if ".norm." in key or "anchor_generator" in key:
        return False
    return not key.startswith(("backbone.stem.", "backbone.res2."))


def published_checkpoint(shapes: dict, iteration: int = 89999) -> dict:
    """The object ``torch.save``d as a published grid-feats-vqa ``.pth``: ``train_net.py``'s
    ``DefaultTrainer`` checkpointer (``DetectionCheckpointer(model, OUTPUT_DIR, optimizer=...,
    scheduler=...)``) saving ``model_final`` through fvcore's ``PeriodicCheckpointer`` with
    ``iteration``: {"model": state dict, "optimizer": SGD state, "scheduler": WarmupMultiStepLR
    state, "iteration": MAX_ITER - 1}; no "__author__" (only detectron2's .pkl zoo files have one).
    The state dict is an OrderedDict in `shapes`' order carrying ``_metadata`` as
    ``Module.state_dict()`` does (FrozenBatchNorm2d modules at version 3, the rest 1). The
    optimizer has one param group per trainable parameter (detectron2's ``build_optimizer``),
    momentum buffers filled like weights; none of it is read when extracting."""
    model = OrderedDict((k, fill(k, s)) for k, s in shapes.items())
    meta = OrderedDict({"": {"version": 1}})
    for key in shapes:
        parts = key.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            meta.setdefault(prefix, {"version": 3 if parts[i - 1] == "norm" else 1})
    model._metadata = meta
    trainable = [k for k in shapes if _is_trainable_param(k)]
    base_lr, steps, gamma = 0.02, (60000, 80000), 0.1
    lr = base_lr * gamma ** sum(iteration + 1 >= s for s in steps)
    group = {"lr": lr, "momentum": 0.9, "dampening": 0, "weight_decay": 0.0001, "nesterov": False}
    optimizer = {
        "state": {i: {"momentum_buffer": 0.01 * fill("momentum:" + k, shapes[k])} for i, k in enumerate(trainable)},
        "param_groups": [dict(group, initial_lr=base_lr, params=[i]) for i in range(len(trainable))],
    }
    scheduler = {
        "milestones": steps,
        "gamma": gamma,
        "warmup_factor": 0.001,
        "warmup_iters": 1000,
        "warmup_method": "linear",
        "base_lrs": [base_lr] * len(trainable),
        "last_epoch": iteration + 1,
        "_step_count": iteration + 2,
        "_get_lr_called_within_step": False,
        "_last_lr": [lr] * len(trainable),
    }
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "iteration": iteration}


def b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.detach().contiguous().float().numpy().astype("<f4").tobytes()).decode()


def unb64(s: str, shape) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype="<f4").copy()).reshape(shape)


def stub_extension() -> types.ModuleType:
    """``detectron2._C``: every op raises when called (none is, on the grid path)."""
    stub = types.ModuleType("detectron2._C")

    def missing(name):
        if name.startswith("__"):
            raise AttributeError(name)

        def op(*args, **kwargs):
            raise RuntimeError(f"detectron2._C.{name} is a stub: the grid path must not call it")

        return op

    stub.__getattr__ = missing
    stub.get_compiler_version = stub.get_cuda_version = lambda: "stub"
    sys.modules["detectron2._C"] = stub
    return stub


def _opts(d: dict) -> list:
    return [x for k, v in d.items() for x in (k, v)]


def _summary(t: torch.Tensor) -> dict:
    return {
        "mean": round(float(t.double().mean()), 6),
        "std": round(float(t.double().std()), 6),
        "min": round(float(t.min()), 6),
        "max": round(float(t.max()), 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, required=True, help="a grid-feats-vqa checkout")
    parser.add_argument("--detectron2", type=Path, required=True, help=f"a detectron2 checkout at {DETECTRON2_COMMIT}")
    args = parser.parse_args()
    started = time.time()
    torch.manual_seed(0)
    stub_extension()
    sys.path[:0] = [str(args.grid), str(args.detectron2)]
    import detectron2
    import extract_grid_feature as egf

    # this file is grid_feats.py too: the package imported must be the reference's
    assert Path(sys.modules["grid_feats"].__file__).resolve().is_relative_to(args.grid.resolve())
    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.data import DatasetCatalog
    from detectron2.data.detection_utils import read_image
    from detectron2.modeling import build_model
    from PIL import Image

    work = Path(tempfile.mkdtemp(prefix="grid_feats_"))
    out: dict = {
        "source": {
            "grid-feats-vqa": {"repo": GRID_REPO, "commit": GRID_COMMIT, "script": "extract_grid_feature.py"},
            "detectron2": {"repo": DETECTRON2_REPO, "commit": DETECTRON2_COMMIT, "version": detectron2.__version__},
            "versions": {"torch": torch.__version__, "pillow": Image.__version__, "numpy": np.__version__},
        },
        "base_config": BASE_CONFIG,
        "tiny_overrides": TINY_OVERRIDES,
        "tiny_spec": TINY_SPEC,
        "image_hw": IMAGE_HW,
        "sample_points": SAMPLE_POINTS,
    }

    def setup(config: str, extra: dict, name: str):
        ns = argparse.Namespace(config_file=str(args.grid / config), dataset=name, opts=_opts(extra))
        return egf.setup(ns)

    # The full models' key -> shape (built, not loaded).
    full = {}
    for name, config in FULL_CONFIGS.items():
        cfg = setup(config, dict(RUN_OPTS, OUTPUT_DIR=str(work / f"full_{name}")), "none")
        full[name] = {k: list(v.shape) for k, v in build_model(cfg).state_dict().items()}
    out["full_shapes"] = full

    # The case images, as PNG files, and a dataset of COCO-style records.
    records, decoded = [], {}
    for i, case in enumerate(CASES):
        path = work / f"{case['name']}.png"
        write_png(path, case)
        hw = read_image(str(path), format="BGR").shape[:2]  # the reference's reader: after EXIF
        decoded[case["name"]] = list(hw)
        records.append(
            {"file_name": str(path), "height": hw[0], "width": hw[1], "image_id": FIRST_IMAGE_ID + i, "annotations": []}
        )

    cases_out = []
    runs = {
        "default": [c for c in CASES if "pixel_std" not in c],
        "x101_std": [c for c in CASES if "pixel_std" in c],
    }
    tiny_shapes = None
    for run_name, run_cases in runs.items():
        dataset = f"vlprep_grid_fixture_{run_name}"
        DatasetCatalog.register(dataset, lambda cs=run_cases: [records[CASES.index(c)] for c in cs])
        egf.dataset_to_folder_mapper[dataset] = dataset
        extra = dict(TINY_OVERRIDES)
        if run_name == "x101_std":
            extra["MODEL.PIXEL_STD"] = X101_PIXEL_STD
        weights = work / f"tiny_{run_name}.pth"
        extra.update(RUN_OPTS, OUTPUT_DIR=str(work / run_name), **{"MODEL.WEIGHTS": str(weights)})
        cfg = setup(BASE_CONFIG, extra, dataset)
        assert cfg.MODEL.RESNETS.RES5_DILATION == 1
        model = build_model(cfg)
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        tiny_shapes = tiny_shapes or shapes
        assert shapes == tiny_shapes
        torch.save(published_checkpoint(shapes), weights)
        # extract_grid_feature.main, line by line
        DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR).resume_or_load(cfg.MODEL.WEIGHTS, resume=True)
        for k, v in model.state_dict().items():
            assert torch.equal(v, fill(k, shapes[k])), f"{k} was not loaded"
        egf.do_feature_extraction(cfg, model, dataset)
        dump = Path(cfg.OUTPUT_DIR) / "features" / dataset

        # The same loader again, to record what went into the backbone.
        model.eval()
        loader = egf.build_detection_test_loader_with_attributes(cfg, dataset)
        for case, inputs in zip(run_cases, loader):
            record = inputs[0]
            assert record["image_id"] == FIRST_IMAGE_ID + CASES.index(case)
            saved = torch.load(dump / f"{record['image_id']}.pth", map_location="cpu")
            with torch.no_grad():
                images_ = model.preprocess_image(inputs)
                again = model.roi_heads.get_conv5_features(model.backbone(images_.tensor))
            assert torch.equal(saved, again)
            image = record["image"]
            x = images_.tensor
            cases_out.append(
                {
                    **case,
                    "image_id": record["image_id"],
                    "file_name": f"{record['image_id']}.pth",
                    "original_hw": list(IMAGE_HW[case["image"]]),
                    "decoded_hw": decoded[case["name"]],
                    "resized_hw": list(image.shape[1:]),
                    "mapper_dtype": str(image.dtype),
                    "mapper_chw_sha256": hashlib.sha256(image.numpy().tobytes()).hexdigest(),
                    "mapper_channel_sums": [int(s) for s in image.long().sum(dim=(1, 2))],
                    "input_shape": list(x.shape),
                    "input_image_sizes": [list(s) for s in images_.image_sizes],
                    "input_channel_means": [round(float(m), 6) for m in x[0].double().mean(dim=(1, 2))],
                    "input_samples": [round(float(x[0, c, yy, xx]), 6) for c, yy, xx in SAMPLE_POINTS],
                    "conv5_dtype": str(saved.dtype),
                    "conv5_shape": list(saved.shape),
                    "conv5_summary": _summary(saved),
                    "conv5": b64(saved),
                }
            )
    cases_out.sort(key=lambda c: c["image_id"])
    out["tiny_shapes"] = {k: list(v) for k, v in tiny_shapes.items()}
    out["tiny_grid_keys"] = [k for k in tiny_shapes if k.startswith("backbone.")]
    out["cases"] = cases_out
    out["seconds"] = round(time.time() - started, 1)
    FIXTURE.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes) in {out['seconds']} s")


if __name__ == "__main__":
    main()
