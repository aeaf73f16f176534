"""The node plugin (``fabric-dra node``): the kubelet's DRA plugin for our driver on every node.

It registers with the kubelet's plugin watcher, answers NodePrepareResources and
NodeUnprepareResources (kubelet DRA API v1 and v1beta1) by finding each attached device on the
host and writing a CDI spec for the claim, and reports the prepared devices' health.
"""
