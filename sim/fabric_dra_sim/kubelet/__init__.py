"""A kubelet stand-in for DRA plugins: plugin registration (:mod:`.registration`), the DRA
gRPC client (:mod:`.dra`), CDI spec checks (:mod:`.cdi_check`, ``cdi_schema.json``) and the
per-node prepare/unprepare of pods' claims (:mod:`.kubelet`). Import the submodules directly;
this package imports nothing (gRPC loads only when used)."""
