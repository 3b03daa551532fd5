"""The Docker backend, one module a concern: `engine` (the connection, and the only module
that imports the docker SDK), `sandboxes` (per-run sandboxes, the setup container and its
egress proxy) and `stream` (a `docker exec` stream, and the helper's protocol over it)."""
