"""Reference logits of jiasenlu/vilbert_beta's `VILBertForVLTasks` (``vilbert/vilbert.py``, the
ViLBERT paper's first code release, whose fine-tuned VQA / VCR / RefCOCO+ / Flickr30k models
the paper's Table 1 reports), for `tests/vl_models/test_published_vilbert.py`.

As `vilbert_mt.py` (whose `fill`, `inputs` and tiny `CONFIG` it uses): the fixture
(``vilbert_beta.json``) holds each key's shape and the logits of the heads its tasks read
(`task_utils.py`: VL-classifier -> ``vil_prediction``, a weight-normed ``SimpleClassifier`` of
`ANSWERS` rows; VL-logit (VCR, retrieval) -> ``vil_logit``; V-logit (RefCOCO+) ->
``vision_logit``), one forward pass (the class has no task tokens).

Made once, on CPU, with the reference code (never vendored; fetch github:jiasenlu/vilbert_beta):

    python tests/reference/vilbert_beta.py --reference /path/to/vilbert_beta
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

FIXTURE = Path(__file__).with_suffix(".json")
ANSWERS = 7  # its eval_tasks.py: num_labels = the largest of its tasks' label counts
OUTPUTS = (  # VILBertForVLTasks.forward's outputs, in order
    "vil_prediction",
    "vil_logit",
    "vil_binary_prediction",
    "vision_prediction",
    "vision_logit",
    "linguisic_prediction",
    "linguisic_logit",
)
READ = ("vil_prediction", "vil_logit", "vision_logit")


def _mt():
    spec = importlib.util.spec_from_file_location("vilbert_mt", Path(__file__).with_name("vilbert_mt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="a vilbert_beta checkout")
    args = parser.parse_args()
    mt = _mt()
    mt.stub_imports()
    sys.path.insert(0, str(args.reference))
    from vilbert.vilbert import BertConfig, VILBertForVLTasks

    config = BertConfig.from_dict(mt.CONFIG)
    config.fusion_method = "mul"
    model = VILBertForVLTasks(config, num_labels=ANSWERS).eval()
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict({k: mt.fill(k, shape) for k, shape in shapes.items()}, strict=True)
    x = mt.inputs()
    with torch.no_grad():
        out = model(x["ids"], x["feats"], x["boxes"], x["types"], x["mask"], x["image_mask"], None)
    logits = dict(zip(OUTPUTS, out))
    fixture = {"source": "github.com/jiasenlu/vilbert_beta (vilbert/vilbert.py)", "answers": ANSWERS}
    fixture.update(
        shapes=shapes,
        **{name: [[round(float(v), 6) for v in row] for row in logits[name].reshape(mt.BATCH, -1)] for name in READ},
    )
    FIXTURE.write_text(json.dumps(fixture) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
