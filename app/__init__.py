"""fabric-dra: a Kubernetes DRA controller for network-attached (fabric) devices."""

__version__ = "0.1.0"
