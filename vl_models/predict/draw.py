"""Drawing a query and its answer (`picture`: `vltrain predict --show`, the demo's picture):
the image(s) with their regions, what was asked and what the model answered."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PIL import Image, ImageDraw, ImageFont

from pipeline.detect.show import side_by_side
from pipeline.images import load_rgb
from vl_models.predict.queries import TEXT_FIELDS, sources_of

if TYPE_CHECKING:
    from vl_models.predict.predictor import Predictor


def picture(predictor: Predictor, query: dict, result: dict, title: str = ""):
    """The image(s) of a query with their regions (thin grey), `title`, what was asked and the
    answer on top: the grounded box (thick), the verdict, the ranking's best images with their
    scores. A PIL image."""

    def tile(source, highlight=None, note: str = "") -> Image.Image:
        _, record, data = predictor.image(source)
        im = Image.fromarray(load_rgb(data)) if data else Image.new("RGB", (record.image_w, record.image_h), "gray")
        draw = ImageDraw.Draw(im)
        for box in record.boxes:
            draw.rectangle([float(v) for v in box], outline=(200, 200, 200), width=1)
        if highlight is not None:
            draw.rectangle(highlight, outline=(230, 25, 75), width=max(3, im.width // 120))
        if note:
            font = ImageFont.load_default(size=max(12, im.height // 20))
            draw.rectangle(draw.textbbox((4, 4), note, font=font), fill=(255, 255, 255))
            draw.text((4, 4), note, fill=(0, 0, 0), font=font)
        return im

    asked = next((query[f] for f in TEXT_FIELDS if f in query), " / ".join(query.get("captions") or []))
    if "error" in result:
        lines, tiles = [asked, f"error: {result['error']}: {result['detail']}"], []
    elif "ranking" in result and "image" in result["ranking"][0]:
        lines = [asked]
        by_key = dict(zip(predictor.keys_of(query), sources_of(query)))
        tiles = [
            tile(by_key[r["image"]], note=f"#{n + 1}  {r['score']:.2f}") for n, r in enumerate(result["ranking"][:8])
        ]
    elif "label" in result:
        lines = [asked, f"{result['label']} (p = {result['probability']:.2f})"]
        tiles = [tile(s) for s in query["images"]]
    elif "box" in result:
        lines = [asked, f"score {result['score']:.2f}"]
        tiles = [tile(query["image"], highlight=result["box"])]
    elif "top_k" in result:
        lines = [asked, "  ".join(f"{a['answer']} {a['score']:.2f}" for a in result["top_k"])]
        tiles = [tile(query["image"])]
    elif "answer_probabilities" in result:
        probs = result["answer_probabilities"]
        lines = [asked, f"{query['choices'][result['answer']]} (p = {probs[result['answer']]:.2f})"]
        tiles = [tile(query["image"])]
    elif "ranking" in result:
        lines = [asked, *(f"{r['score']:.2f}  {r['caption']}" for r in result["ranking"][:8])]
        tiles = [tile(query["image"])]
    else:
        lines = [asked, f"p = {result['probability']:.2f}"]
        tiles = [tile(query["image"])]
    lines = [title, *lines] if title else lines
    font = ImageFont.load_default(size=16)
    row = side_by_side(tiles, gap=4) if tiles else None
    width = int(max([row.width if row else 0, *(font.getlength(str(x)) + 12 for x in lines)]))
    top = 8 + 22 * len(lines)
    canvas = Image.new("RGB", (width, top + (row.height if row else 0) + 4), "white")
    draw = ImageDraw.Draw(canvas)
    for n, line in enumerate(lines):
        draw.text((6, 4 + 22 * n), str(line), fill=(0, 0, 0), font=font)
    if row:
        canvas.paste(row, (0, top))
    return canvas
