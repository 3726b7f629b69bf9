"""vltrain: ViLBERT- and LXMERT-style models and pretraining on vlprep feature stores."""

__version__ = "0.1.0"
