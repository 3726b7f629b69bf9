"""What every extraction backend provides (`Backend`), and what it builds (`Extractor`).

A backend is one family of feature extractors with its own reference code: its architecture
config (`config_cls`, named JSON configs in `config_dir`), the weight layouts it reads strictly,
its preprocessing, and how it turns a network's outputs into regions (box selection for a
detector, cells for a grid). Everything outside the backend (`vlprep extract`'s actors and its
weights check, `vltrain predict`'s replay of a store's detector, the benches, the shapes world)
goes through `pipeline.detect.backends` (`resolve`, `load_model`, `build_extractor`) and never
into a backend's modules.

The torch-free half (`Backend`'s checks and descriptions) is what `ExtractConfig` and the CLI
use; `load`, `random_model` and `extractor` import torch and the backend's model code lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Protocol, Sequence

from pipeline.config import one_of
from pipeline.detect.config import SelectionConfig
from pipeline.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from pipeline.detect.config import ExtractConfig
    from pipeline.records import RegionFeatures


class Extractor(Protocol):
    """Images in, `RegionFeatures` out: a batch of (H, W, 3) uint8 RGB images and their ids;
    `given_boxes` (per image, (N, 4) x1y1x2y2 original pixels, or None) where the backend
    extracts features for given boxes. `thread_invariant`: whether its outputs are the same bit for
    bit at any CPU thread count (then `threads` sets how many it uses; see `pipeline.detect.cpu`)."""

    device: Any
    thread_invariant: bool
    threads: Optional[int]

    def __call__(
        self,
        images: Sequence["np.ndarray"],
        image_ids: Sequence[str],
        given_boxes: Optional[Sequence[Optional["np.ndarray"]]] = None,
    ) -> list["RegionFeatures"]: ...


@dataclass
class LoadReport:
    """What loading a weights file found: its layout, digest and tensor count; the tolerated
    differences, each named (`dropped` keys, FrozenBN statistics filled with identity,
    `unused` keys of heads the backend does not run); whether it had an attribute head."""

    path: str
    layout: str
    sha256: str
    tensors: int
    identity_norm_stats: int = 0
    dropped: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    attributes: bool = True


@dataclass(frozen=True)
class Detector:
    """A backend and one of its architecture configs: what ``--detector`` names, and what a
    store's provenance records (``{"backend", "config"}``) to build the same extractor again."""

    backend: "Backend"
    config: Any  # the backend's `config_cls`

    @property
    def name(self) -> str:
        return self.config.name

    def to_json(self) -> dict:
        return {"backend": self.backend.name, "config": self.config.to_json()}


