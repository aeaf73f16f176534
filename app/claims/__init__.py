"""Structured-parameters mode: reserve, attach, report, detach and release devices of claims."""
