"""The local GCS emulator (``gcp-storage-emulator``) with the object-generation semantics
that tensorstore (orbax's array storage) relies on. Test support, started by conftest.py.

The emulator assigns generations but ignores preconditions and omits ``x-goog-generation``
on media downloads. Tensorstore reads that header and updates OCDBT manifests with
conditional requests, so this wrapper adds, for the JSON API:

- ``x-goog-generation`` / ``x-goog-metageneration`` on ``alt=media`` downloads;
- ``ifGenerationMatch`` / ``ifGenerationNotMatch`` on downloads (412 / 304);
- ``ifGenerationMatch`` on ``uploadType=media`` uploads (412 on mismatch; ``0`` = must not exist).

Checks and writes run under one lock, so conditional writes are atomic as on GCS.

    python tests/gcs_emulator.py start --host 127.0.0.1 --port 9023 --in-memory
"""

from __future__ import annotations

import sys
import threading
from http import HTTPStatus

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_lock = threading.RLock()
_download, _insert = objects.download, objects.insert


def _generation(storage, bucket: str, name: str) -> str:
    try:
        return str(storage.get_file_obj(bucket, name).get("generation") or "0")
    except NotFound:
        return "0"


def _query(request, key: str) -> str | None:
    values = request.query.get(key)
    return values[0] if values else None


def download(request, response, storage, *args, **kwargs):
    with _lock:
        generation = _generation(storage, request.params["bucket_name"], request.params["object_id"])
        match, not_match = _query(request, "ifGenerationMatch"), _query(request, "ifGenerationNotMatch")
        if generation != "0":
            if match is not None and match != generation:
                response.status = HTTPStatus.PRECONDITION_FAILED
                return None
            if not_match is not None and not_match == generation:
                response.status = HTTPStatus.NOT_MODIFIED
                return None
            response["x-goog-generation"] = generation
            response["x-goog-metageneration"] = "1"
        return _download(request, response, storage, *args, **kwargs)


def insert(request, response, storage, *args, **kwargs):
    match, name = _query(request, "ifGenerationMatch"), _query(request, "name")
    with _lock:
        if match is not None and name is not None and _query(request, "uploadType") == "media":
            if _generation(storage, request.params["bucket_name"], name) != match:
                response.status = HTTPStatus.PRECONDITION_FAILED
                return None
        return _insert(request, response, storage, *args, **kwargs)


# The server's routing table captures these functions when it is imported: patch first.
objects.download, objects.insert = download, insert

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main

    sys.exit(main())
