"""Transfer: fine-tuning and evaluating on the seeds' downstream tasks (`vltrain finetune`,
`vltrain evaluate`, `vlprep build-task`).

The registry of tasks (`task.Task`), found by name:

    vqa, gqa                      answer classifiers         vqa.py, gqa.py
    nlvr2                         pair classifier            nlvr2.py
    flickr30k, coco-retrieval     pair score, 4-way          retrieval.py
    refcoco+, refcoco, refcocog   per-region scorer          refcoco.py
    vcr-q2a, vcr-qa2r, vcr        4-way choice (Q->A; QA->R; vcr.py
                                  both, scored as Q->AR)

Adding a task is one module that defines a `Task` and calls `register`. The rest of the
package: `heads` (head kinds and their losses, `TransferModel`), `dataset` (the examples),
`build` (task datasets from official files), `evaluate` (predictions, official metrics,
submissions), `finetune` (the trainer's transfer job).
"""

from __future__ import annotations

from pipeline.registry import Registry
from vl_models.transfer import gqa, nlvr2, refcoco, retrieval, vcr, vqa
from vl_models.transfer.task import Task

_TASKS: Registry[Task] = Registry("task")
register, unregister, names, get = _TASKS.register, _TASKS.unregister, _TASKS.names, _TASKS.get

for _task in (
    vqa.TASK,
    gqa.TASK,
    nlvr2.TASK,
    retrieval.FLICKR30K,
    retrieval.COCO,
    refcoco.REFCOCO_PLUS,
    refcoco.REFCOCO,
    refcoco.REFCOCOG,
    vcr.TASK,
    vcr.Q2A_TASK,
    vcr.QA2R_TASK,
):
    register(_task)
