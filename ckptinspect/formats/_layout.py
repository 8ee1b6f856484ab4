"""File names of TF checkpoint layouts, shared by detection (which must stay cheap: it runs
for Keras files too) and the TF readers."""

from __future__ import annotations

import re

INDEX_SUFFIX = ".index"
STATE_FILE = "checkpoint"
DATA_FILE_RE = re.compile(r"^(?P<prefix>.*)\.data-(?P<shard>\d{5})-of-(?P<num>\d{5})$")


def data_path(prefix: str, shard: int, num_shards: int) -> str:
    """The file holding data shard ``shard`` of a bundle."""
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"
