"""Waits until FerretDB answers, creates its oplog if asked, then exits 0.

The ferretdb profile's one-shot (docker-compose.yml, ferretdb-ready): tailrace starts once it
has exited 0. Usage: ready.py MONGODB_URI. Waits up to 120 s for the server to answer `ping`
(it may still be starting), and exits 1 naming what failed.

With FERRETDB_OPLOG=true it also creates local.oplog.rs if it is absent. FerretDB (run with
--repl-set-name) writes an oplog only into a capped collection a client has created, and once
that exists it writes an entry for every insert, update and delete: about a quarter of the
server's CPU at the synthetic stream's 70 events/s (docs/BENCHMARKS.md). Only tailrace's
`oplog` feed reads it, which the profile does not run, so it is off unless asked for.
"""

import os
import sys
import time

from pymongo import MongoClient
from pymongo.errors import CollectionInvalid, PyMongoError

# The same bounds as scripts/ferretdb.sh gives the test servers.
SIZE_BYTES = 256 * 1024 * 1024
MAX_DOCS = 10000

uri = sys.argv[1]
oplog = os.environ.get("FERRETDB_OPLOG", "false")
if oplog not in ("true", "false"):
    sys.exit(f"ferretdb-ready: FERRETDB_OPLOG={oplog!r}: use true or false")
client = MongoClient(uri, serverSelectionTimeoutMS=2000)
deadline = time.monotonic() + 120
while True:
    try:
        client.admin.command("ping")
        break
    except PyMongoError as e:
        if time.monotonic() > deadline:
            sys.exit(f"ferretdb-ready: {uri} did not answer ping within 120 s: {e}")
        time.sleep(0.5)
print(f"ferretdb-ready: {uri} answers", flush=True)
if oplog == "true":
    try:
        client.local.create_collection("oplog.rs", capped=True, size=SIZE_BYTES, max=MAX_DOCS)
        print("ferretdb-ready: created local.oplog.rs", flush=True)
    except CollectionInvalid:
        print("ferretdb-ready: local.oplog.rs exists", flush=True)
