"""`tf.train.Example` records read without TensorFlow: the message types built from their schema by
the protobuf library (a pool of our own, so they never clash with TensorFlow's when both load).
The prepared corpora's records are these messages (data.prepare writes them)."""
from __future__ import annotations

import functools

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _message(name: str, fields: list[tuple], nested: list | None = None, oneof: str | None = None):
    msg = descriptor_pb2.DescriptorProto(name=name)
    if oneof:
        msg.oneof_decl.add(name=oneof)
    for field_name, number, kind, label, type_name, packed in fields:
        f = msg.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name:
            f.type_name = type_name
        if packed:
            f.options.packed = True
        if oneof:
            f.oneof_index = 0
    for n in nested or []:
        msg.nested_type.add().CopyFrom(n)
    return msg


@functools.lru_cache(maxsize=1)
def example_class():
    """The message class of tf.train.Example (tensorflow/core/example/{example,feature}.proto)."""
    rep, opt = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL
    file = descriptor_pb2.FileDescriptorProto(name="sentemb_jax/tf_example.proto", package="tensorflow", syntax="proto3")
    file.message_type.add().CopyFrom(_message("BytesList", [("value", 1, _F.TYPE_BYTES, rep, None, False)]))
    file.message_type.add().CopyFrom(_message("FloatList", [("value", 1, _F.TYPE_FLOAT, rep, None, True)]))
    file.message_type.add().CopyFrom(_message("Int64List", [("value", 1, _F.TYPE_INT64, rep, None, True)]))
    file.message_type.add().CopyFrom(_message("Feature", [
        ("bytes_list", 1, _F.TYPE_MESSAGE, opt, ".tensorflow.BytesList", False),
        ("float_list", 2, _F.TYPE_MESSAGE, opt, ".tensorflow.FloatList", False),
        ("int64_list", 3, _F.TYPE_MESSAGE, opt, ".tensorflow.Int64List", False)], oneof="kind"))
    entry = _message("FeatureEntry", [("key", 1, _F.TYPE_STRING, opt, None, False),
                                      ("value", 2, _F.TYPE_MESSAGE, opt, ".tensorflow.Feature", False)])
    entry.options.map_entry = True
    file.message_type.add().CopyFrom(_message("Features", [
        ("feature", 1, _F.TYPE_MESSAGE, rep, ".tensorflow.Features.FeatureEntry", False)], nested=[entry]))
    file.message_type.add().CopyFrom(_message("Example", [
        ("features", 1, _F.TYPE_MESSAGE, opt, ".tensorflow.Features", False)]))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def parse_examples(records, features: dict[str, str]) -> list[dict]:
    """Serialized Examples -> dicts: a 'string' feature as str, 'float' as float, 'ids' as int32 array."""
    cls, out = example_class(), []
    for raw in records:
        feature = cls.FromString(raw).features.feature
        row = {}
        for name, kind in features.items():
            f = feature[name]
            if kind == "string":
                row[name] = f.bytes_list.value[0].decode("utf-8")
            elif kind == "float":
                row[name] = float(f.float_list.value[0])
            else:
                row[name] = np.asarray(f.int64_list.value, np.int32)
        out.append(row)
    return out
