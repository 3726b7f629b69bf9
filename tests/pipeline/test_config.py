"""The shared config helpers: JSON round trip, unknown keys named, the common checks."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from pipeline.config import Config, at_least, from_json, one_of, to_json
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class Inner(Config):
    size: int = 3
    names: tuple[str, ...] = ("a",)


@dataclass(frozen=True)
class Outer(Config):
    out: Path
    inner: Inner = field(default_factory=Inner)
    rate: Optional[float] = None


def test_round_trip_with_paths_tuples_and_nested_configs():
    cfg = Outer(Path("/tmp/x"), Inner(5, ("b", "c")), 0.5)
    obj = to_json(cfg)
    assert obj == {"out": "/tmp/x", "inner": {"size": 5, "names": ["b", "c"]}, "rate": 0.5}
    back = Outer.from_json(obj)
    assert back.inner == cfg.inner and back.rate == 0.5 and str(back.out) == "/tmp/x"


def test_unknown_and_missing_keys_are_named():
    with pytest.raises(ConfigError, match="unknown Inner keys: colour"):
        from_json(Inner, {"size": 1, "colour": "red"})
    with pytest.raises(ConfigError, match="Outer"):
        from_json(Outer, {})
    with pytest.raises(ConfigError, match="expected a JSON object"):
        from_json(Inner, [1, 2])


def test_checks_name_the_flag():
    with pytest.raises(ConfigError, match="--size must be >= 4, got 3"):
        at_least(Inner(), {"size": 4})
    with pytest.raises(ConfigError, match=r"--amp must be one of none, bf16, got 'fp8'"):
        one_of("amp", "fp8", ("none", "bf16"))
    one_of("amp", "bf16", ("none", "bf16"))
