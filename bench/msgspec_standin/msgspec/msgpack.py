"""msgspec.msgpack's Encoder and Decoder, over the msgpack package (see the package's
docstring)."""
import msgpack as _msgpack

from . import _builtin, _convert


class Encoder:
    def encode(self, obj):
        return _msgpack.packb(_builtin(obj), use_bin_type=True)


class Decoder:
    def __init__(self, type=object):
        self.type = type

    def decode(self, data):
        return _convert(_msgpack.unpackb(data, raw=False), self.type)
