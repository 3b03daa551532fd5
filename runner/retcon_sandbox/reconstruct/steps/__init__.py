"""The steps of a reconstruction, each a few functions over the run's context (`context.Run`):
extraction, the fix loop, the remainder and squashing. `engine` drives them."""
