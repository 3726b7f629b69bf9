"""The item-folder format, shared by pretraining mixtures (`pipeline.mixture`) and task
datasets (`pipeline.task_data`): one home for the folder, its writer and its reader.

An item folder holds ``items.arrow`` (one row per text item, in the Arrow IPC file format,
memory-mappable; each format has its own schema), ``answers.json`` (``{"answers": [...]}``:
the answer table, answer id = position; ``[]`` without one), ``report.md`` (for people),
any files of the format's own, and ``manifest.json`` (``"format"`` names the kind,
``"schema_version"`` its version, ``"contents"`` the size and sha256 of items.arrow,
answers.json and the format's own files), written last: a folder without it is no item folder.

- `folder`: the file names, `folder_manifest`, `content_digests`, and `ItemsFolder`, the
  reader both formats build on (`Mixture.open`, `TaskData.open`; `verify_contents` checks
  the recorded digests: `TaskData.open` does);
- `writer`: `ItemsWriter`, which streams the items and writes the other files, manifest last;
- `answers`: answer normalization (the official VQA evaluator's; with LXMERT's pretraining
  rules on top for mixtures), soft scores, the answer table (top-K or at least N
  occurrences) and fixed tables read from the seeds' label files;
- `image_map`: the ``source id<TAB>store key`` files that join items to feature stores;
- `inputs`: the builders' input files, refused by name unless each is a regular file.
"""

from pipeline.items.folder import ANSWERS_FILE, ITEMS_FILE, MANIFEST_FILE, REPORT_FILE, ItemsFolder, folder_manifest
from pipeline.items.writer import ItemsWriter

__all__ = [
    "ANSWERS_FILE",
    "ITEMS_FILE",
    "MANIFEST_FILE",
    "REPORT_FILE",
    "ItemsFolder",
    "ItemsWriter",
    "folder_manifest",
]
