"""``python -m app`` runs the fabric-dra command line."""

from app.cli import main

main()
