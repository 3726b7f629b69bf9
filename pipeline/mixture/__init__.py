"""Pretraining mixtures: `build` writes one from a spec (`vlprep build-mixture`), `mixture`
holds the format's schema and its reader (`Mixture.open`), `sources` makes text items from
the source files. The folder, its writer and the answer table are `pipeline.items`'."""

from pipeline.mixture.mixture import Mixture

__all__ = ["Mixture"]
