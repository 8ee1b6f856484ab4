"""The few TensorFlow protobuf messages listing needs, declared here so that parsing runs in
protobuf's compiled runtime without importing TensorFlow.

Field numbers follow tensorflow/core/protobuf/tensor_bundle.proto,
tensorflow/core/framework/tensor_shape.proto, tensor_slice.proto and
tensorflow/core/protobuf/trackable_object_graph.proto (:data:`TrackableObjectGraphFull` adds
TrackableObject's ``registered_saver=4``: RegisteredSaver ``name=1``, ``object_name=2``;
``has_checkpoint_values=5``: a ``google.protobuf.BoolValue``, ``value=1``). They are declared proto2-style
(optional fields, enums as int32, strings as bytes) in a private descriptor pool, which reads
the same wire format while tolerating invalid UTF-8 and letting us see which fields are set.
Fields this module does not declare are kept as unknown fields and written back on
re-serialisation (after the known ones, as protobuf does).
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

__all__ = [
    "DecodeError", "BundleEntryProto", "BundleHeaderProto", "TensorShapeProto", "TrackableObjectGraph",
    "TrackableObjectGraphFull",
]

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_PACKAGE = "ckptinspect_tf"

# message name -> [(field name, number, type, label, message type name or None)]
_MESSAGES = {
    "TensorShapeProto.Dim": [("size", 1, _F.TYPE_INT64, _OPTIONAL, None), ("name", 2, _F.TYPE_BYTES, _OPTIONAL, None)],
    "TensorShapeProto": [
        ("dim", 2, _F.TYPE_MESSAGE, _REPEATED, "TensorShapeProto.Dim"),
        ("unknown_rank", 3, _F.TYPE_BOOL, _OPTIONAL, None),
    ],
    "TensorSliceProto.Extent": [("start", 1, _F.TYPE_INT64, _OPTIONAL, None), ("length", 2, _F.TYPE_INT64, _OPTIONAL, None)],
    "TensorSliceProto": [("extent", 1, _F.TYPE_MESSAGE, _REPEATED, "TensorSliceProto.Extent")],
    "BundleHeaderProto": [
        ("num_shards", 1, _F.TYPE_INT32, _OPTIONAL, None),
        ("endianness", 2, _F.TYPE_INT32, _OPTIONAL, None),
        ("version", 3, _F.TYPE_BYTES, _OPTIONAL, None),
    ],
    "BundleEntryProto": [
        ("dtype", 1, _F.TYPE_INT32, _OPTIONAL, None),
        ("shape", 2, _F.TYPE_MESSAGE, _OPTIONAL, "TensorShapeProto"),
        ("shard_id", 3, _F.TYPE_INT32, _OPTIONAL, None),
        ("offset", 4, _F.TYPE_INT64, _OPTIONAL, None),
        ("size", 5, _F.TYPE_INT64, _OPTIONAL, None),
        ("crc32c", 6, _F.TYPE_FIXED32, _OPTIONAL, None),
        ("slices", 7, _F.TYPE_MESSAGE, _REPEATED, "TensorSliceProto"),
    ],
    "TrackableObjectGraph.ObjectReference": [
        ("node_id", 1, _F.TYPE_INT32, _OPTIONAL, None),
        ("local_name", 2, _F.TYPE_BYTES, _OPTIONAL, None),
    ],
    "TrackableObjectGraph.SerializedTensor": [
        ("name", 1, _F.TYPE_BYTES, _OPTIONAL, None),
        ("full_name", 2, _F.TYPE_BYTES, _OPTIONAL, None),
        ("checkpoint_key", 3, _F.TYPE_BYTES, _OPTIONAL, None),
    ],
    "TrackableObjectGraph.SlotVariableReference": [
        ("original_variable_node_id", 1, _F.TYPE_INT32, _OPTIONAL, None),
        ("slot_name", 2, _F.TYPE_BYTES, _OPTIONAL, None),
        ("slot_variable_node_id", 3, _F.TYPE_INT32, _OPTIONAL, None),
    ],
    "TrackableObjectGraph.TrackableObject": [
        ("children", 1, _F.TYPE_MESSAGE, _REPEATED, "TrackableObjectGraph.ObjectReference"),
        ("attributes", 2, _F.TYPE_MESSAGE, _REPEATED, "TrackableObjectGraph.SerializedTensor"),
        ("slot_variables", 3, _F.TYPE_MESSAGE, _REPEATED, "TrackableObjectGraph.SlotVariableReference"),
    ],
    "TrackableObjectGraph": [("nodes", 1, _F.TYPE_MESSAGE, _REPEATED, "TrackableObjectGraph.TrackableObject")],
}
# The full TrackableObject, for writing graphs (prune_object_graph). Readers keep the lean one
# above: listing a node's fields would otherwise build a message object for every node's
# has_checkpoint_values (fields 4 and 5 stay unknown fields there, kept on re-serialisation).
_FULL_PACKAGE = "ckptinspect_tf_full"
_FULL_MESSAGES = {
    **_MESSAGES,
    "TrackableObjectGraph.TrackableObject": [
        *_MESSAGES["TrackableObjectGraph.TrackableObject"],
        ("registered_saver", 4, _F.TYPE_MESSAGE, _OPTIONAL, "RegisteredSaver"),
        ("has_checkpoint_values", 5, _F.TYPE_MESSAGE, _OPTIONAL, "BoolValue"),
    ],
    "RegisteredSaver": [("name", 1, _F.TYPE_BYTES, _OPTIONAL, None), ("object_name", 2, _F.TYPE_BYTES, _OPTIONAL, None)],
    "BoolValue": [("value", 1, _F.TYPE_BOOL, _OPTIONAL, None)],  # google.protobuf.BoolValue's wire format
}


def _build(messages: dict = _MESSAGES, package: str = _PACKAGE):
    file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto2")
    protos: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full in messages:  # parents are listed after their nested types; create parents first
        parts = full.split(".")
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            if name in protos:
                continue
            parent = protos.get(".".join(parts[: depth - 1])) if depth > 1 else None
            proto = (parent.nested_type.add() if parent is not None else file.message_type.add())
            proto.name = parts[depth - 1]
            protos[name] = proto
    for full, fields in messages.items():
        for fname, number, ftype, label, type_name in fields:
            field = protos[full].field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = f".{package}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in messages}


_CLASSES = _build()
BundleEntryProto = _CLASSES["BundleEntryProto"]
BundleHeaderProto = _CLASSES["BundleHeaderProto"]
TrackableObjectGraph = _CLASSES["TrackableObjectGraph"]
TensorShapeProto = _CLASSES["TensorShapeProto"]
TrackableObjectGraphFull = _build(_FULL_MESSAGES, _FULL_PACKAGE)["TrackableObjectGraph"]
