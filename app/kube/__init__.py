"""The Kubernetes edge: API client setup and resource.k8s.io version choice (``client``,
``versions``), typed errors (``errors``), list-and-watch informers (``informer``), the
rate-limited work queue (``workqueue``), the controller runtime that runs reconcilers over them
(``runtime``), update with retry on conflict (``update``) and Lease-based leader election
(``leader``).

Importing this package does nothing; import the submodules you need.
"""
