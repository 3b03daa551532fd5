"""Where untrusted code runs: the sandbox API, the workspace, the Docker and local backends, the
images and prepared environments, host access for setup, and container liveness."""
