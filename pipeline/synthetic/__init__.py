"""The shapes world: a deterministic synthetic vision-and-language data set (offline demo data).

Scenes of 1-6 coloured shapes on varied backgrounds, drawn with PIL, and language that is
true of each scene, generated from templates: captions, VQA-style question-answer pairs with
10 annotator answers, unambiguous referring expressions with their boxes, NLVR2-style
statements about pairs of scenes and Visual Genome-style region descriptions. `write_world`
writes it all in the official file formats our readers take (Conceptual Captions TSVs, COCO
captions, VQA v2, NLVR2, VG region descriptions) plus detector
ground truth, and the transfer tasks' files (Flickr30k retrieval in the Karpathy format,
RefCOCO+, VCR). The same seed gives byte-identical files. `vlprep make-shapes` writes one.

One module per concern, each importing only those above it:

    scenes       the vocabulary, scene types, scene sampling, scenes as JSON
    render       a scene as an RGB image
    words        what the language templates share (phrases, relations, sampling)
    captions, questions, referring, statements, regions
                 the template families: captions; VQA questions and annotator answers;
                 referring expressions; NLVR2 statements about scene pairs; VG region
                 descriptions
    tasks        the transfer tasks' files (Flickr30k, RefCOCO+, VCR) from what the splits drew
    world        the files on disk (`write_world`, `write_cc_tsvs`, `load_scenes`; layout there)
    served       a world served on 127.0.0.1 for the real download path (`served`)

The names below are the package's front door; the rest is imported from its module.
"""

from pipeline.synthetic.render import render
from pipeline.synthetic.scenes import Background, Scene, SceneObject, attribute_names, generate_scene, object_names
from pipeline.synthetic.served import served
from pipeline.synthetic.world import load_scenes, write_cc_tsvs, write_world

__all__ = [
    "Background",
    "Scene",
    "SceneObject",
    "attribute_names",
    "generate_scene",
    "load_scenes",
    "object_names",
    "render",
    "served",
    "write_cc_tsvs",
    "write_world",
]
