"""The model: the one openai adapter, the agent loop, the file tools (schema and handler
together), and the prompts (in `prompts/`)."""
