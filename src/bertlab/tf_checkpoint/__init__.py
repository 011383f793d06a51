"""TensorFlow's checkpoint format ("V2" tensor bundles), read and written in plain Python + numpy.

Google's BERT release and every checkpoint its `run_pretraining.py` / `run_classifier.py` / `run_squad.py`
wrote are in this format. Reading them here means converting them needs neither TensorFlow nor its
protobuf runtime; writing it lets a bertlab model go back to Google's code. This module knows the file
format only -- tensor names are opaque strings here; a family's name map lives in its folder (BERT's:
`models/bert/tf_names.py`, read through the model class's `read_tf_checkpoint`; `models/bert/convert.py` both ways).

A checkpoint is a *prefix* (`bert_model.ckpt`) naming two or more files:

    PREFIX.index                  an SSTable (LevelDB's table format, see `_read_table`) whose keys are the tensor
                                  names, sorted bytewise, and whose values are serialized `BundleEntryProto`s
                                  (dtype, shape, shard, offset, size, crc32c). The empty key "" sorts first and
                                  holds the `BundleHeaderProto` (number of shards, endianness, format version).
    PREFIX.data-00000-of-00001    the shards: each tensor's bytes back to back at the offsets the index gives,
                                  little-endian, row-major (C order), no padding (TF's default alignment is 1).

Every tensor's bytes carry a CRC-32C (Castagnoli) in the index, *masked* as TF and LevelDB store CRCs (a
rotation plus a constant, so that a CRC stored inside CRC-checked data does not checksum to a fixed value);
every SSTable block carries its own masked CRC-32C too. All of them are verified on read; a mismatch, a
truncated shard or a malformed index raises `CheckpointError` naming the file and the tensor.

The protobuf messages are decoded by hand (`_parse_message`): they are three tiny messages and only the
wire format's varints, fixed32s and length-delimited fields occur in them.

References: tensorflow/core/util/tensor_bundle/tensor_bundle.{h,cc}, tensorflow/core/protobuf/
tensor_bundle.proto, tensorflow/core/lib/io/{format,block_builder,table_builder}.cc (LevelDB's table format).

The package, one part per idea: `crc32c.py` (the checksum), `protobuf.py` (the wire format and the bundle's
messages), `sstable.py` (LevelDB's table format, the index file), `bundle.py` (a checkpoint's files, the reader
and the writer).
"""

from .bundle import (DEFAULT_PREFIX, INDEX_SUFFIX, TFCheckpointReader, data_filename, is_tf_checkpoint,  # noqa: F401
                     resolve_prefix, write_tf_checkpoint)
from .crc32c import _crc_bytes, crc32c, mask_crc, unmask_crc  # noqa: F401
from .protobuf import TF_DTYPES, TensorEntry, _read_varint  # noqa: F401
from .sstable import _block_entries, _read_block, _read_table, _write_table  # noqa: F401
