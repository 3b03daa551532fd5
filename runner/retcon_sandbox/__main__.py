"""`python -m retcon_sandbox`: the same command line as `retcon-sandbox`."""

from retcon_sandbox.cli import main

main()
