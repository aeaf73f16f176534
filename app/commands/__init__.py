"""CLI subcommands, one module each; wired by :mod:`app.cli`."""
