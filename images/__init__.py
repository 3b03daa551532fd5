"""The Dockerfiles of the sandbox images, shipped as package data (retcon_sandbox.dockerfiles)."""
