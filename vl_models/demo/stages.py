"""The demo's data stages, as `vlprep` runs them: the shapes world, its features extracted
through the real download path (the world served on 127.0.0.1 by the caller:
`pipeline.synthetic.served`), the pretraining mixtures and the transfer tasks' datasets; each
returns what the report says of it."""

from __future__ import annotations

import json
from pathlib import Path

from vl_models.demo.config import TRANSFER_FILES, VQA_MIN_COUNT, DemoConfig


def make_world(world: Path, n_images: int, seed: int) -> dict:
    """The shapes world of `n_images` scenes in `world` (written when it has no summary yet); its summary."""
    from pipeline.synthetic import write_world

    if not (world / "summary.json").exists():
        write_world(world, n_images, seed)
    return json.loads((world / "summary.json").read_text())


def extract_features(cfg: DemoConfig, world: Path, store: Path) -> dict:
    """`vlprep extract --dataset conceptual_captions` of the served world's CC TSVs into the
    feature store `store`, with the detector of `cfg` (default: the committed shapes detector); its counts."""
    from pipeline.detect.backends.butd_c4.weights import shapes_tiny_weights
    from pipeline.detect.config import BoxCount, ExtractConfig, SelectionConfig
    from pipeline.detect.run import run_extract
    from pipeline.distribute import DistributeConfig
    from pipeline.download.fetch import FetchConfig

    summary = run_extract(
        ExtractConfig(
            out=store,
            dataset="conceptual_captions",
            inputs=(world / "Train_GCC-training.tsv", world / "Validation_GCC-1.1.0-Validation.tsv"),
            weights=Path(cfg.weights) if cfg.weights is not None else shapes_tiny_weights(),
            detector=cfg.detector,
            selection=SelectionConfig("butd", BoxCount.parse("10-20")),
            batch_size=8,
            device="cpu",
            distribute=DistributeConfig(shard_size=250, workers=2),
            fetch=FetchConfig(allow_private_network=True),
        )
    )
    return {k: summary[k] for k in ("images", "extracted", "failures", "shards_failed", "malformed_rows")}


def mixture_spec(world: Path, kinds: tuple[str, ...] = ("coco_captions", "vqa")) -> dict:
    """Captions (COCO-style JSON), region descriptions (Visual Genome JSON, train images only)
    and questions (VQA-style JSON) of the world, the sources of the given kinds; val2014 = held
    out. File paths are absolute: the spec loads wherever it is written (relative ones would be
    taken relative to the spec's folder)."""
    world = Path(world).absolute()
    a = world / "annotations"
    spec = {
        "name": "shapes-demo",
        "image_map": [str(world / "image_map.tsv")]
        + ([str(world / "vg" / "image_map.tsv")] if "vg_regions" in kinds else []),
        "answers": {"top_k": 100},
        "sources": [
            {"name": "captions", "kind": "coco_captions", "files": [str(a / "captions_train2014.json")]},
            {
                "name": "captions_val",
                "kind": "coco_captions",
                "files": [str(a / "captions_val2014.json")],
                "split": "val",
            },
            {"name": "vg", "kind": "vg_regions", "files": [str(world / "vg" / "region_descriptions.json")]},
            {
                "name": "vqa",
                "kind": "vqa",
                "files": [
                    str(a / "v2_OpenEnded_mscoco_train2014_questions.json"),
                    str(a / "v2_mscoco_train2014_annotations.json"),
                ],
            },
            {
                "name": "vqa_val",
                "kind": "vqa",
                "split": "val",
                "files": [
                    str(a / "v2_OpenEnded_mscoco_val2014_questions.json"),
                    str(a / "v2_mscoco_val2014_annotations.json"),
                ],
            },
        ],
    }
    spec["sources"] = [s for s in spec["sources"] if s["kind"] in kinds]
    return spec


def make_mixture(world: Path, store: Path, mix: Path, kinds: tuple[str, ...]) -> dict:
    """`vlprep build-mixture` of the world's sources of `kinds` (`mixture_spec`, written next to
    `mix` as ``<mix>_spec.yaml``) over `store` into `mix`; its totals and answer count."""
    import yaml

    from pipeline.mixture import Mixture
    from pipeline.mixture.build import MixtureSpec, build_mixture

    spec_path = mix.parent / f"{mix.name}_spec.yaml"
    spec_path.write_text(yaml.safe_dump(mixture_spec(world, kinds), sort_keys=False))
    manifest = build_mixture(MixtureSpec.load(spec_path), mix, stores=(store,), drop_missing=True)
    return {"totals": manifest["totals"], "answers": len(Mixture.open(mix).answers)}


def build_task_datasets(out: Path) -> dict:
    """`vlprep build-task` on the files of each transfer task of the world in ``out/world``
    into ``out/tasks/<task>`` (kept when built before): per task its row counts, validation
    split and metric."""
    from pipeline.task_data import task_manifest
    from vl_models import transfer
    from vl_models.transfer.build import build_task

    world = out / "world"
    tasks = {}
    for name, files in TRANSFER_FILES.items():
        task, folder = transfer.get(name), out / "tasks" / name
        manifest = task_manifest(folder) or build_task(
            task,
            [world / "annotations" / f for f in files],
            folder,
            image_map=world / "image_map.tsv",
            min_count=VQA_MIN_COUNT if name == "vqa" else None,
        )
        tasks[name] = {
            "train": manifest["splits"][task.train_split],
            "val_split": task.val_split,
            "val": manifest["splits"][task.val_split],
            "metric": task.metric[len(f"eval_{name}_") :],
            **({"answers": manifest["answers"]["count"]} if manifest["answers"] else {}),
        }
    return tasks
