"""A synthetic safetensors checkpoint for the restart benchmark and GPU test: n uint8
tensors t0000... of `each` bytes, tensor i filled with one byte (i % 251), written a tensor
at a time (a 16 GB file never sits in memory)."""
import json
import struct


def checkpoint(path, n, each):
    header, off = {}, 0
    for i in range(n):
        header["t%04d" % i] = {"dtype": "U8", "shape": [each], "data_offsets": [off, off + each]}
        off += each
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for i in range(n):
            f.write(bytes([i % 251]) * each)
