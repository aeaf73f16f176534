"""Simulators for demos and tests (the fabric-dra-sim distribution). The product (``app``)
never imports them; its command line finds their commands through entry points."""
