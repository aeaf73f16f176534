"""Packaging glue: ship the top-level ``migrations/`` folder inside the wheel as ``app.migrations``.

Everything else about the distribution is in pyproject.toml. Packages are found as namespace
packages, so that folders without an ``__init__.py`` (the generated kubelet gRPC modules in
``app/node/grpcapi``, the dashboard's ``app/admin/templates``) are shipped too.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["app", "app.*"], exclude=["*.__pycache__"]),
        "app.migrations",
        "app.migrations.versions",
    ],
    package_dir={"app.migrations": "migrations"},
)
