"""Readers of the official source file formats: one reader per format, used by the image
lists of `pipeline.datasets` (what `vlprep download` / `extract` fetch), the text items
of `pipeline.mixture` (what `vlprep build-mixture` writes) and the downstream tasks' data
(`vlprep build-task`) alike.

Each reader turns a file into plain records in file order — the format's facts (ids, image
names, texts, answers as given), nothing about downloading or mixtures — under the rules of
`pipeline.sources.base`: malformed rows are `Malformed` (file:line or file:position, reason),
null and blank texts and null answers are `Skip`s, texts are whitespace-normalized.

    coco                 COCO captions_*.json (images, captions); COCO image names
    visual_genome        VG image_data.json, region_descriptions.json, question_answers.json
    vqa                  VQA v2 questions + annotations; test-dev / test questions alone
    gqa                  GQA questions (balanced, all; test and submission files without answers)
    lxmert               LXMERT's preprocessed pretraining json
    conceptual_captions  the CC3M TSV
    nlvr2                NLVR2's JSON lines (URL and image releases)
    karpathy             the Karpathy splits dataset_flickr30k.json / dataset_coco.json
    refcoco              RefCOCO / RefCOCO+ / RefCOCOg refs pickles + their instances.json
    vcr                  VCR's JSON lines (tags rendered as names) and per-image metadata
    image_ids            lists of image ids (.npy arrays, text): 12-in-1's clean_datasets files
    jsonstream           streaming JSON (members of a huge array or object)
    jsonlines            JSON-lines files (one value a line)

URL lists, Flickr30k's token file and image folders are read by their `pipeline.datasets`
module alone (nothing else reads them), with the same rules.
"""

from pipeline.sources.base import Malformed, Skip, clean_text, text_or_skip

__all__ = ["Malformed", "Skip", "clean_text", "text_or_skip"]
