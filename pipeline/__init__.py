"""vlprep: region-feature extraction and data preparation for vision-and-language pretraining."""

__version__ = "0.1.0"
