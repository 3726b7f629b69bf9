"""Image decoding, the one owner for download, detect and show: pure functions, no I/O.

Content is sniffed from the magic bytes (a Content-Type header is never trusted); the
pixel count is checked from the header before the image is decoded (decompression
bombs); EXIF orientation is applied; every mode is converted to RGB (CMYK, L, P, LA,
RGBA over white, 16-bit scaled to 8-bit).

* `process_image(data, ImageConfig)`: a downloaded image made ready to store — optional
  filters (minimum side, maximum aspect ratio), a downscale to a maximum side, and a
  re-encode only when something changed (otherwise the original bytes are kept).
* `load_rgb(data)`: an (H, W, 3) uint8 array for the detector and `vlprep show`.

Both raise `ImageError` with a named reason (a sample error: counted, never fatal).
`ImageConfig` validates itself (a `ConfigError` naming the flag).
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
from PIL import Image, ImageOps

from pipeline.config import Config, at_least, one_of
from pipeline.errors import ConfigError

_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)
KEEPABLE = {"jpeg", "png", "webp"}  # formats stored as downloaded when no change is needed
ENCODE_FORMATS = ("jpeg", "png")  # of re-encoded images
RESAMPLE = {
    "area": Image.Resampling.BOX,  # area averaging when shrinking (= OpenCV INTER_AREA)
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
_ORIENTATION_TAG = 0x0112


@dataclass(frozen=True)
class ImageConfig(Config):
    max_pixels: int = 89_478_485  # Pillow's own warning threshold
    min_side: int = 0  # 0: no filter
    max_aspect_ratio: float = 0.0  # long/short side; 0: no filter
    max_side: int = 0  # downscale so the longer side is at most this; 0: keep size
    encode_format: str = "jpeg"  # for re-encoded images: ENCODE_FORMATS
    quality: int = 95  # JPEG quality of re-encoded images, 1..100
    resample: str = "area"  # downscale filter: a RESAMPLE name

    def __post_init__(self) -> None:
        at_least(self, {"max_pixels": 1, "min_side": 0, "max_aspect_ratio": 0, "max_side": 0, "quality": 1})
        if self.quality > 100:
            raise ConfigError(f"--quality must be <= 100, got {self.quality}")
        if 0 < self.max_aspect_ratio < 1:
            raise ConfigError(
                f"--max-aspect-ratio is long side / short side: 0 (off) or >= 1, got {self.max_aspect_ratio:g}"
            )
        one_of("encode_format", self.encode_format, ENCODE_FORMATS)
        one_of("resample", self.resample, RESAMPLE)


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


def _open(data: bytes, max_pixels: int) -> tuple[str, Image.Image]:
    """The sniffed format and the image with its header read (not decoded yet), after the
    decompression-bomb checks; raises `ImageError`."""
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
    if im.width * im.height > max_pixels:
        raise ImageError("decompression bomb", f"{im.width}x{im.height} exceeds {max_pixels:,} pixels")
    return fmt, im


def to_rgb(im: Image.Image) -> Image.Image:
    """`im` in RGB: 16-bit scaled to 8-bit, transparency composited over white."""
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
    fmt, im = _open(data, cfg.max_pixels)
    width, height = im.size
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
        out = to_rgb(ImageOps.exif_transpose(im) if orientation not in (1, None) else im)
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
        encoded,
        cfg.encode_format,
        out.width,
        out.height,
        width,
        height,
        hashlib.sha256(encoded).hexdigest(),
        True,
    )


def load_rgb(data: bytes, max_pixels: int = ImageConfig.max_pixels) -> np.ndarray:
    """Decode image bytes to an (H, W, 3) uint8 RGB array, upright (EXIF applied), with
    the same sniffing and decompression-bomb checks as downloads; raises `ImageError`."""
    fmt, im = _open(data, max_pixels)
    try:
        im.load()
        return np.asarray(to_rgb(ImageOps.exif_transpose(im)))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageError("decompression bomb", str(err)) from err
    except Exception as err:
        raise ImageError("decode error", f"{fmt}: {err}") from err
