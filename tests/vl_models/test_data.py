import numpy as np
from train_helpers import VOCAB

from vl_models import families
from vl_models.data.masking import mask_regions, mask_tokens, mismatch, overlapping
from vl_models.data.tokenize import WordPiece


def test_wordpiece_encoding():
    tok = WordPiece(VOCAB)
    enc = tok.encode("A small red circle left of a blue square", max_length=20)
    assert enc.ids[0] == tok.cls_id and tok.sep_id in enc.ids and enc.ids[-1] == tok.pad_id
    n = int(enc.mask.sum())
    assert enc.ids[n - 1] == tok.sep_id and enc.special[:n].sum() == 2 and enc.special[n:].all()
    short = tok.encode("word " * 50, max_length=8)
    assert short.mask.sum() == 8 and short.ids[-1] == tok.sep_id


def test_token_masking_statistics_and_special_tokens():
    tok = WordPiece(VOCAB)
    rng = np.random.default_rng(0)
    enc = tok.encode(" ".join(["picture"] * 60), max_length=64)
    chosen = masked = randomized = kept = 0
    for _ in range(2000):
        ids, labels = mask_tokens(enc.ids, enc.special, rng, tok.vocab_size, tok.mask_id)
        sel = labels != -1
        assert not (sel & enc.special).any()  # [CLS]/[SEP]/[PAD] never selected
        assert (ids[enc.special] == enc.ids[enc.special]).all()
        chosen += sel.sum()
        masked += (ids[sel] == tok.mask_id).sum()
        kept += (ids[sel] == enc.ids[sel]).sum()
        randomized += ((ids[sel] != tok.mask_id) & (ids[sel] != enc.ids[sel])).sum()
    real = (~enc.special).sum() * 2000
    assert abs(chosen / real - 0.15) < 0.01
    assert (
        abs(masked / chosen - 0.8) < 0.02 and abs(kept / chosen - 0.1) < 0.02 and abs(randomized / chosen - 0.1) < 0.02
    )


def test_region_masking_rates_per_model():
    rng = np.random.default_rng(1)
    counts = {"vilbert": np.zeros(3), "lxmert": np.zeros(3)}
    selected = 0
    for style in counts:
        for _ in range(4000):
            m = mask_regions(40, 36, rng, families.get(style).region_masking)
            assert not m.selected[36:].any()
            selected += m.selected.sum()
            counts[style] += [m.selected.sum(), m.zeroed.sum(), m.replaced.sum()]
    v, lx = counts["vilbert"], counts["lxmert"]
    assert abs(v[0] / (4000 * 36) - 0.15) < 0.01 and abs(v[1] / v[0] - 0.9) < 0.02 and v[2] == 0
    assert abs(lx[1] / lx[0] - 0.8) < 0.02 and abs(lx[2] / lx[0] - 0.1) < 0.02


def test_overlapping_and_mismatch():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [5, 0, 15, 10]], np.float32)
    # IoU(0, 1) = 81/119 > 0.4; IoU(0, 3) = 50/150 < 0.4; the selected region itself is not "overlapping"
    assert overlapping(boxes, np.array([True, False, False, False])).tolist() == [False, True, False, False]
    rng = np.random.default_rng(2)
    assert abs(np.mean([mismatch(rng) for _ in range(4000)]) - 0.5) < 0.03
