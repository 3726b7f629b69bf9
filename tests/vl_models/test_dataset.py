import numpy as np
import pytest
import torch
from train_helpers import VOCAB

from vl_models import families
from vl_models.config import DataSettings
from vl_models.data.dataset import PretrainDataset


@pytest.mark.parametrize("model", ["lxmert", "vilbert"])
def test_examples_have_the_model_inputs_and_targets(data, model):
    ds = PretrainDataset(
        data / "mix", [data / "feats"], VOCAB, DataSettings(max_text=12, max_regions=10), families.get(model), seed=1
    )
    assert len(ds) == 12
    slots = 11 if model == "vilbert" else 10
    ex = ds[3]
    assert ex["input_ids"].shape == (12,) and ex["visual_feats"].shape == (slots, 16)
    assert ex["visual_pos"].shape == (slots, 5 if model == "vilbert" else 4)
    again = ds[3]
    for k in ex:
        assert np.array_equal(ex[k], again[k]), k  # a function of (seed, epoch, index)
    before = [ds[i]["input_ids"] for i in range(len(ds))]
    ds.set_epoch(1)
    assert any(not np.array_equal(ds[i]["input_ids"], before[i]) for i in range(len(ds)))  # new masks per epoch
    ds.set_epoch(0)
    matched = [int(ds[i]["matched"]) for i in range(len(ds))]
    assert 0 < sum(matched) < len(ds)
    qa = [int(ds[i]["qa_label"]) for i in range(len(ds)) if ds[i]["matched"]]
    assert set(qa) <= {-1, 0, 1}
    if model == "vilbert":
        assert not ex["region_selected"][0] and ex["region_prob"].shape == (slots, 11)
        assert not (ex["region_selected"] & ~ex["visual_mask"].astype(bool)).any()  # real regions only
    else:
        assert ex["obj_ids"].shape == (slots,) and ex["original_feats"].shape == (slots, 16)


def test_dataloader_with_two_workers(data):
    ds = PretrainDataset(
        data / "mix", [data / "feats"], VOCAB, DataSettings(max_text=12, max_regions=10), families.get("lxmert")
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    batches = list(loader)
    assert sum(len(b["input_ids"]) for b in batches) == 12
    assert batches[0]["visual_feats"].shape == (4, 10, 16) and batches[0]["visual_feats"].dtype == torch.float32


def _vilbert_examples(data, epochs=4, **kw):
    settings = DataSettings(max_text=12, max_regions=kw.pop("max_regions", 10), region_prob=0.4, **kw)
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, settings, families.get("vilbert"), seed=3)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            yield ds, i, ds[i]


def _iou(boxes):
    import torchvision

    return torchvision.ops.box_iou(torch.as_tensor(boxes), torch.as_tensor(boxes)).numpy()


def test_vilbert_region_loss_is_on_the_selected_regions_only(data):
    """The KL target set is exactly the selected regions: never an unselected neighbour whose
    features the model sees (paper §3.2; the overlap set once leaked about a third)."""
    from vl_models.config import TaskConfig
    from vl_models.models.configuration import ViLBERTConfig
    from vl_models.models.modeling_vilbert import ViLBERTForPreTraining
    from vl_models.tasks import losses as L
    from vl_models.tasks.pretrain import pretrain_losses

    examples = [ex for _, _, ex in _vilbert_examples(data, epochs=2)]
    neighbours = 0
    for ds_ex in examples:
        real = ds_ex["visual_mask"].astype(bool)
        real[0] = False
        boxes = ds_ex["visual_pos"][:, :4]
        overlap = (_iou(boxes)[:, ds_ex["region_selected"]] > 0.4).any(1) & real & ~ds_ex["region_selected"]
        neighbours += int(overlap.sum())
    assert neighbours > 10  # the data has unselected neighbours the old target set took in
    batch = {k: torch.as_tensor(np.stack([ex[k] for ex in examples])) for k in examples[0]}
    torch.manual_seed(0)
    model = ViLBERTForPreTraining(
        ViLBERTConfig(
            name="t",
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=16,
            max_position_embeddings=16,
            v_feature_size=16,
            v_target_size=11,
            v_hidden_size=16,
            v_num_hidden_layers=2,
            v_num_attention_heads=2,
            v_intermediate_size=16,
            bi_hidden_size=16,
            bi_num_attention_heads=2,
            bi_intermediate_size=16,
            v_biattention_id=(0, 1),
            t_biattention_id=(0, 1),
        )
    ).eval()
    _, losses, _ = pretrain_losses(families.get("vilbert"), model, batch, TaskConfig(), epoch=0)
    selected = batch["region_selected"].bool()
    with torch.no_grad():
        out = model(
            batch["input_ids"],
            batch["visual_feats"],
            batch["visual_pos"],
            batch["attention_mask"],
            batch["visual_mask"],
            region_positions=selected,
        )
        expected, _ = L.region_kl(out.region_logits, batch["region_prob"][selected])
    assert torch.allclose(losses["region"], expected)