class Backend:
    """One family of extractors; subclasses set the class attributes and the three builders."""

    name: ClassVar[str]  # "butd-c4"
    title: ClassVar[str]  # one line: what it is, after which reference
    config_cls: ClassVar[type]
    config_dir: ClassVar[Path]
    regions: ClassVar[str] = "detections"  # or "grid": cells of a feature map, in row-major order
    policies: ClassVar[tuple[str, ...]] = ()  # the selection policies it implements
    default_selection: ClassVar[Optional[SelectionConfig]] = None
    preprocess_modes: ClassVar[tuple[str, ...]]  # the first is the default
    weights_help: ClassVar[str]  # where its published weights come from
    given_boxes: ClassVar[bool] = False  # whether it extracts features for given boxes
    labelmap: ClassVar[bool] = False  # whether it reads a label map (--labelmap)

    # -- configs --------------------------------------------------------------------------

    def config_names(self) -> list[str]:
        return sorted(p.stem for p in self.config_dir.glob("*.json"))

    def config_from_json(self, obj: dict) -> Any:
        return self.config_cls.from_json(obj)

    def feature_dim(self, cfg: Any) -> int:
        return cfg.feature_dim

    def attributes(self, cfg: Any) -> bool:
        """Whether `cfg`'s detector predicts attributes (a grid has no labels at all)."""
        return bool(getattr(cfg, "num_attributes", 0))

    # -- what a run may ask of it (torch-free; ExtractConfig calls these) ------------------

    def check_preprocess(self, mode: Optional[str]) -> str:
        """The resize convention: `mode`, or the backend's own when None."""
        if mode is None:
            return self.preprocess_modes[0]
        one_of("preprocess", mode, self.preprocess_modes)
        return mode

    def check_selection(self, selection: SelectionConfig) -> Optional[SelectionConfig]:
        """`selection` with the backend's defaults filled in (None for a grid, which selects
        nothing); a policy it does not implement, or a field that means nothing to it, is a
        ConfigError naming the flag."""
        if self.default_selection is None:
            given = [name for name, value in selection.to_json().items() if value is not None]
            if given:
                raise ConfigError(
                    f"--detector {self.name}: a {self.regions} backend selects no regions, so "
                    f"{', '.join('--' + n.replace('_', '-') for n in given)} mean nothing here"
                )
            return None
        resolved = selection.resolved(self.default_selection)
        if resolved.policy not in self.policies:
            raise ConfigError(
                f"--policy {resolved.policy} is not a {self.name} policy (it has: {', '.join(self.policies)})"
            )
        return resolved

    def check_options(self, cfg: "ExtractConfig", config: Any) -> None:
        """Refuse the options of other backends by name (--given-boxes, --grid-pool, --labelmap);
        `config` is the run's architecture config."""
        if cfg.given_boxes is not None and not self.given_boxes:
            raise ConfigError(f"--given-boxes: the {self.name} backend extracts no features for given boxes")
        if cfg.grid_pool is not None and self.regions != "grid":
            raise ConfigError(f"--grid-pool is for grid backends; {self.name} extracts {self.regions}")
        if cfg.labelmap is not None and not self.labelmap:
            raise ConfigError(f"--labelmap: the {self.name} backend reads no label map")

    def take_options(self, options: dict, *names: str) -> dict:
        """The given (not None) `options` among `names`; another one given is a TypeError naming
        it (a caller's typo, not a user's: the CLI checks options with `check_options`)."""
        unknown = sorted(k for k, v in options.items() if k not in names and v is not None)
        if unknown:
            raise TypeError(f"the {self.name} extractor takes no {', '.join(unknown)}")
        return {k: v for k, v in options.items() if k in names and v is not None}

    def label_names(self, config: Any, labelmap: Path) -> dict:
        """What a store records of a label map (``--labelmap``): its file, sha256 and the names of
        ``objects_id`` and ``attrs_id`` (0-based, the background / "no attribute" left out)."""
        raise ConfigError(f"--labelmap: the {self.name} backend reads no label map")

    def max_regions(self, config: Any, selection: Optional[SelectionConfig], options: dict) -> Optional[int]:
        """The most regions a record of this run can have (a store records it as ``max_regions``):
        the selection's maximum box count for a detector."""
        return selection.boxes.max if selection is not None else None

    def describe_selection(self, selection: Optional[SelectionConfig], options: dict) -> str:
        """The store's ``box_policy`` provenance (an identity key) for a resolved selection and
        the run's backend options (``grid_pool``)."""
        return selection.describe()

    # -- builders (torch) -------------------------------------------------------------------

    def load(self, cfg: Any, path: Path) -> tuple[Any, LoadReport]:
        """The model for `cfg` filled from the weights file `path`, strictly (every tensor used
        or named in the report, every parameter filled), and the report; a file of another
        layout or backend is a ConfigError that says which."""
        raise NotImplementedError

    def random_model(self, cfg: Any) -> Any:
        """An untrained model for `cfg` (the caller seeds torch)."""
        raise NotImplementedError

    def extractor(
        self,
        model: Any,
        *,
        selection: Optional[SelectionConfig],
        preprocess: str,
        device: str,
        fp16: bool,
        options: dict,
    ) -> Extractor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<extraction backend {self.name}>"
