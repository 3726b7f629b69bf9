"""`vlprep build-task`: a task's official files -> a task dataset (`pipeline.task_data`).

The task (`vl_models.transfer.get`) reads its files (`Task.read`); rows are kept in file
order, with the named splits the task adds (`Task.named_splits`: VQA's and GQA's minval, COCO
retrieval's 1K test folds) and, with ``minival`` / ``nominival`` (LXMERT's published
``minival.json`` / ``nominival.json``, `pipeline.sources.lxmert.read_question_ids`), LXMERT's:
``minival`` = the val rows whose question id (uid) its file lists, ``nominival`` likewise from
its file, or without it the other val rows (and ``minival`` the val rows not in
``nominival.json`` when only that is given).

``test_images`` (12-in-1's ``clean_datasets`` lists: ``coco_test_ids.npy``,
``genome_test_ids.npy``, ``flickr_test_ids.npy``, or a text list; `pipeline.sources.image_ids`)
make the split ``test_images``: the rows (of any split) showing a listed image, the image named
as 12-in-1 compares them (`image_number`: ``COCO_train2014_000000391895`` is 391895). The
12-in-1 recipes subtract it from their training splits (``train-test_images``), as
vilbert-multi-task drops those images from training. It is declared, empty, without the lists
(the manifest's ``named_splits``, which `TaskData.rows` accepts), so the recipes still run, and
the report says that nothing was held out. Images are
named as the files name them and mapped to feature-store keys through ``--image-map``
(``name<TAB>store key`` lines, as build-mixture's; unmapped names are keys as they are).

Classifier tasks (VQA, GQA) get an answer table: the answers (`Task.table_answer`: VQA's
normalized) occurring at least ``min_count`` times over the train and val rows, most
frequent first (ties alphabetical), or exactly the table of ``answers_from`` in its order
(`pipeline.items.answers`, the builder mixtures use too: the seeds' label files). Each row's soft
targets (`Task.targets`: VQA's count the answers as given, as BUTD's do) are kept where the table
has the answer; the manifest says how many training rows keep at least one and, for VQA, per
split, how many questions the unnormalized comparison leaves without a target or with other
targets than normalized answers would have (``answers.raw_answers``).

A task may add files of its own (RefCOCO: ``given_boxes.json``, the ground-truth boxes for
`vlprep extract --given-boxes`). Malformed rows are named (file:where, reason), counted and left out; skipped
rows (null or blank texts) are counted per reason. The folder is written by
`pipeline.items.ItemsWriter` (manifest last) under a temporary name and swapped in when
complete (`pipeline.io.replacing_output`): an earlier task dataset there is replaced, anything
else is refused, and so is an output that holds or lies inside any input (the official files,
the image map, the answer table, minival.json, nominival.json, the image lists). The output's
lock is taken before any input is read: a second build of the same folder is refused at once.
The manifest records the size and sha256 of each file written (``contents``), which
`TaskData.open` checks.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Callable, Optional, Sequence

from pipeline import __version__
from pipeline.errors import ConfigError
from pipeline.io import replacing_output, sha256_file
from pipeline.items import ItemsWriter
from pipeline.items.answers import answer_table, fixed_table, read_answer_file
from pipeline.items.image_map import read_image_map
from pipeline.items.inputs import check_input_file, file_problem
from pipeline.sources.base import Malformed, Skip
from pipeline.sources.image_ids import image_number, read_image_ids
from pipeline.sources.lxmert import read_question_ids
from pipeline.task_data import FORMAT, ITEMS_SCHEMA, TASK_SCHEMA_VERSION, task_manifest
from vl_models.transfer.task import Row, Task

log = logging.getLogger(__name__)
LISTED = 20  # malformed rows named in the manifest and report
ANSWER_TARGETS = ("butd", "normalized")  # VQA targets: answers counted as given (BUTD's, the references') or normalized
TEST_IMAGES = "test_images"  # the split of the rows on --test-images' images (12-in-1's clean_datasets)


def build_task(
    task: Task,
    files: Sequence[Path],
    out: Path,
    image_map: Optional[Path] = None,
    answers_from: Optional[Path] = None,
    min_count: Optional[int] = None,
    progress: Optional[Callable[[int], None]] = None,
    minival: Optional[Path] = None,
    nominival: Optional[Path] = None,
    test_images: Sequence[Path] = (),
    answer_targets: str = "butd",
) -> dict:
    """Read `files` for `task` and write the task dataset to `out`; returns the manifest.

    Before reading anything: the flags are checked, and `out` must be a new or empty folder or
    an earlier task dataset that holds none of the inputs (the official files, `image_map`,
    `answers_from`, `minival`, `nominival`, `test_images`) and lies inside none of them
    (`pipeline.io.check_output`: ConfigError). Then, holding `out`'s lock (a second build of it
    gets BusyError at once), the inputs are read and the folder is written and swapped in."""
    files = [Path(f) for f in files]
    unreadable = [f"{f} ({problem})" for f in files if (problem := file_problem(f))]
    if not files or unreadable:
        raise ConfigError(
            f"build-task --task {task.name}: cannot read {', '.join(unreadable)}"
            if unreadable
            else f"build-task --task {task.name} needs its files: {task.files}"
        )
    seen: dict = {}
    for f in files:  # the same file twice (also through a link) would double its rows
        st = f.stat()
        if (st.st_dev, st.st_ino) in seen:
            raise ConfigError(
                f"build-task --task {task.name}: {f} is given twice (also as {seen[st.st_dev, st.st_ino]}): "
                "give each file once"
            )
        seen[st.st_dev, st.st_ino] = f
    test_images = [Path(p) for p in test_images]
    for flag, path in (
        ("--image-map", image_map),
        ("--answers-from", answers_from),
        ("--minival", minival),
        ("--nominival", nominival),
        *(("--test-images", p) for p in test_images),
    ):
        if path:
            check_input_file(path, flag)
    if min_count is not None and min_count < 1:
        raise ConfigError(f"--min-count must be at least 1, got {min_count}")
    if task.head != "answers" and (answers_from or min_count):
        raise ConfigError(f"--answers-from / --min-count: {task.name} has no answer table")
    if answer_targets not in ANSWER_TARGETS:
        raise ConfigError(f"--answer-targets {answer_targets!r}: one of {', '.join(ANSWER_TARGETS)}")
    if answer_targets != "butd" and not hasattr(task, "normalized_targets"):
        raise ConfigError(f"--answer-targets {answer_targets}: only VQA's targets count annotators' answers")
    inputs = [*files, *(Path(p) for p in (image_map, answers_from, minival, nominival) if p), *test_images]
    with replacing_output(
        Path(out), FORMAT, inputs=inputs, what="vlprep build-task", also_ours=lambda p: task_manifest(p) is not None
    ) as tmp:
        manifest = _build(
            task,
            files,
            tmp,
            image_map,
            answers_from,
            min_count,
            progress,
            minival,
            nominival,
            test_images,
            answer_targets,
        )
    for line in manifest["malformed"]["examples"]:
        log.warning("malformed: %s", line)
    return manifest


def _build(
    task: Task,
    files: list[Path],
    tmp: Path,
    image_map: Optional[Path],
    answers_from: Optional[Path],
    min_count: Optional[int],
    progress: Optional[Callable[[int], None]],
    minival: Optional[Path],
    nominival: Optional[Path],
    test_images: list[Path],
    answer_targets: str,
) -> dict:
    """`build_task`'s work, under the output's lock: read the inputs, write the folder `tmp`."""
    aliases = read_image_map(image_map) if image_map else {}
    rows: list[Row] = []
    skipped: Counter = Counter()
    malformed: list[str] = []
    for read in task.read(files):
        if isinstance(read, Malformed):
            malformed.append(str(read))
        elif isinstance(read, Skip):
            skipped[read.reason] += 1
        else:
            rows.append(read)
            if progress and len(rows) % 10000 == 0:
                progress(10000)
    if not rows:
        raise ConfigError(
            f"{', '.join(map(str, files))}: no {task.name} rows"
            + (f" ({len(malformed)} malformed, e.g. {malformed[0]})" if malformed else "")
        )
    named = {name: set(indices) for name, indices in task.named_splits(rows).items()}
    held_out, lxmert_info = _lxmert_splits(minival, nominival, rows)
    named.update(held_out)
    named[TEST_IMAGES], test_info = _test_image_rows(task, test_images, rows)
    table, index, table_info = _answer_table(task, rows, answers_from, min_count)
    records = []
    kept_targets = 0
    raw_effect: dict[str, Counter] = {"no_target": Counter(), "other_targets": Counter()}
    for i, row in enumerate(rows):
        butd = {index[a]: s for a, s in task.targets(row).items() if a in index}
        targets = butd
        if hasattr(task, "normalized_targets") and row.answers:
            normalized = {index[a]: s for a, s in task.normalized_targets(row).items() if a in index}
            if normalized != butd:
                raw_effect["no_target" if not butd else "other_targets"][row.split] += 1
            targets = normalized if answer_targets == "normalized" else butd
        kept_targets += bool(targets) and row.split == task.train_split
        records.append(
            {
                **{
                    k: getattr(row, k)
                    for k in (
                        "uid",
                        "text",
                        "choices",
                        "rationales",
                        "label",
                        "rationale_label",
                        "answers",
                        "answer_type",
                        "question_type",
                        "box",
                        "group",
                    )
                },
                "splits": [row.split, *(name for name, members in named.items() if i in members)],
                "images": [aliases.get(name, name) for name in row.images],
                "answer_ids": list(targets) or None,
                "answer_scores": list(targets.values()) or None,
            }
        )
    extra = task.extra_files(files, rows)
    splits = Counter(s for record in records for s in record["splits"])
    train_rows = splits.get(task.train_split, 0)
    manifest = {
        "format": FORMAT,
        "schema_version": TASK_SCHEMA_VERSION,
        "task": task.name,
        "created_by": f"vlprep {__version__}",
        "rows": len(rows),
        "splits": dict(sorted(splits.items())),
        "answers": {
            **table_info,
            "count": len(table),
            "train_rows_with_target": kept_targets,
            "train_rows": train_rows,
            **(
                {
                    "targets": answer_targets,
                    "raw_answers": {k: dict(sorted(v.items())) for k, v in raw_effect.items()},
                }
                if hasattr(task, "normalized_targets")
                else {}
            ),
        }
        if task.head == "answers"
        else None,
        "named_splits": sorted(named),
        "image_map": str(image_map) if image_map else None,
        **lxmert_info,
        "test_images": test_info,
        "files": [{"path": str(f), "sha256": sha256_file(f)} for f in files],
        "skipped": dict(skipped),
        "malformed": {"count": len(malformed), "examples": malformed[:LISTED]},
        "extra_files": sorted(extra),
    }
    with ItemsWriter(tmp, ITEMS_SCHEMA) as writer:
        for record in records:
            writer.add(record)
    return writer.finish(answers={"answers": table}, extra=extra, report=render_report(manifest), manifest=manifest)


MINIVAL_OF = "val"  # the split LXMERT's minival.json / nominival.json hold questions of


def _lxmert_splits(
    minival: Optional[Path], nominival: Optional[Path], rows: list[Row]
) -> tuple[dict[str, set[int]], dict]:
    """LXMERT's ``minival`` and ``nominival`` (each the val rows its file lists by question id;
    the one whose file is not given: the other val rows), with the manifest's account of the
    files (keys ``minival`` / ``nominival``); none without either file. ConfigError when a file
    lists none of the val rows, or both list a row."""
    if not (minival or nominival):
        return {}, {}
    files = (("minival", minival), ("nominival", nominival))
    listed = {name: _listed_rows(Path(path), rows, f"--{name}") for name, path in files if path}
    if len(listed) == 2:
        both = listed["minival"][0] & listed["nominival"][0]
        if both:
            raise ConfigError(
                f"--minival {minival} and --nominival {nominival} both list {len(both)} val questions "
                f"(e.g. {rows[min(both)].uid}): LXMERT's two files are disjoint; give its minival.json and "
                "nominival.json"
            )
    val = {i for i, row in enumerate(rows) if row.split == MINIVAL_OF}
    splits = {name: chosen for name, (chosen, _) in listed.items()}
    for name, other in (("minival", "nominival"), ("nominival", "minival")):
        if name not in splits:
            splits[name] = val - splits[other]
    return splits, {name: info for name, (_, info) in listed.items()}


def _collected(reads) -> tuple[set, int]:
    """The ids a list reader yields, and how many of its entries were malformed."""
    ids, bad = set(), 0
    for read in reads:
        if isinstance(read, Malformed):
            bad += 1
        else:
            ids.add(read)
    return ids, bad


def _listed_rows(path: Path, rows: list[Row], flag: str) -> tuple[set[int], dict]:
    """The val rows whose question id the LXMERT split file `path` lists, with the manifest's
    account of the file; ConfigError when it lists none of them."""
    ids, bad = _collected(read_question_ids(path))
    # LXMERT's files list val2014 questions: only val rows are matched (a file may repeat an id across
    # splits, as the shapes world's do), and ids that match no val row are counted, not guessed at
    chosen = {i for i, row in enumerate(rows) if row.split == MINIVAL_OF and row.uid in ids}
    elsewhere = {row.uid for row in rows if row.split != MINIVAL_OF and row.uid in ids} - {rows[i].uid for i in chosen}
    if not chosen:
        raise ConfigError(
            f"{flag} {path}: none of its {len(ids)} question ids is a {MINIVAL_OF} row of the files read"
            + (f" ({bad} entries without a question_id)" if bad else "")
            + (f" ({len(elsewhere)} are rows of other splits)" if elsewhere else "")
            + f": LXMERT's {flag[2:]}.json lists val2014 questions; give the val2014 questions and annotations"
        )
    missing = len(ids) - len(chosen)
    if missing:
        log.warning(
            "%s %s: %d of its %d question ids are no %s row of the files read (%d of them rows of other splits)",
            flag,
            path,
            missing,
            len(ids),
            MINIVAL_OF,
            len(elsewhere),
        )
    info = {
        "path": str(path),
        "ids": len(ids),
        "matched": len(chosen),
        "not_found": missing,
        "in_other_splits": len(elsewhere),
        "malformed": bad,
        "of_splits": [MINIVAL_OF],
    }
    return chosen, info


def _test_image_rows(task: Task, paths: list[Path], rows: list[Row]) -> tuple[set[int], dict]:
    """The rows showing an image the lists at `paths` name (12-in-1's ``clean_datasets``
    files), with the manifest's account: the files, the ids, the images of the data they
    match and the rows per split; ConfigError for a list without a single id."""
    reference = getattr(task, "test_images_file", None)
    ids: set = set()
    files = []
    for path in paths:
        found, bad = _collected(read_image_ids(path))
        if not found:
            malformed = f" ({bad} malformed entries)" if bad else ""
            raise ConfigError(f"--test-images {path}: no image ids in it{malformed}")
        files.append({"path": str(path), "sha256": sha256_file(path), "ids": len(found), "malformed": bad})
        ids |= found
    chosen = {i for i, row in enumerate(rows) if ids and any(image_number(name) in ids for name in row.images)}
    images = {name for i in chosen for name in rows[i].images if image_number(name) in ids}
    if paths and not chosen:
        log.warning("--test-images: none of the %d listed images is an image of the %s rows read", len(ids), task.name)
    return chosen, {
        "files": files,
        "ids": len(ids),
        "images": len(images),
        "rows": dict(sorted(Counter(rows[i].split for i in chosen).items())),
        "reference_file": reference,
    }


def _answer_table(
    task: Task, rows: list[Row], answers_from: Optional[Path], min_count: Optional[int]
) -> tuple[list[str], dict[str, int], dict]:
    """The answer table, each answer's id (its first position) and the manifest's account of it."""
    if task.head != "answers":
        return [], {}, {}  # build_task refused --answers-from / --min-count already
    if answers_from:
        fixed = fixed_table(read_answer_file(Path(answers_from)), Path(answers_from), task.table_answer)
        return fixed.answers, fixed.index, {"from": str(answers_from), "unreachable": len(fixed.unreachable)}
    min_count = min_count or task.min_count
    counted = [r for r in rows if r.split in task.table_splits]
    if not counted:
        found = Counter(r.split for r in rows)
        raise ConfigError(
            f"no {task.name} row is in split {' or '.join(task.table_splits)}, whose answers make the answer table "
            f"(the rows read are in {', '.join(f'{s!r} ({n})' for s, n in sorted(found.items()))}); a file's split "
            f"is in its name: {task.files}. Give the training files, or the table with --answers-from"
        )
    counts = Counter(task.table_answer(r.answer) for r in counted if r.answer)
    table = answer_table(counts, min_count=min_count)
    if not table:
        raise ConfigError(
            f"no answer occurs {min_count} times in the {'/'.join(task.table_splits)} rows: "
            "lower --min-count, or give --answers-from"
        )
    index = {a: i for i, a in enumerate(table)}
    return table, index, {"min_count": min_count, "counted_over": list(task.table_splits)}


def render_report(m: dict) -> str:
    lines = [
        f"# Task dataset: {m['task']}",
        "",
        f"{m['rows']} rows ({m['created_by']}).",
        "",
        "| split | rows |",
        "|---|---|",
        *(f"| {s} | {n} |" for s, n in m["splits"].items()),
        "",
    ]
    if m["answers"]:
        a = m["answers"]
        source = f"from {a['from']}" if "from" in a else f"answers seen at least {a['min_count']} times"
        lines += [
            f"Answer table: {a['count']} answers ({source}); {a['train_rows_with_target']} of "
            f"{a['train_rows']} training rows have a target in it.",
            "",
        ]
    if m["answers"] and m["answers"].get("raw_answers"):
        raw = m["answers"]["raw_answers"]
        none, other = sum(raw["no_target"].values()), sum(raw["other_targets"].values())
        if (none or other) and m["answers"].get("targets", "butd") == "butd":
            lines += [
                f"Answers compared as given (BUTD's compute_target, the references' targets): {none} questions "
                f"({_per_split(raw['no_target'])}) have no target and {other} ({_per_split(raw['other_targets'])}) "
                "other targets than they would with every answer normalized as the table is "
                "(--answer-targets normalized gives them those).",
                "",
            ]
        elif none or other:
            lines += [
                f"Answers normalized before counting (--answer-targets normalized): {none} questions "
                f"({_per_split(raw['no_target'])}) have a target that BUTD's compute_target (the references') "
                f"would not give them and {other} ({_per_split(raw['other_targets'])}) other targets than its.",
                "",
            ]
    for name, other in (("minival", "nominival"), ("nominival", "minival")):
        if m.get(name):
            held = m[name]
            lines += [
                f"LXMERT's {name} from {held['path']}: {held['matched']} of its {held['ids']} question ids"
                + (f" (the rest of {', '.join(held['of_splits'])}: {other})." if not m.get(other) else "."),
                "",
            ]
    lines += _test_images_report(m["test_images"])
    if m["skipped"]:
        lines += ["Skipped: " + ", ".join(f"{n} {reason}" for reason, n in m["skipped"].items()), ""]
    bad = m["malformed"]
    lines += [f"Malformed rows: {bad['count']}" + (" (left out):" if bad["count"] else "")]
    lines += [f"- {line}" for line in bad["examples"]]
    return "\n".join(lines) + "\n"


def _per_split(counts: dict) -> str:
    return ", ".join(f"{split} {n}" for split, n in counts.items()) or "none"


def _test_images_report(info: dict) -> list[str]:
    """The report's account of split ``test_images``."""
    if info["files"]:
        return [
            f"Test images ({', '.join(f['path'] for f in info['files'])}: {info['ids']} ids): {info['images']} images "
            f"of the data; split {TEST_IMAGES} holds their {sum(info['rows'].values())} rows "
            f"({_per_split(info['rows'])}), which 12-in-1's recipes leave out of training (vilbert-multi-task's "
            "clean_datasets).",
            "",
        ]
    if info["reference_file"]:
        return [
            f"No --test-images: split {TEST_IMAGES} is empty, so training keeps every image; vilbert-multi-task drops "
            f"the images its {info['reference_file']} lists from training (clean_datasets, on by default): give that "
            "file to do the same.",
            "",
        ]
    return []
