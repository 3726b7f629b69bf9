"""`vlprep build-task`: attached to the vlprep command line through the ``vlprep.commands``
entry point (pipeline never imports vl_models); the work is `vl_models.transfer.build`'s."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer
from rich.console import Console

from pipeline.log import named_errors


def build_task(
    task: str = typer.Option(
        ...,
        help=(
            "The task: vqa, gqa, nlvr2, flickr30k, coco-retrieval, refcoco+, refcoco, refcocog, vcr, vcr-q2a, "
            "vcr-qa2r (see --help's list of files)."
        ),
    ),
    files: List[Path] = typer.Argument(
        ...,
        help=(
            "The task's official files: vqa: each questions file followed by its annotations file (test-dev/test "
            "questions alone); gqa: SPLIT_balanced_questions.json files; nlvr2: train.json dev.json test1.json; "
            "flickr30k / coco-retrieval: dataset_flickr30k.json / dataset_coco.json; refcoco+/refcoco/refcocog: "
            "refs(unc).p (umd for refcocog) then instances.json; vcr, vcr-q2a, vcr-qa2r: train.jsonl val.jsonl "
            "test.jsonl [unisex_names_table.csv: vilbert-multi-task's person names]."
        ),
    ),
    out: Path = typer.Option(
        ..., help="The task dataset folder to write (items.arrow, answers.json, manifest.json, report.md)."
    ),
    image_map: Path = typer.Option(
        None,
        help=(
            "TSV of 'image name<TAB>store key' lines: the feature-store key of each image the files name (unmapped "
            "names are keys as they are)."
        ),
    ),
    answers_from: Path = typer.Option(
        None,
        help=(
            "VQA/GQA: use exactly this answer table, in its order (a JSON list, LXMERT's {ans} list or {answer: "
            "index} map, or one answer a line)."
        ),
    ),
    min_count: int = typer.Option(
        None,
        help=(
            "VQA/GQA: keep answers occurring at least this often in train+val (default: VQA 9, which gives the 3,129 "
            "answers, GQA 1)."
        ),
    ),
    minival: Path = typer.Option(
        None,
        help=(
            "LXMERT's minival.json (a list of questions with question_id): its val questions form split minival, "
            "the rest of val nominival unless --nominival is given (LXMERT trains on train,nominival)."
        ),
    ),
    nominival: Path = typer.Option(
        None,
        help=(
            "LXMERT's nominival.json (as minival.json): its val questions form split nominival (with --minival, "
            "minival's from that file; without, the rest of val)."
        ),
    ),
    answer_targets: str = typer.Option(
        "butd",
        help=(
            "VQA training targets: butd counts the annotators' answers as given, as BUTD's compute_target does (the "
            "targets vilbert-multi-task and LXMERT train on: an answer written otherwise than its normal form, "
            "t-shirt or Two, gets no target); normalized counts them normalized as the answer table is, so those "
            "questions train too. The report counts the questions the two differ on."
        ),
    ),
    test_images: List[Path] = typer.Option(
        None,
        help=(
            "Images to keep out of training (repeatable): vilbert-multi-task's clean_datasets lists, as it keeps "
            "them beside its data (cache/coco_test_ids.npy for VQA, RefCOCO/+/g and COCO retrieval, "
            "genome_test_ids.npy for GQA, flickr_test_ids.npy for Flickr30k), or a text file of one id or image "
            "name a line. Their rows form split test_images, which the ViLBERT recipes subtract from training "
            "(train-test_images); without it the split is empty."
        ),
    ),
) -> None:
    """Read a downstream task's official files into a task dataset for `vltrain finetune` and
    `vltrain evaluate`.

    It holds Arrow items joined with feature stores by image, an answer table with soft
    targets for VQA and GQA, named splits (VQA and GQA: ViLBERT's minval; COCO retrieval:
    the 1K test folds test1k_0..4 and test1k; with --minival / --nominival LXMERT's minival
    and nominival; with --test-images the rows on 12-in-1's test images, test_images), and
    malformed rows named and counted (manifest.json, report.md).

    Example:

        vlprep build-task --task vqa --out tasks/vqa \\
            v2_OpenEnded_mscoco_train2014_questions.json v2_mscoco_train2014_annotations.json \\
            v2_OpenEnded_mscoco_val2014_questions.json v2_mscoco_val2014_annotations.json
    """
    from vl_models import transfer
    from vl_models.transfer.build import build_task as build

    manifest = build(
        transfer.get(task),
        files,
        out,
        image_map,
        answers_from,
        min_count,
        minival=minival,
        nominival=nominival,
        test_images=test_images or (),
        answer_targets=answer_targets,
    )
    say = Console()
    splits = ", ".join(f"{s} {n}" for s, n in manifest["splits"].items())
    say.print(f"{task}: {manifest['rows']} rows ({splits}) -> {out}")
    if manifest["answers"]:
        a = manifest["answers"]
        say.print(
            f"answer table: {a['count']} answers; {a['train_rows_with_target']} of {a['train_rows']} "
            "training rows have a target in it"
        )
    held = manifest["test_images"]
    if held["files"]:
        say.print(
            f"test_images: {sum(held['rows'].values())} rows on {held['images']} of the {held['ids']} listed images "
            f"({', '.join(f'{s} {n}' for s, n in held['rows'].items()) or 'none'}), left out of training by the "
            "ViLBERT recipes"
        )
    elif held["reference_file"]:
        say.print(
            f"[yellow]no --test-images[/yellow]: vilbert-multi-task leaves the images of its {held['reference_file']} "
            "out of training; this data keeps them (see report.md)"
        )
    bad = manifest["malformed"]
    if bad["count"]:
        say.print(
            f"[yellow]{bad['count']} malformed rows left out[/yellow], e.g. {bad['examples'][0]} "
            f"(all counted in {out / 'manifest.json'})"
        )


def register(app: typer.Typer) -> None:
    """Attach `vlprep build-task` to the vlprep app (the ``vlprep.commands`` entry point)."""
    app.command("build-task")(named_errors(build_task))
