"""Creates FerretDB's oplog, local.oplog.rs, if it is absent, then exits 0.

FerretDB (run with --repl-set-name) writes an oplog only into a capped collection a client has
created; tailrace's oplog feed reads it. Usage: create-oplog.py MONGODB_URI. Waits up to 120 s
for the server to answer `ping` (it may still be starting), and exits 1 naming what failed.
"""

import sys
import time

from pymongo import MongoClient
from pymongo.errors import CollectionInvalid, PyMongoError

# The same bounds as scripts/ferretdb.sh gives the test servers.
SIZE_BYTES = 256 * 1024 * 1024
MAX_DOCS = 10000

uri = sys.argv[1]
client = MongoClient(uri, serverSelectionTimeoutMS=2000)
deadline = time.monotonic() + 120
while True:
    try:
        client.admin.command("ping")
        break
    except PyMongoError as e:
        if time.monotonic() > deadline:
            sys.exit(f"create-oplog: {uri} did not answer ping within 120 s: {e}")
        time.sleep(0.5)
try:
    client.local.create_collection("oplog.rs", capped=True, size=SIZE_BYTES, max=MAX_DOCS)
    print("create-oplog: created local.oplog.rs", flush=True)
except CollectionInvalid:
    print("create-oplog: local.oplog.rs exists", flush=True)
