"""Image-text retrieval on the Karpathy splits: Flickr30k (``dataset_flickr30k.json``: 1,000
test images x 5 captions) and COCO (``dataset_coco.json``: 5,000 test images), one row per
caption. Training is on ``train``, validation (and so ``checkpoints/best``) on ``val``;
``test`` is for the final numbers only.

Training is 4-way, as vilbert-multi-task's ``RetreivalDataset.__getitem__``: the caption
with its image, then three negatives — a caption of another image with this image, this
caption with another image, and one more caption of another image with this image — with
cross-entropy over the four candidates' scores. The scorer (``vltrain finetune
--retrieval-head``, by default the model family's): ``new``, 12-in-1's ``vil_logit`` (a new
``Linear(H, 1)`` on the pooled pair vector, `heads.ChoiceHead`, a ``vil_*`` head at --head-lr;
ViLBERT's), or ``pretraining``, the pretraining pair head's logit (`heads.RetrievalHead`, no new
parameters; LXMERT's). ``--zero-shot`` evaluation always scores with the pair head. Another image is
drawn uniformly among the split's other images, then one of its captions uniformly. The
fourth candidate's image is random too, unless the task carries 12-in-1's hard-negative pool
(`with_hard_negatives`, ``vltrain finetune --hard-negatives hard_negative.pkl``): then, in
training, it is drawn uniformly from positions 1.. of the image's pool row (position 0 is
left out, as 12-in-1 does).

Evaluation scores every caption against every image of the split (`evaluate.score_pairs`)
and reports R@1/5/10 both ways and the median / mean rank (`metrics.retrieval_metrics`).

COCO's test split is Karpathy's 5,000 images (the "5K test"). The literature also reports a
1K test, which COCO's task adds as named splits (`Retrieval.named_splits`): ``test1k_0`` ..
``test1k_4``, the test images in file order cut into consecutive folds of 1,000 (each with all
its captions), as VSE++ and SCAN cut theirs (``evalrank(fold5=True)``), and ``test1k`` = the
first fold: the one 1K set vilbert-multi-task scores (``eval_retrieval.py`` over its
``all_data_final_test_set0_2014.jsonline``, 1,000 images x 5,000 captions, which is also its
TASK7 validation file). Scoring a split that holds all five folds whole (``test``) reports,
besides its own metrics, each metric averaged over the five folds as ``1k5fold_<metric>``
(each fold's captions against that fold's images: a sub-matrix of the 5K scores, as a pair's
score depends on the pair alone). Flickr30k's test is 1,000 images already.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.io import atomic_write_json
from pipeline.safe_pickle import safe_loads
from pipeline.sources.base import Malformed, Skip
from pipeline.sources.image_ids import image_number
from pipeline.sources.karpathy import read_karpathy
from vl_models.eval.metrics import retrieval_metrics
from vl_models.transfer.task import Row, Task, column

POOL_KEYS = ("train_image_list", "train_hard_pool")  # 12-in-1's hard_negative.pkl: what it reads of the dict
FOLD_IMAGES = 1000  # the 1K test: folds of 1,000 test images
FOLD_PREFIX, MEAN_PREFIX = "test1k", "1k5fold_"


@dataclass(frozen=True)
class HardNegatives:
    """12-in-1's hard-negative pool (``hard_negative.pkl``: a dict whose ``train_image_list``
    lists the training images by id and whose ``train_hard_pool`` row i holds, for image i,
    indices into that list, the most similar first): `images` (`image_number`s) and `pool`
    (images x K)."""

    path: str
    images: tuple
    pool: np.ndarray

    @classmethod
    def read(cls, path: Path) -> "HardNegatives":
        """Read a pool through the restricted unpickler (numpy arrays and plain values only);
        ConfigError naming the file when it is not such a pool."""
        path = Path(path)
        try:
            data = safe_loads(path.read_bytes(), encoding="latin1")
        except OSError as err:
            raise ConfigError(f"--hard-negatives {path}: cannot read it: {err}") from err
        except UnsafePickleError as err:
            raise UnsafePickleError(f"--hard-negatives {path}: {err}") from err
        if not isinstance(data, dict) or any(k not in data for k in POOL_KEYS):
            found = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
            raise ConfigError(
                f"--hard-negatives {path}: not 12-in-1's hard_negative.pkl (a dict with {' and '.join(POOL_KEYS)}; "
                f"found {found})"
            )
        try:
            images = tuple(image_number(i.item() if isinstance(i, np.generic) else i) for i in data["train_image_list"])
            pool = np.asarray(data["train_hard_pool"]).astype(np.int64)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"--hard-negatives {path}: no list of images and integer pool matrix: {err}") from err
        if (
            not images
            or pool.ndim != 2
            or len(pool) != len(images)
            or pool.shape[1] < 2
            or pool.min() < 0
            or pool.max() >= len(images)
        ):
            raise ConfigError(
                f"--hard-negatives {path}: train_hard_pool {pool.shape} must have a row of at least 2 indices into "
                f"train_image_list ({len(images)} images) for each of its images"
            )
        return cls(str(path), images, pool)


@dataclass(frozen=True)
class _SplitIndex:
    """A view's rows by image: `images` (names, first-seen order), `image_of` (view position ->
    image index), `captions` (image index -> its view positions), `hard` (image index -> pool
    row as image indices of this split; None without a pool)."""

    images: list
    image_of: np.ndarray
    captions: list
    hard: Optional[np.ndarray]


class Retrieval(Task):
    head = "retrieval"
    candidates = 4
    pairwise = True  # evaluation scores all caption x image pairs of a split
    max_text = 30  # ViLBERT-MT's
    hard_negatives: Optional[HardNegatives] = None

    def __init__(self, name: str, file: str, test_images_file: str, folds: int = 0):
        self.name, self.files, self.metric = (name, f"{file} (Karpathy's split file)", f"eval_{name}_text_to_image_R@1")
        self.test_images_file = test_images_file  # 12-in-1's clean_datasets list (cache/ beside its data)
        self.folds = folds  # 1K folds of the test split (COCO: 5); 0: none
        self.fold_images = FOLD_IMAGES  # images per fold

    def fold_names(self) -> list[str]:
        """The named splits of the 1K test folds (``test1k_0`` ..)."""
        return [f"{FOLD_PREFIX}_{k}" for k in range(self.folds)]

    def named_splits(self, rows):
        """COCO's 1K test: the test images in file order, consecutive folds of `fold_images`
        (as many whole folds as the test holds, at most `folds`) with all their captions:
        ``test1k_0`` .. and ``test1k`` (= ``test1k_0``, vilbert-multi-task's 1K set)."""
        if not self.folds:
            return {}
        fold_of = {}
        for row in rows:
            if row.split == "test" and row.group not in fold_of:
                fold_of[row.group] = len(fold_of) // self.fold_images
        whole = min(self.folds, len(fold_of) // self.fold_images)
        splits: dict[str, list[int]] = {name: [] for name in self.fold_names()[:whole]}
        for i, row in enumerate(rows):
            if row.split == "test" and fold_of[row.group] < whole:
                splits[f"{FOLD_PREFIX}_{fold_of[row.group]}"].append(i)
        if whole:
            splits[FOLD_PREFIX] = list(splits[f"{FOLD_PREFIX}_0"])
        return splits

    def with_hard_negatives(self, pool: HardNegatives) -> "Retrieval":
        """This task drawing its training examples' fourth candidate from `pool`."""
        task = copy.copy(self)
        task.hard_negatives = pool
        return task

    def read(self, files):
        for path in map(Path, files):
            for image in read_karpathy(path):
                if isinstance(image, (Skip, Malformed)):
                    yield image
                    continue
                for sid, caption in zip(image.sentence_ids, image.captions):
                    yield Row(uid=str(sid), split=image.split, images=(image.image,), text=caption, group=image.image)

    def _index(self, view) -> _SplitIndex:
        """The view's `_SplitIndex` (built once per view)."""
        return view.memo("retrieval_index", lambda: self._build_index(view))

    def _build_index(self, view) -> _SplitIndex:
        groups = [view.value("group", i) for i in range(len(view.rows))]
        position = {g: k for k, g in enumerate(dict.fromkeys(groups))}
        image_of = np.array([position[g] for g in groups], np.int64)
        captions = [[] for _ in position]
        for i, k in enumerate(image_of):
            captions[k].append(i)
        if len(position) < 2:
            raise ConfigError(f"{view.data.path}: retrieval training needs at least 2 images in split {view.split!r}")
        hard = self._hard_rows(view, list(position)) if self.hard_negatives is not None and view.train else None
        return _SplitIndex(list(position), image_of, [np.array(c) for c in captions], hard)

    def _hard_rows(self, view, images: list) -> np.ndarray:
        """Each image's pool row, as image indices of this split; ConfigError when an image
        has no pool row or its row names images the split lacks."""
        pool = self.hard_negatives
        ours = {image_number(name): k for k, name in enumerate(images)}
        row_of = {number: r for r, number in enumerate(pool.images)}
        missing = [name for name in images if image_number(name) not in row_of]
        to_ours = np.array([ours.get(number, -1) for number in pool.images], np.int64)
        rows = to_ours[pool.pool[[row_of.get(image_number(name), 0) for name in images]]]
        absent = int((rows[:, 1:] < 0).any(axis=1).sum())
        if missing or absent:
            raise ConfigError(
                f"--hard-negatives {pool.path} does not fit split {view.split!r} of {view.data.path}: "
                f"{len(missing)} of its {len(images)} images have no pool row (e.g. {missing[:3]}), {absent} pool "
                "rows name images the split lacks (12-in-1's pool is of its training images)"
            )
        return rows

    def _other(self, index: _SplitIndex, own: int, rng: np.random.Generator) -> int:
        """An image of the split other than image `own`, uniformly."""
        k = int(rng.integers(len(index.images) - 1))
        return k + (k >= own)

    def _caption(self, index: _SplitIndex, image: int, rng: np.random.Generator) -> int:
        """One of `image`'s captions (a view position), uniformly."""
        return int(rng.choice(index.captions[image]))

    def example(self, view, i, rng):
        index = self._index(view)
        own = int(index.image_of[i])
        image = view.image(view.value("images", i)[0])
        text = view.text(view.value("text", i))
        a = self._caption(index, self._other(index, own, rng), rng)
        b = index.captions[self._other(index, own, rng)][0]
        if index.hard is not None:
            hard = int(index.hard[own, rng.integers(1, index.hard.shape[1])])
        else:
            hard = self._other(index, own, rng)
        c = self._caption(index, hard, rng)
        pairs = [
            (text, image),
            (view.text(view.value("text", a)), image),
            (text, view.image(view.value("images", b)[0])),
            (view.text(view.value("text", c)), image),
        ]
        return {**view.candidates(pairs), "label": np.int64(0)}

    def score(self, data, predictions):
        """R@K (in %, as the papers) and ranks of the scored split; for a split that holds the
        five 1K folds whole, also each averaged over them (``1k5fold_``: VSE++'s "mean metrics")."""
        scores, image_of_caption = predictions.values["scores"], predictions.values["image_of_caption"]
        metrics = _percent(retrieval_metrics(scores, image_of_caption))
        folds = self._fold_metrics(data, predictions.rows, scores, np.asarray(image_of_caption))
        if folds:
            metrics.update({f"{MEAN_PREFIX}{k}": float(np.mean([f[k] for f in folds])) for k in folds[0]})
        return metrics

    def _fold_metrics(self, data, rows: np.ndarray, scores: np.ndarray, image_of_caption: np.ndarray) -> list[dict]:
        """Each 1K fold's metrics (its captions against its images), when every caption of
        every fold is among the scored `rows`; [] otherwise."""
        names = self.fold_names()
        counts = data.manifest.get("splits", {})
        if not names or any(not counts.get(n) for n in names):
            return []
        splits = column(data, "splits", rows)
        out = []
        for name in names:
            mine = np.array([p for p, s in enumerate(splits) if name in s], np.int64)
            if len(mine) != counts[name]:
                return []
            images, own = np.unique(image_of_caption[mine], return_inverse=True)
            out.append(_percent(retrieval_metrics(scores[np.ix_(mine, images)], own)))
        return out

    def write_submission(self, data, predictions, folder):
        """Each caption's ten best images, best first (no official format: ours, JSON)."""
        images = predictions.values["images"]
        top = np.argsort(-predictions.values["scores"], axis=1, kind="stable")[:, :10]
        rows = [
            {"caption_id": uid, "images": [images[j] for j in best]}
            for uid, best in zip(column(data, "uid", predictions.rows), top)
        ]
        path = Path(folder) / f"{self.name}_rankings.json"
        atomic_write_json(path, rows)
        return path


def _percent(metrics: dict) -> dict:
    """Recalls in %, as the papers report them."""
    return {k: 100 * v if "_R@" in k else v for k, v in metrics.items()}


FLICKR30K = Retrieval("flickr30k", "dataset_flickr30k.json", "flickr_test_ids.npy")
COCO = Retrieval("coco-retrieval", "dataset_coco.json", "coco_test_ids.npy", folds=5)


def with_hard_negatives(tasks: Sequence[Task], path: Path) -> list[Task]:
    """`tasks` with each retrieval task drawing its fourth training candidate from the pool
    at `path` (`HardNegatives.read`); ConfigError when none of them is a retrieval task."""
    if not any(isinstance(t, Retrieval) for t in tasks):
        raise ConfigError(
            f"--hard-negatives: only retrieval tasks use a hard-negative pool, not {', '.join(t.name for t in tasks)}"
        )
    pool = HardNegatives.read(Path(path))
    return [t.with_hard_negatives(pool) if isinstance(t, Retrieval) else t for t in tasks]
