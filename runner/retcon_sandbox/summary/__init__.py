"""What a run or a verified range comes to, for a person: facts read from the spec, git, the
verification notes and the run's own files, shown as a Markdown job summary or an HTML report."""
