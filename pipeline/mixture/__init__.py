"""Pretraining mixtures: `build` writes one from a spec (`vlprep build-mixture`), `mixture`
owns the format and its reader (`Mixture.open`), `sources` makes text items from the
source files, `answers` normalizes answers and makes the answer table."""

from pipeline.mixture.mixture import Mixture

__all__ = ["Mixture"]
