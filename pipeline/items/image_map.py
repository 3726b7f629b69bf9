"""Image maps: ``source id<TAB>store key`` lines that rename the images the annotation files
name to the keys of the feature stores (`vlprep build-mixture`'s ``image_map:``, `vlprep
build-task --image-map`)."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import ConfigError


def read_image_map(path: Path) -> dict[str, str]:
    """``source id<TAB>store key`` lines. A source id mapped twice to different keys is a
    ConfigError naming both lines; the same line repeated is accepted."""
    aliases: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
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
