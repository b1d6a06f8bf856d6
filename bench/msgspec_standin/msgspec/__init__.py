"""A pure-Python stand-in for msgspec's Struct and msgpack codec, as much as NVIDIA
Dynamo's GPU Memory Service uses (gpu_memory_service/common/protocol/messages.py: tagged
Structs, one Encoder, one Decoder of a Union), for machines with no package index.
bench/gms_flows.py puts it on GMS's path only where msgspec itself is missing, and
measures what it costs per message, in the same run.  Encoding follows msgspec's for a
tagged Struct: a map with "type": tag, then the fields."""
import copy
import enum
import typing

__all__ = ["Struct", "ValidationError", "msgpack"]


class ValidationError(ValueError):
    pass


class Struct:
    __struct_tag__ = None
    __struct_fields__ = ()
    __struct_defaults__ = {}

    def __init_subclass__(cls, tag=None, **kwargs):
        super().__init_subclass__()
        cls.__struct_tag__ = tag
        fields = []
        for klass in reversed(cls.__mro__):
            for name in getattr(klass, "__annotations__", {}):
                if name not in fields and not name.startswith("__"):
                    fields.append(name)
        cls.__struct_fields__ = tuple(fields)
        cls.__struct_defaults__ = {f: getattr(cls, f) for f in fields if hasattr(cls, f)}

    def __init__(self, *args, **kwargs):
        if len(args) > len(self.__struct_fields__):
            raise TypeError("%s: too many arguments" % type(self).__name__)
        for name, value in zip(self.__struct_fields__, args):
            setattr(self, name, value)
        for name in self.__struct_fields__[len(args):]:
            if name in kwargs:
                setattr(self, name, kwargs.pop(name))
            elif name in self.__struct_defaults__:
                setattr(self, name, copy.copy(self.__struct_defaults__[name]))
            else:
                raise TypeError("%s: missing required argument %r" % (type(self).__name__, name))
        if kwargs:
            raise TypeError("%s: unexpected arguments %s" % (type(self).__name__, sorted(kwargs)))

    def __eq__(self, other):
        return type(self) is type(other) and all(getattr(self, f) == getattr(other, f)
                                                 for f in self.__struct_fields__)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (f, getattr(self, f))
                                                         for f in self.__struct_fields__))


def _builtin(obj):
    """obj as msgpack's types."""
    if isinstance(obj, Struct):
        d = {"type": obj.__struct_tag__} if obj.__struct_tag__ is not None else {}
        for f in obj.__struct_fields__:
            d[f] = _builtin(getattr(obj, f))
        return d
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [_builtin(x) for x in obj]
    return obj


_CONVERTERS = {}


def _converter(kind):
    """A function that makes msgpack's value of type kind (Structs, Enums, Optional, List,
    a Union of tagged Structs) what msgspec gives; None where the value stays as it is.
    Made once per type: a message is decoded with no type inspection."""
    if kind in _CONVERTERS:
        return _CONVERTERS[kind]
    _CONVERTERS[kind] = None  # a type that refers to itself: filled in below
    origin, conv = typing.get_origin(kind), None
    if origin is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        structs = {a.__struct_tag__: a for a in args if isinstance(a, type) and issubclass(a, Struct)}
        if structs:
            convs = {tag: _converter(a) for tag, a in structs.items()}

            def conv(v):
                if not isinstance(v, dict) or v.get("type") not in convs:
                    raise ValidationError("unknown message type %r" % (v.get("type") if isinstance(v, dict) else v))
                return convs[v["type"]](v)
        elif len(args) == 1 and _converter(args[0]) is not None:
            inner = _converter(args[0])

            def conv(v):
                return None if v is None else inner(v)
    elif origin is list:
        (item,) = typing.get_args(kind) or (typing.Any,)
        inner = _converter(item)
        if inner is not None:
            def conv(v):
                return [inner(x) for x in v]
    elif isinstance(kind, type) and issubclass(kind, Struct):
        fields = [(f, _converter(t)) for f, t in typing.get_type_hints(kind).items() if f in kind.__struct_fields__]

        def conv(v):
            if not isinstance(v, dict):
                raise ValidationError("%s: expected a map" % kind.__name__)
            return kind(**{f: (c(v[f]) if c and v[f] is not None else v[f]) for f, c in fields if f in v})
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        conv = kind
    _CONVERTERS[kind] = conv
    return conv


def _convert(value, kind):
    conv = _converter(kind)
    return value if conv is None else conv(value)


from . import msgpack  # noqa: E402,F401  (msgspec.msgpack: after what it uses)
