"""Many configurations of one model: the space (``space``), the sweep and its ranking (``sweep``),
and the ``sweep`` / ``compare`` subcommands (``command``)."""
