import io
from pathlib import Path

import numpy as np
import pytest
from image_server import half_red_image, make_corpus, make_hostile
from PIL import Image

from pipeline.errors import ConfigError
from pipeline.images import ImageConfig, ImageError, load_rgb, process_image, sniff

CORPUS = make_corpus()
HOSTILE = make_hostile()


def decode(data: bytes) -> np.ndarray:
    im = Image.open(io.BytesIO(data))
    assert im.mode == "RGB"
    return np.asarray(im)


@pytest.mark.parametrize("name", ["rgb.jpg", "rgb.png", "rgb.webp"])
def test_rgb_images_keep_their_original_bytes(name):
    data = CORPUS[name][0]
    img = process_image(data, ImageConfig())
    assert img.data is data and not img.reencoded
    assert (img.width, img.height) == (64, 48) and img.format == name.split(".")[1].replace("jpg", "jpeg")
    import hashlib

    assert img.sha256 == hashlib.sha256(data).hexdigest()


def test_exif_orientation_is_applied():
    img = process_image(CORPUS["exif_rotated.jpg"][0], ImageConfig())
    assert img.reencoded and (img.width, img.height) == (64, 48) == (img.original_width, img.original_height)
    pixels = decode(img.data)
    assert pixels[24, 5, 0] > 200 and pixels[24, 5, 2] < 60  # left is red again
    assert pixels[24, 58, 2] > 200 and pixels[24, 58, 0] < 60  # right is blue


@pytest.mark.parametrize("name", ["cmyk.jpg", "gray.jpg", "palette.png", "sixteen.png", "anim.gif"])
def test_other_modes_become_rgb(name):
    img = process_image(CORPUS[name][0], ImageConfig())
    assert img.reencoded and img.format == "jpeg"
    assert decode(img.data).shape[2] == 3
    if name == "cmyk.jpg":
        pixels = decode(img.data)
        assert pixels[24, 5, 0] > 200 and pixels[24, 5, 2] < 60


def test_transparency_is_composited_on_white():
    img = process_image(CORPUS["rgba.png"][0], ImageConfig(encode_format="png"))
    pixels = decode(img.data)
    assert pixels[10, 5].tolist() == [0, 255, 0]  # opaque green kept
    assert pixels[10, 35].tolist() == [255, 255, 255]  # transparent red -> white


def test_resize_keeps_ratio_and_only_shrinks():
    img = process_image(CORPUS["big.jpg"][0], ImageConfig(max_side=320))
    assert (img.width, img.height) == (320, 240) and (img.original_width, img.original_height) == (640, 480)
    small = process_image(CORPUS["rgb.jpg"][0], ImageConfig(max_side=320))
    assert not small.reencoded and small.width == 64


@pytest.mark.parametrize(
    "data, cfg, kind",
    [
        (HOSTILE["html"], ImageConfig(), "not an image"),
        (HOSTILE["truncated.jpg"], ImageConfig(), "decode error"),
        (HOSTILE["bomb.png"], ImageConfig(), "decompression bomb"),
        (b"", ImageConfig(), "not an image"),
        (CORPUS["rgb.jpg"][0], ImageConfig(min_side=100), "too small"),
        (CORPUS["rgb.jpg"][0], ImageConfig(max_aspect_ratio=1.2), "aspect ratio"),
        (CORPUS["rgb.jpg"][0], ImageConfig(max_pixels=1000), "decompression bomb"),
    ],
)
def test_bad_images_are_named(data, cfg, kind):
    with pytest.raises(ImageError) as info:
        process_image(data, cfg)
    assert info.value.kind == kind


def test_sniff_ignores_claims():
    assert sniff(CORPUS["octet.jpg"][0]) == "jpeg"
    assert sniff(CORPUS["rgb.webp"][0]) == "webp"
    assert sniff(b"<html>") is None
    assert half_red_image().size == (64, 48)


def test_large_jpeg_downscale_matches_the_target_size():
    big = Image.new("RGB", (2000, 1500), (10, 200, 30))
    buf = io.BytesIO()
    big.save(buf, "JPEG")
    img = process_image(buf.getvalue(), ImageConfig(max_side=480))
    assert (img.width, img.height) == (480, 360) and (img.original_width, img.original_height) == (2000, 1500)
    assert np.abs(decode(img.data).astype(int) - [10, 200, 30]).max() < 8


@pytest.mark.parametrize(
    "data, kind",
    [
        (HOSTILE["html"], "not an image"),
        (HOSTILE["truncated.jpg"], "decode error"),
        (HOSTILE["bomb.png"], "decompression bomb"),
        (b"", "not an image"),
    ],
)
def test_load_rgb_names_bad_images_as_downloads_do(data, kind):
    with pytest.raises(ImageError) as info:
        load_rgb(data)
    assert info.value.kind == kind


def test_load_rgb_is_upright_rgb():
    pixels = load_rgb(CORPUS["exif_rotated.jpg"][0])
    assert pixels.shape == (48, 64, 3) and pixels[24, 5, 0] > 200 and pixels[24, 58, 2] > 200
    assert load_rgb(CORPUS["cmyk.jpg"][0]).shape == (48, 64, 3)


@pytest.mark.parametrize(
    "fields, flag",
    [
        ({"encode_format": "gif"}, "--encode-format"),
        ({"resample": "nearest"}, "--resample"),
        ({"quality": 0}, "--quality"),
        ({"quality": 101}, "--quality"),
        ({"max_pixels": 0}, "--max-pixels"),
        ({"min_side": -1}, "--min-side"),
        ({"max_side": -5}, "--max-side"),
        ({"max_aspect_ratio": 0.5}, "--max-aspect-ratio"),
    ],
)
def test_image_config_refuses_bad_values_naming_the_flag(fields, flag):
    with pytest.raises(ConfigError, match=flag):
        ImageConfig(**fields)
    assert ImageConfig.from_json(ImageConfig(max_side=512).to_json()) == ImageConfig(max_side=512)


def test_one_image_module_decodes_for_download_detect_and_show():
    """Decoding has one owner, pipeline/images.py: the old download/images.py twin is gone,
    nothing imports its path, no other module defines the decoders, and download, detect
    (show included) and the image shards open no image themselves."""
    root = Path(__file__).resolve().parents[2] / "pipeline"
    assert not (root / "download" / "images.py").exists()
    stages = [*(root / "download").glob("*.py"), *(root / "detect").glob("*.py"), root / "image_shards.py"]
    for path in root.rglob("*.py"):
        if path == root / "images.py":
            continue
        text = path.read_text()
        assert "pipeline.download.images" not in text, path
        assert not any(
            f"def {name}(" in text for name in ("sniff", "to_rgb", "_to_rgb", "load_rgb", "process_image")
        ), path
        if path in stages:
            assert "Image.open(" not in text, path
