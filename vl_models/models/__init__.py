"""Vision-and-language models, one per file: `modeling_lxmert.py` (LXMERT) and
`modeling_vilbert.py` (ViLBERT), on the BERT blocks of `layers.py`. Named JSON configs in
`model_configs/` (including `*-tiny` ones for tests); weights in and out in `weights.py`."""
