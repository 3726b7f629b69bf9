"""Image maps: ``source id<TAB>store key`` lines that rename the images the annotation files
name to the keys of the feature stores (`vlprep build-mixture`'s ``image_map:``, one file or
several, `vlprep build-task --image-map`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.errors import ConfigError
from pipeline.items.inputs import file_problem


def read_image_maps(paths: Sequence[Path]) -> dict[str, str]:
    """Several image maps as one (`read_image_map` of each): a source id mapped to different
    keys by two files is a ConfigError naming both files."""
    aliases: dict[str, str] = {}
    where: dict[str, Path] = {}
    for path in paths:
        for source, key in read_image_map(path).items():
            if aliases.setdefault(source, key) != key:
                raise ConfigError(
                    f"{path}: source id {source!r} maps to {key!r}, but {where[source]} maps it to "
                    f"{aliases[source]!r}; an image id maps to one store key"
                )
            where.setdefault(source, Path(path))
    return aliases


def read_image_map(path: Path) -> dict[str, str]:
    """``source id<TAB>store key`` lines (UTF-8). A source id mapped twice to different keys is a
    ConfigError naming both lines; the same line repeated is accepted. A missing, unreadable or
    non-UTF-8 file (or a folder, or a pipe) is a ConfigError naming it."""
    path = Path(path)
    problem, text = file_problem(path), ""  # a folder or a FIFO is never opened
    if not problem:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{path}: an image map is UTF-8 text ('source id<TAB>store key' lines); byte {err.start} is not UTF-8"
            ) from None
        except OSError as err:
            problem = err.strerror or str(err)
    if problem:
        raise ConfigError(
            f"{path}: cannot read the image map ({problem}); give a file of 'source id<TAB>store key' lines"
        )
    aliases: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise ConfigError(f"{path}:{lineno}: an image map line is 'source id<TAB>store key'")
        source, key = parts[0].strip(), parts[1].strip()
        if source in aliases and aliases[source] != key:
            raise ConfigError(
                f"{path}:{lineno}: source id {source!r} maps to {key!r}, but line {first_line[source]} "
                f"maps it to {aliases[source]!r}; an image id maps to one store key"
            )
        aliases[source] = key
        first_line.setdefault(source, lineno)
    return aliases