def test_vilbert_img_token_is_the_mean_of_the_kept_regions_after_masking(data):
    """ViLBERT's [IMG] feature is computed after masking over the regions the model sees (a
    zeroed region is not recoverable as N*IMG - sum(visible)), and only over the regions
    within max_regions."""
    seen_masked = 0
    for ds, i, ex in _vilbert_examples(data, max_regions=4):
        feats, real = ex["visual_feats"], ex["visual_mask"].astype(bool)
        n = int(real.sum())
        regions = feats[1:n]
        zeroed = ~regions.any(axis=1)  # random features are never all zero
        seen_masked += int(zeroed.sum())
        visible = regions[~zeroed]
        expected = visible.mean(0) if len(visible) else np.zeros(feats.shape[1], np.float32)
        np.testing.assert_allclose(feats[0], expected, rtol=1e-5, atol=1e-6)
        unmasked = ds.image(int(ds.rows[i]))["visual_feats"]  # evaluation: no masking, the first 4 regions
        np.testing.assert_allclose(unmasked[0], unmasked[1:n].mean(0), rtol=1e-5, atol=1e-6)
    assert seen_masked > 5


def test_vilbert_12in1_variant_zeroes_overlapping_regions_too(data):
    """`region_overlap="zero"` (12-in-1's `image_feat[masked_label] = 0`): every selected region
    and the regions overlapping one by IoU > 0.4 are zeroed, but the loss set stays the selected
    regions."""
    zeroed_neighbours = 0
    for _, _, ex in _vilbert_examples(data, epochs=2, region_overlap="zero"):
        feats, real = ex["visual_feats"], ex["visual_mask"].astype(bool)
        real[0] = False
        selected = ex["region_selected"]
        neighbour = (_iou(ex["visual_pos"][:, :4])[:, selected] > 0.4).any(1) & real & ~selected
        assert not feats[neighbour].any() and not feats[selected].any()
        zeroed_neighbours += int(neighbour.sum())
    assert zeroed_neighbours > 10
    with pytest.raises(Exception, match="--region-overlap must be one of keep, zero"):
        DataSettings(region_overlap="sometimes")
    with pytest.raises(Exception, match="lxmert supports keep"):
        PretrainDataset(
            data / "mix", [data / "feats"], VOCAB, DataSettings(region_overlap="zero"), families.get("lxmert")
        )


@pytest.mark.parametrize("model", ["lxmert", "vilbert"])
def test_pair_texts_captions_leaves_questions_out_of_the_pair_task(data, model):
    """--pair-texts captions: a question keeps its own text and has no pair label (-1, ignored
    by the loss, so ViLBERT's 0 = aligned flip keeps it -1); a caption's negatives are captions
    of other images. The default (all) is both references': questions are pair texts too."""
    from vl_models.tasks.losses import pair_classification

    settings = DataSettings(max_text=12, max_regions=10, pair_texts="captions")
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, settings, families.get(model), seed=1)
    kinds = ds.mixture.kinds
    ref = PretrainDataset(
        data / "mix", [data / "feats"], VOCAB, DataSettings(max_text=12, max_regions=10), families.get(model), seed=1
    )
    assert any(int(ref[i]["matched"]) == 0 and kinds[ref.rows[i]] == "question" for i in range(len(ref)))
    encoded = {int(r): ds.tokenizer.encode(ds.mixture.text(int(r)), 12).ids for r in ds.rows}
    captions = [ids for r, ids in encoded.items() if kinds[r] == "caption"]
    seen = {}
    for epoch in range(4):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            ex, kind = ds[i], kinds[ds.rows[i]]
            seen.setdefault(kind, set()).add(int(ex["matched"]))
            if kind == "question":
                own = encoded[int(ds.rows[i])]
                keep = ex["lm_labels"] >= 0
                assert np.array_equal(np.where(keep, ex["lm_labels"], ex["input_ids"]), own)  # its own text
                assert int(ex["qa_label"]) >= 0  # and its answer
            elif int(ex["matched"]) == 0:
                shown = np.where(ex["lm_labels"] >= 0, ex["lm_labels"], ex["input_ids"])
                assert any(np.array_equal(shown, c) for c in captions)  # a caption swapped in
    assert seen == {"question": {-1}, "caption": {0, 1}}
    batch = torch.utils.data.default_collate([ds[i] for i in range(len(ds))])
    family = families.get(model)
    mcfg = family.fit(families.load_config(f"{model}-tiny"), ds.stores[0].layout, 3, "feats")
    loss = family.losses(family.build(mcfg), batch, True, "none")[0]
    pair = "matching" if model == "lxmert" else "alignment"
    assert torch.isfinite(loss[pair])
    logits = torch.zeros(3, 2, requires_grad=True)
    _, metrics = pair_classification(logits, torch.tensor([-1, 1, 0]), pair)
    assert metrics[f"{pair}_acc"] == 0.5  # the -1 row is not counted


def test_evaluation_scores_questions_that_have_no_pair_label(data):
    """With --pair-texts captions a question's pair label is -1, yet it is its own text: the
    QA score counts it (only swapped texts, label 0, are left out)."""
    from vl_models.eval.evaluate import evaluate

    family = families.get("lxmert")
    settings = DataSettings(max_text=12, max_regions=10, pair_texts="captions")
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, settings, family, seed=1)
    torch.manual_seed(0)
    model = family.build(family.fit(families.load_config("lxmert-tiny"), ds.stores[0].layout, 3, "feats"))
    result = evaluate(family, model, ds, batch_size=4, retrieval_images=2)
    assert 0.0 <= result["eval_qa_score"] <= 1.0 and 0.0 <= result["eval_matching_acc"] <= 1.0
