"""Vision-and-language models, one per file: `modeling_lxmert.py` (LXMERT). Named JSON
configs in `model_configs/` (including `*-tiny` ones for tests)."""
