"""A tiny safetensors writer and reader (numpy only), for keel's reference fixtures.

Format (https://github.com/huggingface/safetensors):
  bytes 0..8   : N, the header length, unsigned 64-bit little-endian
  bytes 8..8+N : UTF-8 JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}
                 plus an optional "__metadata__" object of string -> string;
                 padded with spaces so that the data starts at a multiple of 8
  the rest     : the data buffer; offsets are relative to its start, little-endian, row-major.

The writer lays tensors out in sorted name order, contiguous, with no gaps.
"""

import json
import struct

import numpy as np

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def _dtype_name(arr):
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    for name, d in _DTYPES.items():
        if d == dt or (d.kind == dt.kind and d.itemsize == dt.itemsize):
            return name
    raise ValueError(f"unsupported dtype {arr.dtype}")


def serialize(tensors, metadata=None):
    """tensors: dict name -> numpy array. metadata: dict str -> str. Returns bytes."""
    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    chunks = []
    offset = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise ValueError("reserved name")
        arr = np.asarray(tensors[name])
        dname = _dtype_name(arr)
        data = np.ascontiguousarray(arr, dtype=_DTYPES[dname]).tobytes()
        header[name] = {"dtype": dname, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    pad = (8 - (8 + len(text)) % 8) % 8
    text += b" " * pad
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def save_file(tensors, path, metadata=None):
    with open(path, "wb") as f:
        f.write(serialize(tensors, metadata))


def deserialize(blob):
    """Returns (dict name -> numpy array, metadata dict). Validates offsets cover the buffer."""
    if len(blob) < 8:
        raise ValueError("file shorter than its header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError("header runs past the end of the file")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    data = blob[8 + n :]
    metadata = header.pop("__metadata__", {}) or {}
    spans = []
    out = {}
    for name, e in header.items():
        dt = _DTYPES[e["dtype"]]
        shape = tuple(e["shape"])
        b, end = e["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - b != count * dt.itemsize:
            raise ValueError(f"{name}: data_offsets span {end - b} bytes, shape needs {count * dt.itemsize}")
        spans.append((b, end, name))
        out[name] = np.frombuffer(data[b:end], dtype=dt).reshape(shape).copy()
    pos = 0
    for b, end, name in sorted(spans):
        if b != pos:
            raise ValueError(f"{name}: gap or overlap at {b} (expected {pos})")
        pos = end
    if pos != len(data):
        raise ValueError("data buffer has trailing bytes")
    return out, metadata


def load_file(path):
    with open(path, "rb") as f:
        return deserialize(f.read())
