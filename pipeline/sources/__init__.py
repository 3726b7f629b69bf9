"""Readers of the official source file formats: one reader per format, used by the image
lists of `pipeline.datasets` (what `vlprep download` / `extract` fetch) and the text items
of `pipeline.mixture` (what `vlprep build-mixture` writes) alike.

Each reader turns a file into plain records in file order — the format's facts (ids, image
names, texts, answers as given), nothing about downloading or mixtures — under the rules of
`pipeline.sources.base`: malformed rows are `Malformed` (file:line or file:position, reason),
null and blank texts and null answers are `Skip`s, texts are whitespace-normalized.

    coco                 COCO captions_*.json (images, captions); COCO image names
    visual_genome        VG image_data.json, region_descriptions.json, question_answers.json
    vqa                  VQA v2 questions + annotations
    gqa                  GQA balanced questions
    lxmert               LXMERT's preprocessed pretraining json
    conceptual_captions  the CC3M TSV
    jsonstream           streaming JSON (members of a huge array or object)

URL lists, NLVR2's and Flickr30k's files and image folders are read by their
`pipeline.datasets` module alone (nothing else reads them), with the same rules.
"""

from pipeline.sources.base import Malformed, Skip, clean_text, text_or_skip

__all__ = ["Malformed", "Skip", "clean_text", "text_or_skip"]
