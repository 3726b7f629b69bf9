"""The `vltrain` command line. Training commands arrive with the trainer; what exists
today shows how the trainer will see a feature store."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from pipeline.errors import StoreError
from pipeline.log import cli_app

app = cli_app("vltrain", "Train ViLBERT- and LXMERT-style models on vlprep feature stores.")
out = Console()


@app.command("preview-batch")
def preview_batch(
    store: Path = typer.Argument(..., help="Feature store directory."),
    batch_size: int = typer.Option(4, help="Images in the batch."),
    max_boxes: int = typer.Option(36, help="Region slots per image (excluding the IMG token)."),
    position: str = typer.Option("5d", help="Box encoding: 5d (ViLBERT) or 4d (LXMERT)."),
    img_token: bool = typer.Option(False, help="Prepend ViLBERT's IMG token (mean feature, whole-image box)."),
) -> None:
    """Read the first images of a store and show the padded batch a model receives:
    tensor shapes, dtypes and how many slots are real."""
    from pipeline.records import pad_regions
    from pipeline.store import FeatureStore

    if position not in ("4d", "5d"):
        raise typer.BadParameter("position must be 4d or 5d")
    try:
        store_obj = FeatureStore.open(store)
    except StoreError as err:
        Console(stderr=True).print(f"[red]error:[/red] {err}")
        raise typer.Exit(1)
    with store_obj:
        count = min(batch_size, len(store_obj))
        if count == 0:
            Console(stderr=True).print(f"[red]error:[/red] {store} holds no records")
            raise typer.Exit(1)
        batch = pad_regions([store_obj.record_at(i) for i in range(count)], max_boxes, position=position, img_token=img_token)
    table = Table("input", "shape", "dtype", title=f"padded batch of {count} from {store}")
    for name in ("features", "positions", "mask", "num_boxes", "objects_id", "objects_conf", "attrs_id",
                 "attrs_conf", "cls_prob", "attr_prob"):
        value = getattr(batch, name)
        if value is not None:
            table.add_row(name, str(tuple(value.shape)), str(value.dtype))
    out.print(table)
    out.print(f"real slots per image: {batch.num_boxes.tolist()}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
