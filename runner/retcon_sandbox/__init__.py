"""retcon-sandbox: reconstruct clean history, with every untrusted step in an offline container."""

__version__ = "0.2.0"
