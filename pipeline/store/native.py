"""Compiled kernels of batched reads (numba, compiled on first use and cached on disk).

A batch read from Arrow shards is a few hundred small copies (every field of every record)
and a few dozen id look-ups. Done from Python, each costs a fraction of a microsecond of
interpreter work beside its copy; here a batch is one native call:

- `gather_rows`: hashes each id (`pipeline.store.index.id_hash`, recomputed here), probes
  the index, confirms that each row found holds its id (byte comparison in the shard's
  map), then copies every field of every record from the map into the batch buffer's rows
  (a memcpy where the dtypes agree; int32 -> int64 ids and float16 <-> float32 values
  converted on the way), fills the rows of an absent field with its padding, clears what a
  previous, larger image left behind, and reports each image's size and region count. It
  works on addresses: the shard tables and maps stay where the readers keep them, open
  for the store's life in the process.
- `probe`: the index's linear probing alone, for a batch of hashes (`IdIndex.find`, which
  the Python gather uses).

`pipeline.store.store.FeatureStore.get_many_into` uses `gather_rows` for Arrow stores and
falls back to the Python gather (`pipeline.store.batch.Gather`) for the rest; both fill a
buffer byte for byte the same (tests/pipeline/test_native_gather.py).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pipeline.store.batch import COPY, HALF_TO_SINGLE, PAD_ZERO, WIDEN_INT32


def _pointer_to(nbtype):
    @intrinsic
    def pointer(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return types.CPointer(nbtype)(types.int64), codegen

    return pointer


_int64_at, _int32_at, _uint8_at = _pointer_to(types.int64), _pointer_to(types.int32), _pointer_to(types.uint8)


@intrinsic
def _prefetch(typingctx, address):
    """A hint to bring the cache line at `address` in (LLVM's prefetch: read, keep, data)."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        kind = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32])
        prefetch = cgutils.get_or_insert_function(builder.module, kind, "llvm.prefetch.p0")
        where = builder.inttoptr(args[0], cgutils.voidptr_t)
        builder.call(prefetch, [where, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(types.int64), codegen


@intrinsic
def _memcpy(typingctx, dst, src, nbytes):
    def codegen(context, builder, signature, args):
        d, s, n = args
        cgutils.raw_memcpy(
            builder, builder.inttoptr(d, cgutils.voidptr_t), builder.inttoptr(s, cgutils.voidptr_t), n, 1
        )
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def _memset_zero(typingctx, dst, nbytes):
    def codegen(context, builder, signature, args):
        d, n = args
        cgutils.memset(builder, builder.inttoptr(d, cgutils.voidptr_t), n, 0)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64), codegen


def _float_cast(source: ir.Type, target: ir.Type, widen: bool):
    @intrinsic
    def cast(typingctx, dst, src, count):
        def codegen(context, builder, signature, args):
            d, s, n = args
            sp, dp = builder.inttoptr(s, source.as_pointer()), builder.inttoptr(d, target.as_pointer())
            with cgutils.for_range(builder, n) as loop:
                value = builder.load(builder.gep(sp, [loop.index]))
                value = builder.fpext(value, target) if widen else builder.fptrunc(value, target)
                builder.store(value, builder.gep(dp, [loop.index]))
            return context.get_dummy_value()

        return types.void(types.int64, types.int64, types.int64), codegen

    return cast


_half_to_single = _float_cast(ir.HalfType(), ir.FloatType(), True)
_single_to_half = _float_cast(ir.FloatType(), ir.HalfType(), False)


@numba.njit(nogil=True)
def _probe(table, h, slot, mask):
    """The first slot from `slot` on whose entry is hash `h`; -1 where an empty slot (0) comes first."""
    while table[slot] != h:
        if table[slot] == 0:
            return -1
        slot = (slot + np.uint64(1)) & mask
    return np.int64(slot)


@numba.njit(nogil=True, cache=True)
def probe(table, hashes, start):
    """For each of `hashes` (uint64), the first slot at or after `start[k]` (masked to the
    table) whose entry is that hash, -1 where an empty slot (0) comes first."""
    mask = np.uint64(table.shape[0] - 1)
    found = np.empty(hashes.shape[0], np.int64)
    for k in range(hashes.shape[0]):
        found[k] = _probe(table, hashes[k], np.uint64(start[k]) & mask, mask)
    return found


@numba.njit(nogil=True)
def _convert(kind, dst, src, count, src_size):
    if kind == COPY:
        _memcpy(dst, src, count * src_size)
    elif kind == WIDEN_INT32:
        into, values = numba.carray(_int64_at(dst), count), numba.carray(_int32_at(src), count)
        for i in range(count):
            into[i] = values[i]
    elif kind == HALF_TO_SINGLE:
        _half_to_single(dst, src, count)
    else:
        _single_to_half(dst, src, count)


@numba.njit(nogil=True)
def _pad(pad, dst, count, dst_size):
    if pad == PAD_ZERO:
        _memset_zero(dst, count * dst_size)
    else:
        into = numba.carray(_int64_at(dst), count)
        for i in range(count):
            into[i] = -1


def _crc_table() -> np.ndarray:
    table = np.zeros(256, np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xEDB88320 if crc & 1 else crc >> 1
        table[byte] = crc
    return table


_CRC = _crc_table()  # CRC-32 (zlib's polynomial, reflected), one entry per byte value


@numba.njit(nogil=True)
def _id_hash(keys, begin, end):
    """`pipeline.store.index.id_hash` of ``keys[begin:end]``: zlib's CRC-32 | Adler-32 << 32, never 0."""
    crc, a, b = np.uint32(0xFFFFFFFF), np.uint32(1), np.uint32(0)
    for i in range(begin, end):
        byte = keys[i]
        crc = _CRC[(crc ^ byte) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
        a = (a + byte) % np.uint32(65521)
        b = (b + a) % np.uint32(65521)
    h = np.uint64(crc ^ np.uint32(0xFFFFFFFF)) | (np.uint64((b << np.uint32(16)) | a) << np.uint64(32))
    return h if h != 0 else np.uint64(1)


@numba.njit(nogil=True)
def _entry(tables, row_width, shard, row):
    return numba.carray(_int64_at(tables[shard] + row * row_width * 8), row_width)


# what `gather_rows` returns besides the first record whose row holds another id
GATHERED, ABSENT, SHARDS_CLOSED = -1, -2, -3


@numba.njit(nogil=True, cache=True)
def gather_rows(keys, key_at, index, tables, maps, row_width, slots, geometry, held, fields, out, missing):
    """Look a batch of ids up and copy their records into a batch buffer, in one call.

    Returns GATHERED; or, having written nothing: ABSENT (an id the index lacks),
    SHARDS_CLOSED (`out[k, 0]` is -1 for each record whose shard has no address yet: the
    caller opens shards `out[k, 1]` and calls again), or k >= 0, the first record whose row holds
    another id (a hash collision, or damage: the Python gather takes over).

    Id k is ``keys[key_at[k]:key_at[k + 1]]`` (UTF-8); it goes to image slot `slots[k]`.
    `index`: the id index's hash, shard and row columns (`pipeline.store.index`). Shard s's
    row table (int64, `row_width` entries per row: height, width, region count, per column
    the element where its values start, then the id's begin and end byte in the map) is at
    address `tables[s]` and its map at `maps[s]` (0: not open). `geometry`: slots per image,
    the first region slot (1 with an IMG token), the regions kept per image. `held[b]`:
    regions image slot b holds (updated). Field f, row of `fields`: its table entry, stored
    value size, buffer address, values per region, buffer value size, conversion, padding.
    Writes per record (height, width, regions kept) to `out[k]` and whether it lacks field f
    to `missing[k, f]`. Memory the batch will touch is prefetched a stage ahead, so that
    the scattered small reads of different records overlap instead of waiting in turn."""
    hashes, index_shards, index_rows = index
    count, mask = key_at.shape[0] - 1, np.uint64(hashes.shape[0] - 1)
    wanted = np.empty(count, np.uint64)
    for k in range(count):
        wanted[k] = _id_hash(keys, key_at[k], key_at[k + 1])
        _prefetch(hashes.ctypes.data + np.int64(wanted[k] & mask) * 8)
    shard, row = np.empty(count, np.int64), np.empty(count, np.int64)
    closed = False
    for k in range(count):
        slot = _probe(hashes, wanted[k], wanted[k] & mask, mask)
        if slot < 0:
            return ABSENT
        shard[k], row[k] = index_shards[slot], index_rows[slot]
        out[k, 0], out[k, 1] = (0 if tables[shard[k]] else -1), shard[k]
        closed = closed or tables[shard[k]] == 0
        if not closed:
            _prefetch(tables[shard[k]] + row[k] * row_width * 8)
    if closed:
        return SHARDS_CLOSED
    for k in range(count):  # every id's bytes and every field's first values, on their way
        entry = _entry(tables, row_width, shard[k], row[k])
        _prefetch(maps[shard[k]] + entry[row_width - 2])
        for f in range(fields.shape[0]):
            if entry[fields[f, 0]] >= 0:
                _prefetch(maps[shard[k]] + entry[fields[f, 0]] * fields[f, 1])
    for k in range(count):
        entry = _entry(tables, row_width, shard[k], row[k])
        begin, end = entry[row_width - 2], entry[row_width - 1]
        if end - begin != key_at[k + 1] - key_at[k]:
            return k
        stored = numba.carray(_uint8_at(maps[shard[k]] + begin), end - begin)
        for i in range(end - begin):
            if stored[i] != keys[key_at[k] + i]:
                return k
    per_image, first, limit = geometry[0], geometry[1], geometry[2]
    for k in range(count):
        entry = _entry(tables, row_width, shard[k], row[k])
        n = min(entry[2], limit)
        b = slots[k]
        base, before = b * per_image + first, held[b]
        for f in range(fields.shape[0]):
            column, src_size, dst, width, dst_size, kind, pad = fields[f]
            at = dst + base * width * dst_size
            start = entry[column]
            if start < 0:
                _pad(pad, at, n * width, dst_size)
                missing[k, f] = True
            else:
                _convert(kind, at, maps[shard[k]] + start * src_size, n * width, src_size)
                missing[k, f] = False
            if before > n:  # a previous, larger image's regions beyond the new ones
                _pad(pad, at + n * width * dst_size, (before - n) * width, dst_size)
        held[b] = n
        out[k, 0], out[k, 1], out[k, 2] = entry[0], entry[1], n
    return GATHERED
