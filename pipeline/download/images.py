"""Turning downloaded bytes into a stored image: pure functions, no I/O.

Content is sniffed from the magic bytes (a Content-Type header is never trusted); the
pixel count is checked from the header before the image is decoded (decompression
bombs); EXIF orientation is applied; every mode is converted to RGB (CMYK, L, P, LA,
RGBA over white, 16-bit scaled to 8-bit); optional filters (minimum side, maximum aspect
ratio) and a downscale to a maximum side. When nothing needs changing the original bytes
are kept as they are.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
from PIL import Image, ImageOps

_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)
KEEPABLE = {"jpeg", "png", "webp"}
RESAMPLE = {
    "area": Image.Resampling.BOX,  # area averaging when shrinking
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}  # formats stored as downloaded when no change is needed
_ORIENTATION_TAG = 0x0112


@dataclass(frozen=True)
class ImageConfig:
    max_pixels: int = 89_478_485  # Pillow's own warning threshold
    min_side: int = 0  # 0: no filter
    max_aspect_ratio: float = 0.0  # long/short side; 0: no filter
    max_side: int = 0  # downscale so the longer side is at most this; 0: keep size
    encode_format: str = "jpeg"  # for re-encoded images: jpeg or png
    quality: int = 95
    resample: str = "area"  # downscale filter: area (= OpenCV INTER_AREA), bilinear, bicubic, lanczos


class ImageError(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class StoredImage:
    data: bytes
    format: str
    width: int
    height: int
    original_width: int
    original_height: int
    sha256: str
    reencoded: bool


def sniff(data: bytes) -> Optional[str]:
    """The image format named by the leading bytes, or None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for magic, fmt in _MAGIC:
        if data.startswith(magic):
            return fmt
    return None


def _to_rgb(im: Image.Image) -> Image.Image:
    if im.mode == "RGB":
        return im
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(im, dtype=np.uint32)
        peak = 65535 if im.mode != "I" or arr.max() > 255 else 255
        return Image.fromarray((arr * 255 // max(peak, 1)).astype(np.uint8), "L").convert("RGB")
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    if im.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def process_image(data: bytes, cfg: ImageConfig) -> StoredImage:
    """Validate and normalize one image; raises `ImageError` with a named reason."""
    fmt = sniff(data)
    if fmt is None:
        head = data[:16].decode("latin1").encode("unicode_escape").decode()
        raise ImageError("not an image", f"{len(data):,} bytes starting {head!r}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))  # reads the header only
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageError("decompression bomb", str(err)) from err
    except Exception as err:  # Pillow raises many types for unreadable headers
        raise ImageError("decode error", f"{fmt}: {err}") from err
    width, height = im.size
    if width * height > cfg.max_pixels:
        raise ImageError("decompression bomb", f"{width}x{height} exceeds {cfg.max_pixels:,} pixels")
    try:
        orientation = im.getexif().get(_ORIENTATION_TAG, 1)
    except Exception as err:
        raise ImageError("decode error", f"{fmt}: {err}") from err
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    short, long_ = min(width, height), max(width, height)
    if fmt == "jpeg" and cfg.max_side and long_ >= 2 * cfg.max_side:
        # Let the JPEG decoder scale by 1/2, 1/4 or 1/8 while decoding (never below the target).
        scale = cfg.max_side / long_
        im.draft("RGB", (max(1, round(im.width * scale)), max(1, round(im.height * scale))))
    try:
        im.load()
    except Exception as err:
        raise ImageError("decode error", f"{fmt}: {err}") from err
    if cfg.min_side and short < cfg.min_side:
        raise ImageError("too small", f"{width}x{height}, shorter side < {cfg.min_side}")
    if cfg.max_aspect_ratio and long_ / max(short, 1) > cfg.max_aspect_ratio:
        raise ImageError("aspect ratio", f"{width}x{height} exceeds {cfg.max_aspect_ratio:g}:1")
    resize = bool(cfg.max_side) and long_ > cfg.max_side
    animated = getattr(im, "n_frames", 1) > 1
    if not resize and not animated and fmt in KEEPABLE and im.mode == "RGB" and orientation in (1, None):
        return StoredImage(data, fmt, width, height, width, height, hashlib.sha256(data).hexdigest(), False)
    try:
        out = _to_rgb(ImageOps.exif_transpose(im) if orientation not in (1, None) else im)
        if resize:
            scale = cfg.max_side / long_
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            if out.size != size:
                out = out.resize(size, RESAMPLE[cfg.resample])
        buf = io.BytesIO()
        if cfg.encode_format == "png":
            out.save(buf, "PNG")
        else:
            out.save(buf, "JPEG", quality=cfg.quality)
    except Exception as err:
        raise ImageError("decode error", f"{fmt}: {err}") from err
    encoded = buf.getvalue()
    return StoredImage(
        encoded, cfg.encode_format, out.width, out.height, width, height, hashlib.sha256(encoded).hexdigest(), True,
    )


def load_rgb(data: bytes, max_pixels: int = ImageConfig.max_pixels) -> np.ndarray:
    """Decode image bytes to an (H, W, 3) uint8 RGB array, upright (EXIF applied), with
    the same sniffing and decompression-bomb checks as downloads; raises `ImageError`."""
    fmt = sniff(data)
    if fmt is None:
        raise ImageError("not an image", f"{len(data):,} bytes starting {data[:16]!r}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
        if im.width * im.height > max_pixels:
            raise ImageError("decompression bomb", f"{im.width}x{im.height} exceeds {max_pixels:,} pixels")
        im.load()
        return np.asarray(_to_rgb(ImageOps.exif_transpose(im)))
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageError("decompression bomb", str(err)) from err
    except Exception as err:
        raise ImageError("decode error", f"{fmt}: {err}") from err
