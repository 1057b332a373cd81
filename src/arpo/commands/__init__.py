"""CLI subcommands, one module each (see arpo.cli)."""
