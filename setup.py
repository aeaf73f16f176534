"""Packaging glue: ship the top-level ``migrations/`` folder inside the wheel as ``app.migrations``.

Everything else about the distribution is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["app", "app.*"]),
        "app.migrations",
        "app.migrations.versions",
    ],
    package_dir={"app.migrations": "migrations"},
)
