"""The region-feature store: sharded Arrow IPC or LMDB files plus a manifest.

    from pipeline.store import FeatureStore, FeatureStoreWriter

    with FeatureStoreWriter("feats", backend="arrow", shard_size=1000) as w:
        w.write(record)                      # a pipeline.records.RegionFeatures
    store = FeatureStore.open("feats")       # verify=True: also each shard's sha256, on first use
    rec = store["COCO_val2014_000000000042"]  # or store.get(...); `in`, len(), keys() too
    buf = store.region_buffer(32, 36)        # a batch's padded arrays, allocated once
    store.get_many_into(ids, buf).batch()    # -> RegionBatch, equal to pad_regions(store.get_many(ids), 36)

One writer at a time (a second one gets BusyError); damage is a StoreError naming the
shard. The on-disk format is documented in docs/store-format.md.
"""

from pipeline.store.buffer import RegionBuffer
from pipeline.store.layout import ProbStorage, StoreLayout
from pipeline.store.manifest import Manifest, ShardInfo
from pipeline.store.store import FeatureStore, FeatureStoreWriter, write_records
from pipeline.store.verify import VerifyReport, describe_store, verify_store

__all__ = [
    "FeatureStore",
    "FeatureStoreWriter",
    "Manifest",
    "ProbStorage",
    "RegionBuffer",
    "ShardInfo",
    "StoreLayout",
    "VerifyReport",
    "describe_store",
    "verify_store",
    "write_records",
]
