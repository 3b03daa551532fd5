"""retcon-sandbox: reconstruct clean history, with every untrusted step in an offline container."""

__version__ = "0.3.0"
