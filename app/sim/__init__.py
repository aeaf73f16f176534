"""Simulators for demos and tests. Never imported by the controller's own code paths."""
