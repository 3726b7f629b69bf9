"""`vlprep demo`: the whole pipeline on the embedded shapes world, offline, on CPU.

1. writes a shapes world (`pipeline.synthetic`) and serves its images on 127.0.0.1;
2. `vlprep extract --dataset conceptual_captions` on its CC-style TSVs through the real
   download path, with the committed tiny shapes detector, into a feature store;
3. `vlprep build-mixture`: COCO-style captions + VQA-style questions (renamed to the store's
   ids by the world's image map), held-out scenes as the val split — LXMERT's mixture; ViLBERT's
   has the captions alone, as Conceptual Captions has;
4. with transfer (the seeds' Table 1 in miniature; `--no-transfer` skips it), `vlprep
   build-task` on the world's VQA, NLVR2, Flickr30k, RefCOCO+ and VCR files;
5. per model family, the families side by side in processes of their own where there are
   cores for it (`--jobs`): `vltrain pretrain` of small ViLBERT or LXMERT (64 wide, from
   scratch, initialized at their width's scale), every task on from step 0, the image-text
   alignment / matching loss at weight 3; zero-shot caption -> image retrieval on held-out
   scenes for the pretrained model and the same model untrained, and LXMERT's QA score; with
   transfer, `vltrain finetune` on each task from the pretraining run and from scratch: the
   same model config, vocab, short budget (steps, batch, learning rate) and seeds, validated
   on the task's val / dev split, the best score of each run kept;
6. `report.json`, `report.md`, `scenes.png` (detections, as `vlprep show` draws them) and
   the training curves.

One module per concern:

    config     DemoConfig, the presets, the model families' names and mixtures, the budgets
    stages     the data stages: world, extraction, mixtures (`mixture_spec`), task datasets
    families   one model family's pretraining, evaluation and fine-tuning; the families
               side by side in processes
    ask        the fine-tuned models asked about a held-out scene (`vltrain predict`)
    report     the pictures and report.md
    run        `run_demo`: the stages in order, timed, and the report
    command    the `vlprep demo` command and `register`

The demo orchestrates both packages, so it lives above them (imports run one way: `pipeline`
never imports `vl_models`). It reaches the `vlprep` command line as a plugin: the entry point
``demo = "vl_models.demo:register"`` of the group ``vlprep.commands`` (pyproject.toml), which
`pipeline.cli` loads when it starts. `vlprep` so imports this package at every start: its
modules import their torch-, Ray- and Arrow-heavy modules inside the functions that run them.

The names below are the package's front door (the tests and benches use them).
"""

from vl_models.demo.command import register
from vl_models.demo.config import (
    MIXTURE_KINDS,
    MIXTURES,
    MODELS,
    TRANSFER_FILES,
    TRANSFER_STEPS,
    VQA_MIN_COUNT,
    DemoConfig,
)
from vl_models.demo.families import finetune
from vl_models.demo.report import markdown
from vl_models.demo.run import run_demo
from vl_models.demo.stages import build_task_datasets, extract_features, make_mixture, mixture_spec

__all__ = [
    "MIXTURES",
    "MIXTURE_KINDS",
    "MODELS",
    "TRANSFER_FILES",
    "TRANSFER_STEPS",
    "VQA_MIN_COUNT",
    "DemoConfig",
    "build_task_datasets",
    "extract_features",
    "finetune",
    "make_mixture",
    "markdown",
    "mixture_spec",
    "register",
    "run_demo",
]
