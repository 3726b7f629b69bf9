"""Reference VQA answer normalization and soft targets of BUTD's ``tools/compute_softscore.py``
(hengyuan-hu/bottom-up-attention-vqa: the targets vilbert-multi-task's ``cache/*_target.pkl``
hold and LXMERT's README says its VQA data borrows), for `tests/vl_models/test_fidelity_data.py`.

The fixture (``butd_softscore.json`` beside this file) holds `questions` (ten annotator answers
each, drawn from `VARIANTS` by a seed: the same answer written differently, unanimous answers
that normalization changes, disagreeing ones), and what the reference's own functions make of
them: ``preprocess_answer`` of every distinct answer, the answer table ``filter_answers`` and
``create_ans2label`` build from the questions' multiple-choice answers (every one kept), and
``compute_target``'s labels and scores per question.

Made once, on CPU, with the reference code (never vendored; fetch
github:hengyuan-hu/bottom-up-attention-vqa):

    python tests/reference/butd_softscore.py --reference /path/to/bottom-up-attention-vqa

It runs the reference module unchanged; only its imports that need torch, h5py or Python 2
(``dataset``, ``utils``, ``cPickle``) are replaced by modules that do nothing (the cache files
it writes go nowhere).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import types
from collections import Counter
from pathlib import Path

FIXTURE = Path(__file__).with_suffix(".json")
SEED, QUESTIONS = 0, 300
# Groups of ways to write one answer (and some plain ones): what annotators type.
VARIANTS = [
    ["t-shirt", "T-shirt", "t shirt", "tshirt"],
    ["yes", "Yes", "yes.", "YES"],
    ["no", "No", "no!"],
    ["2", "two", "Two", "2.", "2 "],
    ["dog", "a dog", "the dog", "Dog", "dogs"],
    ["grey", "Grey!", "gray", "grey."],
    ["1000", "1,000", "1 000"],
    ["2.5", "2.5.", "2,5"],
    ["don't know", "dont know", "do not know"],
    ["10:30", "10 30", "ten thirty"],
    ["red and white", "red/white", "red & white", "red, white"],
    ["left", "(left)", "on left", "left side", "the left"],
    ["st patrick's day", "st. patrick's day", "St Patrick's Day"],
    ["hot dog", "hot-dog", "hotdog", "hot dogs"],
    ["can't tell", "cant tell", "can not tell"],
    ["none", "zero", "0", "nothing"],
    ["at&t", "at & t", "AT&T"],
    ["black", "Black", "black "],
    ["frisbee", "frisbe", "Frisbee"],
    ["isn't", "isnt", "is not"],
]


def questions() -> list[dict]:
    """VQA v2 annotations (question id, image id, ten answers, the most common as the
    multiple-choice answer): a third unanimous (one variant ten times), the rest mixing one to
    three variants of one or two groups."""
    rng = random.Random(SEED)
    out = []
    for q in range(QUESTIONS):
        group = rng.choice(VARIANTS)
        if q % 3 == 0:
            answers = [rng.choice(group)] * 10
        else:
            pool = rng.sample(group, min(len(group), rng.randint(1, 3)))
            if rng.random() < 0.4:
                pool.append(rng.choice(rng.choice(VARIANTS)))
            answers = [rng.choice(pool) for _ in range(10)]
        out.append(
            {
                "question_id": 1000 + q,
                "image_id": 1 + q // 3,
                "multiple_choice_answer": Counter(answers).most_common(1)[0][0],
                "answers": [{"answer": a, "answer_id": i + 1} for i, a in enumerate(answers)],
            }
        )
    return out


def reference_module(root: Path):
    """``tools/compute_softscore.py`` of the checkout `root`, imported with its torch / h5py /
    Python 2 imports stubbed."""
    for name in ("dataset", "utils", "cPickle"):
        stub = types.ModuleType(name)
        stub.Dictionary = object
        stub.create_dir = lambda path: None
        stub.dump = lambda obj, f: None
        sys.modules[name] = stub
    spec = importlib.util.spec_from_file_location("butd_compute_softscore", root / "tools" / "compute_softscore.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Sink:
    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, data):
        return len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="a bottom-up-attention-vqa checkout")
    args = parser.parse_args()
    butd = reference_module(args.reference)
    butd.open = _Sink  # compute_target / create_ans2label open their cache files: written nowhere
    qs = questions()
    distinct = sorted({a["answer"] for q in qs for a in q["answers"]})
    occurence = butd.filter_answers(qs, 1)
    ans2label = butd.create_ans2label(occurence, "fixture", cache_root="unused")
    label2ans = sorted(ans2label, key=ans2label.get)
    targets = butd.compute_target(qs, ans2label, "fixture", cache_root="unused")
    out = {
        "source": "github.com/hengyuan-hu/bottom-up-attention-vqa (tools/compute_softscore.py)",
        # [question_id, image_id, multiple_choice_answer, the ten answers]
        "questions": [
            [q["question_id"], q["image_id"], q["multiple_choice_answer"], [a["answer"] for a in q["answers"]]]
            for q in qs
        ],
        "preprocess_answer": {a: butd.preprocess_answer(a) for a in distinct},
        "label2ans": label2ans,
        "targets": {
            str(t["question_id"]): {label2ans[label]: score for label, score in zip(t["labels"], t["scores"])}
            for t in targets
        },
    }
    FIXTURE.write_text(json.dumps(out) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
