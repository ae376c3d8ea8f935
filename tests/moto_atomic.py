"""moto's S3 server (``python -m tests.moto_atomic -H HOST -p PORT``) with conditional puts made atomic.

moto checks ``If-None-Match: *`` / ``If-Match`` and then stores the object as two steps of a threaded server
(``moto.s3.responses.S3Response.put_object``), so two concurrent conditional puts of one key can both succeed.
AWS S3 (and MinIO, R2, Azure) decide a conditional put atomically, and the lake's commit protocol relies on that:
a Delta log entry is created only if absent. Serialising moto's conditional puts makes the test server keep the
guarantee the protocol is tested against; unconditional puts (data files) still run concurrently."""

from __future__ import annotations

import sys
import threading
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

_CONDITIONAL = threading.Lock()
_put_object = S3Response.put_object


def _atomic_put_object(self: S3Response) -> Any:
    if self.headers.get("If-None-Match") or self.headers.get("If-Match"):
        with _CONDITIONAL:
            return _put_object(self)
    return _put_object(self)


S3Response.put_object = _atomic_put_object  # type: ignore[method-assign]

if __name__ == "__main__":
    main(sys.argv[1:])
