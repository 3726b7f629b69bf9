"""vltrain: ViLBERT- and LXMERT-style models and pretraining on vlprep feature stores.

``from vl_models import load_predictor``: a trained run's model, asked about images
(`vl_models.predict`; imported on first use, so that importing the package stays light)."""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "load_predictor":
        from vl_models.predict import load_predictor

        return load_predictor
    raise AttributeError(f"module 'vl_models' has no attribute {name!r}")
