import math

import torch
import torch.nn.functional as F

from vl_models.data.masking import sample_answer
from vl_models.tasks.losses import (
    LxmertVisualTargets,
    lxmert_visual,
    masked_lm,
    pair_classification,
    qa,
    region_kl,
    total,
)


def test_masked_lm_ignores_minus_one_and_is_safe_when_empty():
    logits = torch.randn(2, 5, 11)
    labels = torch.full((2, 5), -1)
    loss, m = masked_lm(logits, labels)
    assert loss.item() == 0.0 and math.isnan(m["mlm_acc"])
    labels[0, 1], labels[1, 3] = 4, 7
    loss, _ = masked_lm(logits, labels)
    expected = F.cross_entropy(torch.stack([logits[0, 1], logits[1, 3]]), torch.tensor([4, 7]))
    torch.testing.assert_close(loss, expected)


def test_region_kl_normalized_by_masked_count_and_safe():
    logits = torch.randn(2, 4, 6)
    target = torch.softmax(torch.randn(2, 4, 6), -1)
    none = torch.zeros(2, 4, dtype=torch.bool)
    assert region_kl(logits[none], target[none])[0].item() == 0.0
    sel = none.clone()
    sel[0, 2] = sel[1, 0] = True
    loss, _ = region_kl(logits[sel], target[sel])
    manual = (
        sum(F.kl_div(F.log_softmax(logits[i, j], -1), target[i, j], reduction="sum") for i, j in ((0, 2), (1, 0))) / 2
    )
    torch.testing.assert_close(loss, manual)
    perfect, _ = region_kl(torch.log(target)[sel], target[sel])
    assert perfect.abs().item() < 1e-6


def test_lxmert_visual_weighting_modes():
    g = torch.Generator().manual_seed(0)
    b, n = 2, 4
    t = LxmertVisualTargets(
        obj_ids=torch.randint(0, 5, (b, n), generator=g),
        obj_conf=torch.rand(b, n, generator=g),
        attr_ids=torch.randint(0, 3, (b, n), generator=g),
        attr_conf=torch.rand(b, n, generator=g),
        features=torch.rand(b, n, 8, generator=g),
        selected=torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool),
        real=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool),
    )
    obj, attr, feat = (
        torch.randn(b, n, 5, generator=g),
        torch.randn(b, n, 3, generator=g),
        torch.rand(b, n, 8, generator=g),
    )
    conf, _ = lxmert_visual(obj, attr, feat[t.selected], t, "confidence")
    masked, _ = lxmert_visual(obj, attr, feat[t.selected], t, "masked")
    ce = F.cross_entropy(obj.reshape(-1, 5), t.obj_ids.reshape(-1), reduction="none")
    torch.testing.assert_close(conf["obj"], (ce * (t.obj_conf * t.real).reshape(-1)).mean() * 6.67)
    torch.testing.assert_close(masked["obj"], (ce * t.selected.float().reshape(-1)).mean() * 6.67)
    torch.testing.assert_close(conf["feat"], masked["feat"])  # features: masked boxes in both modes
    l1 = F.smooth_l1_loss(feat, t.features, reduction="none").mean(-1)
    torch.testing.assert_close(conf["feat"], (l1 * t.selected).mean() * 6.67)


def test_pair_labels_qa_and_total():
    logits = torch.tensor([[3.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    loss, m = pair_classification(logits, torch.tensor([0, 1, -1]), "align")
    assert m["align_acc"] == 1.0 and loss.item() < 0.1
    off, _ = qa(torch.randn(2, 9), torch.tensor([1, 2]), active=False)
    assert off.item() == 0.0
    g = torch.Generator().manual_seed(0)
    draws = [sample_answer([3, 7], [1.0, 0.3], g) for _ in range(2000)]
    assert abs(draws.count(7) / 2000 - 0.3 / 1.3) < 0.03 and sample_answer([], [], g) == -1
    assert total({"a": torch.tensor(1.0), "b": torch.tensor(2.0)}, {"b": 0.5}).item() == 2.0
