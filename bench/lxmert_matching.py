"""Why does LXMERT's matching loss stay at ln 2 in `vlprep demo`? Variants side by side on one world.

Builds a shapes world as the demo does (`pipeline.synthetic.write_world`, features from the
committed tiny detector via `run_extract`, both of the demo's mixtures), then per variant a short
`vltrain pretrain`-equivalent run (`vl_models.train.trainer.run`) of lxmert-small, and scores it
as the demo's `_evaluate` does: held-out matching accuracy and zero-shot caption -> image R@1 /
R@10. Variants (``--variants``, comma separated):

* ``demo``: the demo's setting: every task on, captions + VG region descriptions + questions,
  matching at weight 3;
* ``demo_match_only``: as ``demo``, matching alone;
* ``demo_lr3e-4`` / ``demo_lr3e-4_match_only``: as ``demo`` / ``demo_match_only`` at a peak
  learning rate of 3e-4 (the demo's is 1e-3);
* ``demo_pair_captions`` / ``demo_lr3e-4_pair_captions`` / ``demo_lr6e-4_pair_captions``: as
  ``demo`` at 1e-3 / 3e-4 / 6e-4 with matching on the captions and region descriptions alone
  (``--pair-texts captions``); ``lr3e-4_pair_captions_match_only``: that at 3e-4, matching alone;
* ``demo_init0.1`` / ``demo_init0.1_lr5e-4_pair_captions``: as ``demo`` at initializer range
  0.1 / that at lr 5e-4 with ``--pair-texts captions``;
* ``demo_b64`` / ``demo_b128`` / ``demo_b256``: as ``demo`` in batches of 64 / 128 / 256 (the
  demo's are 32; LXMERT's own, 256); ``demo_b128_match_only`` / ``demo_b128_match10``: in
  batches of 128, matching alone / at weight 10;
* ``matching_first`` / ``matching_first_1e-3``: matching alone (captions and region
  descriptions) for the first half, then every task; initializer range 0.1; lr 3e-4 / 1e-3;
* ``no_regions``: as ``demo`` without the region descriptions (the demo's mixture before the
  world had them); every variant below is on this mixture or the captions-only one;
* ``match_only``: matching alone (every other task at weight 0), captions + questions;
* ``match_only_cap``: matching alone on the captions-only mixture;
* ``captions``: every task on, the captions-only mixture;
* ``init0.1``: as ``no_regions`` with initializer_range 0.1 (lxmert-small's JSON says 0.069);
* ``init0.1_cap``: as ``captions`` with initializer_range 0.1;
* ``lr3e-4`` / ``lr3e-3``: as ``no_regions`` with a lower / higher peak learning rate;
* ``warmup25``: as ``no_regions`` with a quarter of the steps as warm-up;
* ``x3`` / ``x3_match_only``: as ``no_regions`` / ``match_only`` with 3 cross-modality layers (lxmert-small
  has 1; the reference 5);
* ``dropout0_match_only``: as ``match_only`` without dropout;
* ``h128``: as ``no_regions`` at twice the width (hidden 128, intermediate 256).

It also counts how often a negative (mismatched) pair's text describes its image by chance,
drawing the negatives as `PretrainDataset._example` does (`mismatch`, then another row of a
different image): an exact text of the paired image, or all its colour + shape mentions among
the mentions in the paired image's own texts.

    python bench/lxmert_matching.py                # 400 images, 500 steps per variant
    python bench/lxmert_matching.py --quick        # 200 images, 150 steps per variant
    python bench/lxmert_matching.py --variants demo,match_only --steps 300
    python bench/lxmert_matching.py --separable 8 --steps 300   # can the model learn matching at all?
    python bench/lxmert_matching.py --plain presence --steps 1000 --lr 1e-3   # without the trainer's schedule
    python bench/lxmert_matching.py --plain mixture_captions --steps 800 --lr 1e-3 --batch 128 --masking none
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import time
from pathlib import Path

import numpy as np

MODEL = "lxmert-small"
RETRIEVAL_IMAGES, RETRIEVAL_CAPTIONS = 40, 5  # as the demo
OTHER_TASKS = ("mlm", "obj", "attr", "feat", "qa")


def variants(steps: int) -> dict:
    """name -> (mixture folder, TrainConfig overrides, model config overrides)."""
    off = {t: 0.0 for t in OTHER_TASKS}
    return {
        "demo": ("mixture_lxmert", {}, {}),
        "demo_match_only": ("mixture_lxmert", {"weights": {"matching": 3.0, **off}}, {}),
        "demo_lr3e-4": ("mixture_lxmert", {"lr": 3e-4}, {}),
        "demo_lr3e-4_match_only": ("mixture_lxmert", {"lr": 3e-4, "weights": {"matching": 3.0, **off}}, {}),
        "demo_pair_captions": ("mixture_lxmert", {"pair_texts": "captions"}, {}),
        "demo_lr3e-4_pair_captions": ("mixture_lxmert", {"lr": 3e-4, "pair_texts": "captions"}, {}),
        "lr3e-4_pair_captions_match_only": (
            "mixture_lxmert",
            {"lr": 3e-4, "pair_texts": "captions", "weights": {"matching": 3.0, **off}},
            {},
        ),
        "demo_lr6e-4_pair_captions": ("mixture_lxmert", {"lr": 6e-4, "pair_texts": "captions"}, {}),
        "matching_first": (
            "mixture_lxmert",
            {"lr": 3e-4, "pair_texts": "captions", "from_step": {t: steps // 2 for t in OTHER_TASKS}},
            {"initializer_range": 0.1},
        ),
        "matching_first_1e-3": (
            "mixture_lxmert",
            {"pair_texts": "captions", "from_step": {t: steps // 2 for t in OTHER_TASKS}},
            {"initializer_range": 0.1},
        ),
        "demo_init0.1": ("mixture_lxmert", {}, {"initializer_range": 0.1}),
        "demo_init0.1_lr5e-4_pair_captions": (
            "mixture_lxmert",
            {"lr": 5e-4, "pair_texts": "captions"},
            {"initializer_range": 0.1},
        ),
        "demo_b64": ("mixture_lxmert", {"batch_size": 64}, {}),
        "demo_b128": ("mixture_lxmert", {"batch_size": 128}, {}),
        "demo_b256": ("mixture_lxmert", {"batch_size": 256}, {}),
        "demo_b128_match_only": ("mixture_lxmert", {"batch_size": 128, "weights": {"matching": 3.0, **off}}, {}),
        "demo_b128_match10": ("mixture_lxmert", {"batch_size": 128, "weights": {"matching": 10.0}}, {}),
        "no_regions": ("mixture_captions_qa", {}, {}),
        "match_only": ("mixture_captions_qa", {"weights": {"matching": 3.0, **off}}, {}),
        "match_only_cap": ("mixture_captions", {"weights": {"matching": 3.0, **off}}, {}),
        "captions": ("mixture_captions", {}, {}),
        "init0.1": ("mixture_captions_qa", {}, {"initializer_range": 0.1}),
        "init0.1_cap": ("mixture_captions", {}, {"initializer_range": 0.1}),
        "lr3e-4": ("mixture_captions_qa", {"lr": 3e-4}, {}),
        "lr3e-3": ("mixture_captions_qa", {"lr": 3e-3}, {}),
        "warmup25": ("mixture_captions_qa", {"warmup": max(1, steps // 4)}, {}),
        "x3": ("mixture_captions_qa", {}, {"x_layers": 3}),
        "x3_match_only": ("mixture_captions_qa", {"weights": {"matching": 3.0, **off}}, {"x_layers": 3}),
        "dropout0_match_only": (
            "mixture_captions_qa",
            {"weights": {"matching": 3.0, **off}},
            {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
        ),
        "h128": ("mixture_captions_qa", {}, {"hidden_size": 128, "intermediate_size": 256}),
    }


def prepare(out: Path, n_images: int, seed: int) -> None:
    """World, features and both mixtures into `out`, as `vlprep demo` makes them (kept when there)."""
    from pipeline.synthetic import served, write_world
    from vl_models.demo import MIXTURE_KINDS, DemoConfig, extract_features, make_mixture

    out.mkdir(parents=True, exist_ok=True)
    world = out / "world"
    if not (world / "vg" / "region_descriptions.json").exists():  # absent, or older than the VG files
        write_world(world, n_images, seed)
    if not (out / "features").exists():
        with served(world):
            cfg = DemoConfig(out=out, n_images=n_images, seed=seed)
            print("extract:", extract_features(cfg, world, out / "features"))
    for name, kinds in {**MIXTURE_KINDS, "mixture_captions_qa": ("coco_captions", "vqa")}.items():
        if not (out / name).exists():
            print(name, make_mixture(world, out / "features", out / name, kinds))


def model_json(overrides: dict, folder: Path) -> str:
    """lxmert-small, or a temp JSON of it with `overrides`."""
    if not overrides:
        return MODEL
    from vl_models.families import CONFIG_DIR

    obj = json.loads((Path(CONFIG_DIR) / f"{MODEL}.json").read_text())
    obj.update(overrides)
    obj["name"] = MODEL + "-" + "-".join(f"{k}{v}" for k, v in overrides.items())
    path = folder / f"{obj['name']}.json"
    path.write_text(json.dumps(obj, indent=2))
    return str(path)


def train_config(out: Path, run: Path, mixture: str, model: str, steps: int, seed: int, **overrides):
    """The demo's `_train_config` for LXMERT, with this budget and `overrides`."""
    from vl_models.config import TrainConfig
    from vl_models.data.tokenize import bundled_bert_vocab

    settings = dict(
        model=model,
        stores=(str(out / "features"),),
        mixture=str(out / mixture),
        out=str(run),
        vocab=str(bundled_bert_vocab()),
        steps=steps,
        batch_size=32,
        lr=1e-3,
        warmup=max(1, steps // 20),
        checkpoint_every=steps,
        eval_every=steps,
        log_every=max(1, steps // 60),
        max_text=24,
        max_regions=20,
        seed=seed,
        overwrite=True,
        weights={"matching": 3.0},
    )
    settings.update(overrides)
    return TrainConfig.of(**settings)


def evaluate_run(tcfg, trained: bool, seed: int) -> dict:
    """The demo's `_evaluate` for one model: held-out matching accuracy, retrieval R@k."""
    import torch

    from pipeline.mixture import Mixture
    from vl_models import families
    from vl_models.eval.evaluate import evaluate
    from vl_models.train import checkpoint
    from vl_models.train.trainer import build_model, split_data

    mixture = Mixture.open(tcfg.mixture)
    family = families.get("lxmert")
    val = split_data(tcfg, mixture, family, "val")
    torch.manual_seed(seed)
    _, _, model = build_model(tcfg, len(mixture.answers))
    if trained:
        model.load_state_dict(checkpoint.load_latest(Path(tcfg.out))["model"])
    scores = evaluate(family, model, val, retrieval_images=RETRIEVAL_IMAGES, captions_per_image=RETRIEVAL_CAPTIONS)
    return {k[5:]: v for k, v in scores.items() if k.startswith("eval_")}


def train_variant(name: str, out: Path, steps: int, seed: int, tmp: Path) -> dict:
    from vl_models.train.trainer import run

    mixture, overrides, model_overrides = variants(steps)[name]
    run_dir = out / "runs" / f"{name}-{steps}"
    tcfg = train_config(out, run_dir, mixture, model_json(model_overrides, tmp), steps, seed, **overrides)
    logged: list[tuple[int, float, float]] = []
    prints = {max(1, round(steps * f)) for f in (0.1, 0.25, 0.5, 0.75, 1.0)}
    shown: set[int] = set()

    def on_step(step: int, m: dict, total: int) -> None:
        logged.append((step, m.get("loss_matching", math.nan), m.get("matching_acc", math.nan)))
        due = [p for p in prints if p <= step and p not in shown]
        if due:
            shown.update(due)
            parts = ", ".join(f"{k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("loss_"))
            print(f"  {name} step {step}/{total}: {parts}", flush=True)

    started = time.perf_counter()
    run(tcfg, on_step=on_step)
    seconds = time.perf_counter() - started
    tail = logged[-max(1, len(logged) // 10) :]  # the last tenth of the logged steps
    scores = evaluate_run(tcfg, True, seed)
    return {
        "variant": name,
        "seconds": round(seconds, 1),
        "loss_matching_last": logged[-1][1] if logged else math.nan,
        "loss_matching_tail": float(np.nanmean([r[1] for r in tail])) if tail else math.nan,
        "train_matching_acc_tail": float(np.nanmean([r[2] for r in tail])) if tail else math.nan,
        "matching_acc": scores.get("matching_acc", math.nan),
        "r1": scores.get("retrieval_R@1", math.nan),
        "r10": scores.get("retrieval_R@10", math.nan),
        "scores": scores,
    }


COLOR_SHAPE = None


def mentions(text: str) -> set[tuple[str, str]]:
    """(colour, shape) pairs named in `text` ("the striped red circle" -> (red, circle))."""
    global COLOR_SHAPE
    if COLOR_SHAPE is None:
        from pipeline.synthetic.scenes import COLORS, SHAPES, SIZES, TEXTURES

        mods = "|".join(SIZES + TEXTURES)
        COLOR_SHAPE = re.compile(
            rf"\b({'|'.join(COLORS)})\s+(?:(?:{mods})\s+)*({'|'.join(SHAPES)})s?\b",
        )
    return {(c, s) for c, s in COLOR_SHAPE.findall(text.lower())}


def negatives_by_chance(out: Path, mixture_name: str, seed: int, mismatch_prob: float = 0.5, epochs: int = 3) -> dict:
    """Negatives as `PretrainDataset._example` draws them (rng [seed, epoch, i]; `mismatch`;
    up to 10 tries for a row of another image) over the train split: how many exist and how
    many describe their paired image anyway."""
    from pipeline.mixture import Mixture
    from vl_models.data.masking import mismatch

    mix = Mixture.open(out / mixture_name)
    rows = mix.rows("train")
    images = mix.store_keys
    kinds = mix.kinds
    texts = {int(r): mix.text(int(r)) for r in rows}
    own_texts: dict[str, set[str]] = {}
    own_mentions: dict[str, set] = {}
    for r in rows:
        key = images[r]
        own_texts.setdefault(key, set()).add(texts[int(r)].strip().lower())
        own_mentions.setdefault(key, set()).update(mentions(texts[int(r)]))
    counts = {"items": 0, "negatives": 0, "neg_question": 0, "exact": 0, "mentions_all_in_image": 0, "no_mention": 0}
    for epoch in range(epochs):
        for i in range(len(rows)):
            rng = np.random.default_rng([seed, epoch, i])
            row = int(rows[i])
            image = images[row]
            counts["items"] += 1
            if not mismatch(rng, mismatch_prob):
                continue
            for _ in range(10):
                other = int(rows[rng.integers(len(rows))])
                if images[other] != image:
                    break
            else:
                continue
            counts["negatives"] += 1
            text = texts[other]
            counts["neg_question"] += kinds[other] == "question"
            counts["exact"] += text.strip().lower() in own_texts[image]
            named = mentions(text)
            if not named:
                counts["no_mention"] += 1
            elif named <= own_mentions[image]:
                counts["mentions_all_in_image"] += 1
    n = max(1, counts["negatives"])
    counts["share_negatives_of_items"] = counts["negatives"] / max(1, counts["items"])
    for k in ("neg_question", "exact", "mentions_all_in_image", "no_mention"):
        counts[f"share_{k}"] = counts[k] / n
    return counts


def bare_model(out: Path, model_name: str):
    """(the world's store, the model's family, a fresh model of `model_name` fitted to the store
    with dense embedding gradients for a plain AdamW) for the hand-written loops below."""
    import torch

    from pipeline.store import FeatureStore
    from vl_models import families

    store = FeatureStore.open(out / "features", dtype="float32")
    family = families.of_config(families.load_config(model_name))
    model = family.build(family.fit(families.load_config(model_name), store.layout, 16, str(out / "features")))
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.sparse = False
    return store, family, model


def separable(out: Path, images: int, steps: int, seed: int, real: bool) -> list[tuple[int, float, float]]:
    """Matching alone on a pairing the model can only solve from the image: text ``[CLS] wK
    [SEP]`` names image K of `images`, half the pairs mismatched. The images are the store's
    first `images` records (`real`: the world's own features, boxes and masks, 10 slots) or
    random prototypes with noise. Returns (step, loss, accuracy) every 50 steps: whether the
    model and its loss learn matching at all, and how long they sit on the plateau."""
    import torch
    import torch.nn.functional as F

    from pipeline.store.buffer import pad_regions

    torch.manual_seed(seed)
    store, family, model = bare_model(out, MODEL)
    slots, batch, length = 10, 32, 8
    regions = pad_regions([store.get(k) for k in list(store.ids())[:images]], slots, position=family.position)
    feats, pos = torch.tensor(regions.features), torch.tensor(regions.positions)
    mask = torch.tensor(regions.mask).long()
    if not real:
        feats = torch.randn_like(feats)
        pos, mask = torch.rand_like(pos), torch.ones_like(mask)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    log = []
    for step in range(steps + 1):
        img, matched = torch.randint(0, images, (batch,)), torch.randint(0, 2, (batch,))
        said = torch.where(matched.bool(), img, (img + torch.randint(1, images, (batch,))) % images)
        ids = torch.zeros(batch, length, dtype=torch.long)
        ids[:, 0], ids[:, 1], ids[:, 2] = 101, 2000 + said, 102
        text_mask = (ids != 0).long()
        noise = 0.0 if real else 0.1 * torch.randn(batch, slots, feats.shape[-1])
        none = torch.zeros(batch, slots, dtype=torch.bool)
        logits = model(
            ids, feats[img] + noise, pos[img], text_mask, mask[img], lm_positions=ids == -1, feat_positions=none
        ).matched_logits
        loss = F.cross_entropy(logits, matched)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            log.append((step, round(loss.item(), 3), (logits.argmax(-1) == matched).float().mean().item()))
    return log


def object_phrase() -> re.Pattern:
    """The world's one-object region descriptions (`pipeline.synthetic.regions`)."""
    from pipeline.synthetic.scenes import COLORS, SHAPES, SIZES, TEXTURES

    color, shape, mods = "|".join(COLORS), "|".join(SHAPES), "|".join(SIZES + TEXTURES)
    return re.compile(
        rf"(?:an? )?(?:(?:{mods}) )*(?:{color}) (?:{shape})(?: in the picture)?|the (?:{shape}) is (?:{color})"
    )


def plain_loop(
    out: Path,
    steps: int,
    seed: int,
    lr: float,
    texts: str,
    model_name: str = MODEL,
    batch: int = 32,
    masking: str = "both",
) -> list[tuple[int, float, float]]:
    """Matching alone in a plain loop (AdamW at a constant `lr`, no warm-up, decay or clipping;
    batches of `batch` drawn with replacement), to tell the task from the trainer's schedule:

    * ``presence``: the text is "<colour> <shape>" of an object of the image (matched) or a
      colour + shape the image does not have (mismatched), over the world's train scenes;
    * ``mixture`` / ``mixture_captions``: the pretraining examples of the demo's LXMERT mixture
      (`PretrainDataset`: masked text and regions, negatives as the trainer draws them, drawn
      afresh for every batch), every text or captions and region descriptions alone. (With the
      same negative for an item at every draw, the model memorizes the fixed pairs instead.)
      ``object_phrases``: the region descriptions that name one object. `masking`: which of
      the pretraining masks are on (both, words, regions or none).

    Returns (step, mean loss, mean accuracy) over each 100 steps."""
    import torch
    import torch.nn.functional as F

    from pipeline.mixture import Mixture
    from pipeline.store.buffer import pad_regions
    from pipeline.synthetic.scenes import COLORS, SHAPES
    from pipeline.synthetic.world import load_scenes
    from vl_models.data.tokenize import WordPiece, bundled_bert_vocab
    from vl_models.train.trainer import split_data

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    store, family, model = bare_model(out, model_name)
    slots = 20
    if texts == "presence":
        scenes = list(load_scenes(out / "world", "train").values())
        records = [store.get(f"cc3m-train-{i:08d}") for i in range(len(scenes))]
        regions = pad_regions(records, slots, position=family.position, img_token=family.img_token)
        feats, pos = torch.tensor(regions.features), torch.tensor(regions.positions)
        vmask = torch.tensor(regions.mask).long()
        names = sorted(f"{c} {s}" for c in COLORS for s in SHAPES)
        present = [sorted({f"{o.color} {o.shape}" for o in scene.objects}) for scene in scenes]
        tokenizer = WordPiece(bundled_bert_vocab())

        def draw():
            img = rng.integers(0, len(scenes), batch)
            matched = rng.integers(0, 2, batch)
            said = [
                str(rng.choice(present[i])) if m else str(rng.choice([n for n in names if n not in present[i]]))
                for i, m in zip(img, matched)
            ]
            enc = [tokenizer.encode(t, 8) for t in said]
            ids = torch.tensor(np.stack([e.ids for e in enc]))
            tmask = torch.tensor(np.stack([e.mask for e in enc]))
            return ids, feats[img], pos[img], tmask, vmask[img], torch.tensor(matched)
    else:
        off = {"mlm_prob": 0.0} if masking in ("regions", "none") else {}
        off |= {"region_prob": 0.0} if masking in ("words", "none") else {}
        tcfg = train_config(out, out / "runs" / "plain", "mixture_lxmert", MODEL, steps, seed, **off)
        data = split_data(tcfg, Mixture.open(tcfg.mixture), family, "train")
        kinds, text = data.mixture.kinds, data.mixture.text
        if texts == "mixture_captions":
            data.rows = data.rows[kinds[data.rows] == "caption"]
        elif texts == "object_phrases":  # the region descriptions that name one object
            pattern = object_phrase()
            data.rows = np.array([r for r in data.rows if pattern.fullmatch(text(int(r)))])

        def draw():
            data.set_epoch(int(rng.integers(1 << 30)))  # fresh masks and negatives, as epochs give the trainer
            ex = data.collate(data.__getitems__([int(i) for i in rng.integers(0, len(data), batch)]))
            return (
                ex["input_ids"],
                ex["visual_feats"],
                ex["visual_pos"],
                ex["attention_mask"],
                ex["visual_mask"],
                ex["matched"],
            )

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    log, window = [], []
    for step in range(1, steps + 1):
        ids, vf, vp, tm, vm, matched = draw()
        none = torch.zeros(vm.shape, dtype=torch.bool)
        out_ = model(
            ids,
            vf,
            vp,
            tm,
            vm,
            lm_positions=torch.zeros(ids.shape, dtype=torch.bool),
            **{family.region_positions: none},
        )
        logits = getattr(out_, family.pair_output)
        target = matched if family.pair_positive == 1 else 1 - matched
        loss = F.cross_entropy(logits, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        window.append((loss.item(), (logits.argmax(-1) == target).float().mean().item()))
        if step % 100 == 0:
            mean = np.mean(window, axis=0)
            log.append((step, round(float(mean[0]), 3), round(float(mean[1]), 2)))
            window = []
    return log


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "lxmert_matching")
    p.add_argument("--quick", action="store_true", help="200 images, 150 steps per variant")
    p.add_argument("--n-images", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--variants", default="demo,demo_match_only,no_regions,match_only,captions,match_only_cap")
    p.add_argument("--separable", type=int, default=0, help="only the separable pairing, over this many images")
    p.add_argument(
        "--plain",
        default="",
        help="only matching alone in a plain loop (constant lr, no schedule): presence, mixture, mixture_captions "
        "or object_phrases",
    )
    p.add_argument("--lr", type=float, default=3e-4, help="--plain's learning rate")
    p.add_argument("--batch", type=int, default=32, help="--plain's batch size")
    p.add_argument(
        "--masking",
        choices=("both", "words", "regions", "none"),
        default="both",
        help="--plain on the mixture: which pretraining masks are on",
    )
    p.add_argument("--model", default=MODEL, help="--plain's model config")
    a = p.parse_args()
    n_images = a.n_images or (200 if a.quick else 400)
    steps = a.steps or (150 if a.quick else 500)
    names = [v for v in a.variants.split(",") if v]
    unknown = set(names) - set(variants(steps))
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; known: {', '.join(variants(steps))}")
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    out = a.out / f"w{n_images}-s{a.seed}"
    print(f"world: {n_images} images, {steps} steps per variant, into {out}", flush=True)
    prepare(out, n_images, a.seed)
    if a.plain:
        print(f"\nmatching alone, plain loop, {a.plain} texts, {a.model}, lr {a.lr:g}, batches of {a.batch}:")
        for step, loss, acc in plain_loop(out, steps, a.seed, a.lr, a.plain, a.model, a.batch, a.masking):
            print(f"  step {step:4d}: matching loss {loss:.3f}, accuracy {acc:.2f}", flush=True)
        return
    if a.separable:
        for real in (False, True):
            print(f"\nseparable pairing over {a.separable} images, {'the world' if real else 'random'}'s features:")
            for step, loss, acc in separable(out, a.separable, steps, a.seed, real):
                print(f"  step {step:4d}: matching loss {loss:.3f}, accuracy {acc:.2f}", flush=True)
        return

    print("\nnegatives drawn as the LXMERT data path draws them (train split, 3 epochs):")
    for mixture in ("mixture_lxmert", "mixture_captions_qa", "mixture_captions"):
        c = negatives_by_chance(out, mixture, a.seed)
        print(
            f"  {mixture}: {c['negatives']} negatives of {c['items']} items ({c['share_negatives_of_items']:.1%});"
            f" text a question {c['share_neg_question']:.1%}; exact text of the paired image {c['share_exact']:.1%};"
            f" every colour+shape it names is named in the paired image's texts {c['share_mentions_all_in_image']:.1%};"
            f" names no colour+shape {c['share_no_mention']:.1%}",
            flush=True,
        )

    with tempfile.TemporaryDirectory() as tmp:
        base = train_config(out, out / "runs" / "untrained", "mixture_captions_qa", MODEL, steps, a.seed)
        untrained = evaluate_run(base, False, a.seed)
        rows = [
            {
                "variant": "untrained",
                "seconds": 0.0,
                "loss_matching_last": math.nan,
                "loss_matching_tail": math.nan,
                "train_matching_acc_tail": math.nan,
                "matching_acc": untrained.get("matching_acc", math.nan),
                "r1": untrained.get("retrieval_R@1", math.nan),
                "r10": untrained.get("retrieval_R@10", math.nan),
                "scores": untrained,
            }
        ]
        print(f"\nuntrained: {json.dumps({k: round(v, 4) for k, v in untrained.items()})}", flush=True)
        for name in names:
            print(f"\n== {name}", flush=True)
            rows.append(train_variant(name, out, steps, a.seed, Path(tmp)))
            print(f"  eval: {json.dumps({k: round(v, 4) for k, v in rows[-1]['scores'].items()})}", flush=True)

    print(f"\n{n_images} images, {steps} steps, seed {a.seed}; loss: last logged / mean of the last tenth")
    header = (
        f"{'variant':<16} {'loss_match last':>15} {'tail':>6} {'train acc':>9} {'val acc':>8}"
        f" {'R@1':>6} {'R@10':>6} {'s':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['variant']:<16} {r['loss_matching_last']:>15.3f} {r['loss_matching_tail']:>6.3f}"
            f" {r['train_matching_acc_tail']:>9.3f} {r['matching_acc']:>8.3f} {r['r1']:>6.3f} {r['r10']:>6.3f}"
            f" {r['seconds']:>6.0f}"
        )
    (out / "lxmert_matching.json").write_text(json.dumps(rows, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
