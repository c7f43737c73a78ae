"""Arrow → numpy without `pyarrow.Array.to_numpy`, which imports pandas on first use
(a second or more of start-up on a busy machine, for nothing)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_DTYPES = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float16(): np.float16,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """`[N]` numpy array of a numeric or boolean Arrow array (zero-copy when it is a
    single primitive chunk without nulls; nulls become NaN after a cast to float64).

    Raises:
        TypeError: a non-numeric array.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if pa.types.is_boolean(array.type):
        array = pc.cast(array, pa.uint8())
    if array.null_count:
        array = pc.fill_null(pc.cast(array, pa.float64()), float("nan"))
    dtype = _DTYPES.get(array.type)
    if dtype is None:
        raise TypeError(f"no numpy view for Arrow type {array.type}")
    buffer = array.buffers()[1]
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(buffer, dtype=dtype, count=len(array), offset=array.offset * itemsize)


def int64_array(values: np.ndarray) -> pa.Array:
    """An Arrow int64 array over a numpy array's data (`pa.array` on numpy input imports
    pandas)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def string_array(values: list[str]) -> pa.Array:
    """An Arrow string array of Python strings (`pa.array` imports pandas)."""
    joined = "".join(values)
    if joined.isascii():  # one encode for all: a character is a byte
        data = joined.encode("ascii")
        lengths = np.fromiter(map(len, values), np.int64, count=len(values))
    else:
        encoded = [value.encode("utf-8") for value in values]
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), np.int64, count=len(encoded))
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeStringArray.from_buffers(
        len(values), pa.py_buffer(offsets), pa.py_buffer(data)
    ).cast(pa.string())
