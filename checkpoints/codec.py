"""Checkpoint blobs: JSON compressed with zlib, versioned so that old blobs stay readable."""

from __future__ import annotations

import json
import zlib
from typing import Any

VERSION = 1


def encode(checkpoint: dict[str, Any]) -> bytes:
    body = json.dumps({"v": VERSION, **checkpoint}, separators=(",", ":"), sort_keys=True).encode()
    return zlib.compress(body, 6)


def decode(blob: bytes | None) -> dict[str, Any]:
    if not blob:
        return {}
    data: dict[str, Any] = json.loads(zlib.decompress(blob))
    version = data.pop("v", None)
    if version != VERSION:
        raise ValueError(f"checkpoint version {version!r} is not readable by this build (wants {VERSION})")
    return data
