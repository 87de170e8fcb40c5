// Health check of the `mongo` service in docker-compose.yml (run by mongosh inside the container
// every few seconds). Change streams and the oplog need a replica set, so on the first run this
// initiates the single-node set rs0; afterwards it only checks. Healthy (exit 0) once this node is
// the writable primary, so tailrace, which waits for a healthy mongo, can write at once.
//
// The member is named mongo:27017, the compose service name, which every other container
// resolves; clients on the host connect with ?directConnection=true (see the README).
try {
  rs.status();
} catch (e) {
  // 94 NotYetInitialized: a fresh data volume. Anything else is a real problem: rethrow, which
  // makes mongosh exit non-zero (unhealthy) and the message shows in `docker inspect`.
  if (e.code !== 94 && e.codeName !== "NotYetInitialized") {
    throw e;
  }
  rs.initiate({ _id: "rs0", members: [{ _id: 0, host: "mongo:27017" }] });
}
if (!db.hello().isWritablePrimary) {
  print("replica set rs0 initiated; waiting for this node to become primary");
  quit(1);
}
