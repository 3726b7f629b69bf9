"""`vlprep serve`: a local web page to look at feature stores, task datasets, mixtures and runs,
and to ask a run's model about an image.

    vlprep serve vlprep_demo/features --tasks vlprep_demo --runs vlprep_demo --images vlprep_demo/world

A Starlette app served by uvicorn, its pages rendered on the server with Jinja2 (no build step,
no JavaScript framework: one small script highlights regions on hover). The pieces:

- `site`: what is served: the stores, task datasets / mixtures and runs found under the given
  folders, each under a name of its own (a URL never carries a path);
- `gallery`: a store's pages and filters, reading only the records a page shows (a filtered
  page scans a bounded window of records and says where it stopped);
- `images`: image files of store ids, found only under the ``--images`` roots (a folder, our
  image shards, or the store's dataset files: URL paths under a root), thumbnails, and the
  checks an upload passes (the downloader's: size cap, sniffing, decompression bombs);
- `items`: a task's or mixture's items of one image (vectorized over the mapped items);
- `runs`: a run's config, checkpoints, validation metrics and curves (`vltrain plot`'s);
- `ask`: `load_predictor` per run, one query at a time (the predictor's feature cache is shared);
- `app`: the routes, error pages and headers; `command`: the command line.

Imports run one way: this package uses `pipeline` and `vl_models` and nothing imports it; it
reaches `vlprep` through the ``vlprep.commands`` entry point. Starlette, uvicorn and Jinja2 are
the ``serve`` extra (``pip install vlprep[serve]``); nothing else of the tool needs them.
"""
