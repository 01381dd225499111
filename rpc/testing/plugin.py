"""pytest plugin entry point (chronq_replay): collects replay-scenario folders."""
