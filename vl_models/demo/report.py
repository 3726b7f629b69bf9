"""What the demo shows of its run: the pictures (detections, training curves) and ``report.md``
from the report: the stages' seconds, zero-shot retrieval and QA, the transfer table, the
answers of the fine-tuned models."""

from __future__ import annotations

from pathlib import Path

from vl_models.demo.config import MODELS


def pictures(world: Path, out: Path, models: tuple[str, ...]) -> dict:
    """``scenes.png`` (four held-out scenes' detections, as `vlprep show` draws them) and each
    family's training curves; their paths relative to `out`, by name."""
    from pipeline.detect.show import render, side_by_side
    from pipeline.store import FeatureStore
    from pipeline.synthetic import attribute_names, object_names
    from vl_models.train.plot import plot_run

    store = FeatureStore.open(out / "features")
    tiles = []
    for i in range(4):
        rec = store.get(f"cc3m-val-{i:08d}")
        image = (world / "images" / f"shapes_val_{i:08d}.jpg").read_bytes()
        tiles.append(
            render(rec, image, max_regions=6, min_conf=0.3, objects=object_names(), attributes=attribute_names())
        )
    side_by_side(tiles).save(out / "scenes.png")
    curves = {kind: str(plot_run(out / "runs" / kind, out / f"{kind}_curves.png").relative_to(out)) for kind in models}
    return {"scenes": "scenes.png", **{f"{k}_curves": v for k, v in curves.items()}}


def markdown(report: dict) -> str:
    """``report.md``: the report as Markdown (stages and seconds, extraction, zero-shot
    retrieval and QA, the transfer table and the predictions when they ran, the pictures)."""
    cfg, ev = report["config"], report["evaluation"]
    n = next(iter(ev.values()))["retrieval_images"]
    lines = [
        f"# vlprep demo ({'quick' if cfg['quick'] else 'full'}): the shapes world end to end",
        "",
        f"{cfg['n_images']} scenes, {cfg['steps']} pretraining steps per model, seed {cfg['seed']}; "
        f"{report['total_seconds']:.0f} s in all.",
        "",
        "| stage | seconds |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {s['seconds']:.1f} |" for name, s in report["stages"].items()]
    if report.get("models"):
        lines += [
            "",
            "Seconds per model family: "
            + "; ".join(
                f"{MODELS[kind]} " + ", ".join(f"{part} {s:.1f}" for part, s in parts.items())
                for kind, parts in report["models"].items()
            )
            + (f" ({cfg['jobs_used']} side by side)." if cfg.get("jobs_used", 1) > 1 else "."),
        ]
    ext = report["extract"]
    lines += [
        "",
        f"Extraction: {ext['extracted']} of {ext['images']} images (failures: {ext['failures'] or 'none'}); "
        "mixtures: " + "; ".join(f"{name} {m['totals']}" for name, m in report["mixtures"].items()) + ".",
        "",
        f"Zero-shot caption -> image retrieval over {n} held-out scenes, queried with "
        f"{next(iter(ev.values()))['pretrained'].get('retrieval_queries', n)} of their captions "
        f"(chance R@1 = {1 / n:.3f}):",
        "",
        "| model | R@1 | R@5 | R@10 | QA score |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, rows in ev.items():
        for name in ("untrained", "pretrained"):
            m = rows[name]
            qa = f"{m['qa_score']:.3f}" if "qa_score" in m else "–"
            lines.append(
                f"| {MODELS[kind]}, {name} | {m.get('retrieval_R@1', 0):.3f} | {m.get('retrieval_R@5', 0):.3f} "
                f"| {m.get('retrieval_R@10', 0):.3f} | {qa} |"
            )
    if "transfer" in report:
        lines += [""] + transfer_table(report["transfer"])
    if "predict" in report:
        lines += [""] + predict_lines(report["predict"])
    lines += ["", "![detections](scenes.png)", ""] + [
        f"![{k}]({v})" for k, v in report["pictures"].items() if k not in ("scenes", "predict")
    ]
    return "\n".join(lines) + "\n"


def predict_lines(p: dict) -> list[str]:
    """The demo's last step as Markdown lines: what the fine-tuned models said about a held-out scene."""
    lines = [
        f"Asked about the held-out scene `{p['scene']}` (`vltrain predict`, from the JPEG): "
        f'"{p["question"]}" (truth: {next(iter(p["answers"].values()))["vqa"]["truth"]}) and '
        f'"{p["expression"]}":',
        "",
        "| model (fine-tuned from pretraining) | VQA answer (score) | grounded box (IoU with the truth) |",
        "|---|---|---|",
    ]
    for kind, a in p["answers"].items():
        lines.append(
            f"| {MODELS[kind]} | {a['vqa']['answer']} ({a['vqa']['score']:.2f}) | "
            f"{', '.join(f'{v:.0f}' for v in a['refcoco+']['box'])} ({a['refcoco+']['iou']:.2f}) |"
        )
    return lines + ["", f"![predictions]({p['picture']})", "", "Try it yourself:", "", f"    {p['command']}"]


def transfer_table(t: dict) -> list[str]:
    """The transfer stage as Markdown lines: task x (family, scratch | pretrained), the mean
    best validation score over the seeds (each seed's in brackets when there are several)."""
    seeds = t["seeds"]
    lines = [
        f"Transfer: fine-tuning from the pretraining runs vs from scratch (the same model config and vocab; "
        f"{t['steps']} steps of {t['batch_size']}, lr {t['lr']:g}, seed{'s' if len(seeds) > 1 else ''} "
        f"{', '.join(map(str, seeds))}); the best validation score, official metric:",
        "",
        "| task (train / val rows, metric) | "
        + " | ".join(f"{MODELS[k]} {init}" for k in t["scores"] for init in ("scratch", "pretrained"))
        + " |",
        "|---|" + "---:|" * 2 * len(t["scores"]),
    ]
    for name, info in t["tasks"].items():
        cells = []
        for kind in t["scores"]:
            for init in ("scratch", "pretrained"):
                values = t["scores"][kind][name][init]
                each = f" ({', '.join(f'{v:.1f}' for v in values)})" if len(values) > 1 else ""
                cells.append(f"{_mean(values):.1f}{each}")
        lines.append(
            f"| {name} ({info['train']} / {info['val']} {info['val_split']}, {info['metric']}) | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def transfer_line(kind: str, scores: dict) -> str:
    """A family's fine-tuning scores as one progress line: per task, scratch -> pretrained (the mean over the seeds)."""
    return f"      {MODELS[kind]}: " + "; ".join(
        f"{t} {_mean(r['scratch']):.1f} -> {_mean(r['pretrained']):.1f}" for t, r in scores.items()
    )


def _mean(values: list) -> float:
    return sum(values) / len(values)
