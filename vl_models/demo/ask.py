"""The demo's last step: its fine-tuned models asked about a held-out scene, as a user tries
`vltrain predict` after the demo (the answers, ``predict.png`` and the command line to try)."""

from __future__ import annotations

from pathlib import Path

from vl_models.demo.config import MODELS, DemoConfig

PREDICT_TASKS = ("vqa", "refcoco+")  # what the demo asks its fine-tuned models about a held-out scene


def ask_models(cfg: DemoConfig, out: Path) -> dict:
    """`vltrain predict` as a user tries it after the demo: each family's fine-tuned (from
    pretraining) VQA and RefCOCO+ models asked about one held-out scene, from its JPEG — a
    question and a referring expression the world has for it, with their true answer and box —
    and the answers drawn into ``predict.png``."""
    from collections import Counter

    import numpy as np

    from pipeline.detect.show import side_by_side
    from pipeline.task_data import TaskData
    from vl_models.eval.metrics import box_iou_pairs
    from vl_models.predict import load_predictor, picture

    refs = TaskData.open(out / "tasks" / "refcoco+")
    ref = int(refs.rows("val")[0])
    key = refs.images(ref)[0]  # cc3m-val-NNNNNNNN: the held-out scene images/shapes_val_NNNNNNNN.jpg
    scene = out / "world" / "images" / f"shapes_val_{key.rsplit('-', 1)[1]}.jpg"
    vqa = TaskData.open(out / "tasks" / "vqa")
    question = next(int(r) for r in vqa.rows("val") if vqa.images(int(r))[0] == key)
    queries = {
        "vqa": {"image": str(scene), "question": vqa.column("text")[question]},
        "refcoco+": {"image": str(scene), "expression": refs.column("text")[ref]},
    }
    truth_box = np.asarray(refs.column("box")[ref], np.float64)
    asked, tiles = {}, []
    for kind in cfg.models:
        asked[kind] = {}
        for task in PREDICT_TASKS:
            run = out / "transfer" / kind / f"{task}-pretrained-seed{cfg.seed}"
            predictor = load_predictor(run, step="best")
            result = predictor.ask([queries[task]])[0]
            if task == "vqa":
                truth = Counter(vqa.column("answers")[question]).most_common(1)[0][0]  # the annotators' choice
                asked[kind][task] = {"answer": result["answer"], "score": round(result["score"], 3), "truth": truth}
            else:
                iou = float(box_iou_pairs(np.asarray([result["box"]]), truth_box[None])[0])
                asked[kind][task] = {"box": [round(v, 1) for v in result["box"]], "iou": round(iou, 3)}
            tiles.append(picture(predictor, queries[task], result, f"{MODELS[kind]}, fine-tuned on {task}"))
    side_by_side(tiles, gap=8).save(out / "predict.png")
    command = (
        f"vltrain predict --checkpoint {out / 'transfer' / cfg.models[-1] / f'vqa-pretrained-seed{cfg.seed}'} "
        f'--step best --image {scene} --question "{queries["vqa"]["question"]}"'
    )
    return {
        "scene": str(scene.relative_to(out)),
        "question": queries["vqa"]["question"],
        "expression": queries["refcoco+"]["expression"],
        "truth_box": [float(v) for v in truth_box],
        "answers": asked,
        "picture": "predict.png",
        "command": command,
    }
