"""NodePlugin (app.node.plugin) driven directly, without gRPC: its start (checkpoint load, the
rebuild of a corrupt checkpoint from the CDI spec file names, removal of specs no claim owns),
and prepare / unprepare against a fake host (sysfs under a temporary folder) with a fake
``read_claim``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from app.config import NodePluginSettings
from app.node import cdi
from app.node.checkpoint import PREPARED, PREPARING, Checkpoint, ClaimRecord, decode
from app.node.plan import ClaimNotPreparable, ClaimReadFailed, ClaimRef
from app.node.plugin import MAX_ERROR_CHARS, NodePlugin, PrepareResult, claim_message
from fabric_dra_sim.fakehost import FakeHost
from fabric_dra_sim.kubelet.cdi_check import read_spec_file

DRIVER = "fabric.example.com"
NODE = "node-a"
READY = "FabricDeviceReady"
FAILED = "FabricDeviceFailed"
GPU_UUID = "3f2a6b1c-0d4e-4f5a-8b9c-0123456789ab"
NVME_SERIAL = "S5GXNX0T123456"
UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"
REF_A = ClaimRef("default", "claim-a", UID_A)
REF_B = ClaimRef("default", "claim-b", UID_B)
GPU_SPEC_A = f"{DRIVER}-gpu_{UID_A}.json"
NVME_SPEC_A = f"{DRIVER}-nvme_{UID_A}.json"
GPU_SPEC_B = f"{DRIVER}-gpu_{UID_B}.json"

GPU = ("rack-1", "gpu-0", {"deviceType": "gpu", "uuid": GPU_UUID})
NVME = ("rack-1", "nvme-0", {"deviceType": "nvme", "serialNumber": NVME_SERIAL})
MISSING = ("rack-1", "gpu-9", {"deviceType": "gpu", "uuid": "00000000-0000-4000-8000-00000000dead"})


# --- builders ----------------------------------------------------------------------------------


def claim(
    ref: ClaimRef,
    devices: list[tuple[str, str, dict[str, Any]]],
    *,
    node: str = NODE,
    ready: bool = True,
) -> dict[str, Any]:
    """An allocated claim whose devices are attached (``ready``) to ``node``."""
    conditions = [
        {
            "type": READY,
            "status": "True" if ready else "False",
            "reason": "Attached",
            "message": "",
        },
        {"type": FAILED, "status": "False", "reason": "Attached", "message": ""},
    ]
    return {
        "metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "dev", "driver": DRIVER, "pool": p, "device": d}
                        for p, d, _ in devices
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "devices": [
                {
                    "driver": DRIVER,
                    "pool": p,
                    "device": d,
                    "conditions": conditions,
                    "data": {"node": NODE, **data},
                }
                for p, d, data in devices
            ],
        },
    }


class Claims:
    """A fake API server read: claims by (namespace, name), and how often each was read."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.reads: list[tuple[str, str]] = []

    async def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads.append((namespace, name))
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotPreparable(f"claim {namespace}/{name} not found") from None


class Dirs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cdi = root / "cdi"
        self.plugins = root / "plugins"
        self.checkpoint = self.plugins / DRIVER / "checkpoint.json"
        self.host = FakeHost(root / "host")
        self.host.nvidia_gpu("0000:3b:00.0", uuid=GPU_UUID, minor=0)
        self.host.proc_devices("195 nvidia-frontend")
        self.host.nvme(0, serial=NVME_SERIAL, address="0000:5e:00.0")

    def settings(self) -> NodePluginSettings:
        return NodePluginSettings(
            node_name=NODE,
            plugins_dir=self.plugins,
            cdi_dir=self.cdi,
            host_root=self.host.root,
            device_wait_seconds=5,
            device_poll_seconds=0.05,
        )

    def plugin(self, read_claim: Claims, **kwargs: Any) -> NodePlugin:
        return NodePlugin(
            driver=DRIVER,
            node=NODE,
            settings=self.settings(),
            read_claim=read_claim,
            ready_types=(READY,),
            failed_types=(FAILED,),
            checkpoint=Checkpoint(self.checkpoint),
            **kwargs,
        )

    def specs(self) -> list[str]:
        return sorted(p.name for p in self.cdi.iterdir()) if self.cdi.exists() else []

    def spec_file(self, name: str, content: str = "{}") -> None:
        self.cdi.mkdir(parents=True, exist_ok=True)
        (self.cdi / name).write_text(content)

    def on_disk(self) -> dict[str, ClaimRecord]:
        return decode(self.checkpoint.read_bytes())


@pytest.fixture
def dirs(tmp_path: Path) -> Dirs:
    return Dirs(tmp_path)


def ids(result: PrepareResult) -> list[str]:
    return [i for d in result.devices for i in d.cdi_device_ids]


# --- start -------------------------------------------------------------------------------------


def test_a_corrupt_checkpoint_is_rebuilt_from_the_cdi_spec_names(dirs: Dirs) -> None:
    dirs.checkpoint.parent.mkdir(parents=True)
    dirs.checkpoint.write_text("{not json")
    for name in (GPU_SPEC_A, NVME_SPEC_A, GPU_SPEC_B, "other.example.com-gpu_x.json"):
        dirs.spec_file(name)
    plugin = dirs.plugin(Claims())
    notes = plugin.start()
    assert notes[0].startswith(f"checkpoint {dirs.checkpoint} is unusable (not JSON: ")
    assert notes[1:] == ["checkpoint rebuilt from 3 CDI spec(s) of 2 claim(s)"]
    expected = {
        UID_A: ClaimRecord(UID_A, "", "", PREPARING, (GPU_SPEC_A, NVME_SPEC_A)),
        UID_B: ClaimRecord(UID_B, "", "", PREPARING, (GPU_SPEC_B,)),
    }
    assert plugin.checkpoint.records == expected
    assert dirs.on_disk() == expected
    assert dirs.specs() == sorted(
        [GPU_SPEC_A, NVME_SPEC_A, GPU_SPEC_B, "other.example.com-gpu_x.json"]
    )
    assert any(p.name.startswith("checkpoint.json.bad-") for p in dirs.checkpoint.parent.iterdir())


def test_our_spec_files_no_uid_can_be_read_from_are_removed_on_a_rebuild(dirs: Dirs) -> None:
    dirs.checkpoint.parent.mkdir(parents=True)
    dirs.checkpoint.write_text("[]")
    dirs.spec_file(f"{DRIVER}-gpu.json")
    dirs.spec_file(GPU_SPEC_A)
    notes = dirs.plugin(Claims()).start()
    assert f"removed CDI spec {DRIVER}-gpu.json: no prepared claim owns it" in notes
    assert dirs.specs() == [GPU_SPEC_A]


async def test_a_rebuilt_claim_is_prepared_again_and_its_stale_spec_removed(dirs: Dirs) -> None:
    dirs.checkpoint.parent.mkdir(parents=True)
    dirs.checkpoint.write_text("garbage")
    dirs.spec_file(GPU_SPEC_A)
    dirs.spec_file(NVME_SPEC_A)
    claims = Claims(claim(REF_A, [GPU]))
    plugin = dirs.plugin(claims)
    plugin.start()
    result = (await plugin.prepare([REF_A]))[UID_A]
    assert result.error == ""
    assert ids(result) == [f"{DRIVER}/gpu={UID_A}-gpu-0"]
    assert claims.reads == [("default", "claim-a")]
    assert dirs.specs() == [GPU_SPEC_A]
    assert dirs.on_disk()[UID_A].state == PREPARED
    assert dirs.on_disk()[UID_A].name == "claim-a"


async def test_a_rebuilt_claim_is_unprepared_by_uid(dirs: Dirs) -> None:
    dirs.checkpoint.parent.mkdir(parents=True)
    dirs.checkpoint.write_text("garbage")
    dirs.spec_file(GPU_SPEC_B)
    plugin = dirs.plugin(Claims())
    plugin.start()
    assert await plugin.unprepare([REF_B]) == {UID_B: ""}
    assert dirs.specs() == []
    assert dirs.on_disk() == {}


def test_specs_no_claim_owns_are_removed_on_start(dirs: Dirs) -> None:
    Checkpoint(dirs.checkpoint).put(
        ClaimRecord(UID_A, "default", "claim-a", PREPARED, (GPU_SPEC_A,))
    )
    for name in (GPU_SPEC_A, GPU_SPEC_B, NVME_SPEC_A, "other.example.com-gpu_x.json"):
        dirs.spec_file(name)
    plugin = dirs.plugin(Claims())
    notes = plugin.start()
    assert sorted(notes) == [
        f"removed CDI spec {GPU_SPEC_B}: no prepared claim owns it",
        f"removed CDI spec {NVME_SPEC_A}: no prepared claim owns it",
    ]
    assert dirs.specs() == sorted([GPU_SPEC_A, "other.example.com-gpu_x.json"])
    assert set(plugin.checkpoint.records) == {UID_A}


def test_a_start_with_nothing_on_disk_notes_nothing(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims())
    assert plugin.start() == []
    assert plugin.checkpoint.records == {}
    assert not dirs.checkpoint.exists()


def test_an_unlistable_cdi_directory_is_noted_and_the_start_goes_on(dirs: Dirs) -> None:
    dirs.cdi.write_text("a file, not a directory")
    plugin = dirs.plugin(Claims())
    notes = plugin.start()
    assert len(notes) == 1 and notes[0].startswith(f"cannot list CDI specs in {dirs.cdi}: ")


# --- prepare -----------------------------------------------------------------------------------


async def test_a_claim_is_prepared_with_a_valid_spec_and_a_prepared_record(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU, NVME])))
    plugin.start()
    result = (await plugin.prepare([REF_A]))[UID_A]
    assert result.error == ""
    assert ids(result) == [f"{DRIVER}/gpu={UID_A}-gpu-0", f"{DRIVER}/nvme={UID_A}-nvme-0"]
    assert dirs.specs() == [GPU_SPEC_A, NVME_SPEC_A]
    gpu_spec = read_spec_file(dirs.cdi / GPU_SPEC_A)
    paths = [n["path"] for n in gpu_spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/nvidia0", "/dev/nvidiactl"]
    read_spec_file(dirs.cdi / NVME_SPEC_A)
    saved = dirs.on_disk()[UID_A]
    assert (saved.state, saved.specs, saved.devices) == (
        PREPARED,
        (GPU_SPEC_A, NVME_SPEC_A),
        result.devices,
    )


async def test_a_repeated_prepare_gets_the_same_answer_without_reading_again(dirs: Dirs) -> None:
    claims = Claims(claim(REF_A, [GPU]))
    plugin = dirs.plugin(claims)
    plugin.start()
    first = await plugin.prepare([REF_A])
    spec_bytes = (dirs.cdi / GPU_SPEC_A).read_bytes()
    checkpoint_bytes = dirs.checkpoint.read_bytes()
    second = await plugin.prepare([REF_A])
    assert second == first
    assert claims.reads == [("default", "claim-a")]
    assert (dirs.cdi / GPU_SPEC_A).read_bytes() == spec_bytes
    assert dirs.checkpoint.read_bytes() == checkpoint_bytes


async def test_a_prepared_claim_whose_spec_vanished_is_prepared_again(dirs: Dirs) -> None:
    claims = Claims(claim(REF_A, [GPU]))
    plugin = dirs.plugin(claims)
    first = await plugin.prepare([REF_A])
    (dirs.cdi / GPU_SPEC_A).unlink()
    assert await plugin.prepare([REF_A]) == first
    assert len(claims.reads) == 2
    assert dirs.specs() == [GPU_SPEC_A]


async def test_a_restarted_plugin_answers_a_repeat_from_its_checkpoint(dirs: Dirs) -> None:
    first = await dirs.plugin(Claims(claim(REF_A, [GPU]))).prepare([REF_A])
    claims = Claims()
    again = dirs.plugin(claims)
    assert again.start() == []
    assert await again.prepare([REF_A]) == first
    assert claims.reads == []


async def test_each_claim_of_a_call_gets_its_own_answer(dirs: Dirs) -> None:
    elsewhere = ClaimRef("default", "claim-c", "cccccccc-0000-4000-8000-000000000003")
    unknown = ClaimRef("default", "nope", "dddddddd-0000-4000-8000-000000000004")
    claims = Claims(claim(REF_A, [GPU]), claim(elsewhere, [NVME], node="node-b"))
    answer = await dirs.plugin(claims).prepare([REF_A, elsewhere, unknown])
    assert answer[UID_A].error == ""
    assert "allocated to node node-b, not to this node node-a" in answer[elsewhere.uid].error
    assert answer[unknown.uid].error == "claim default/nope not found"
    assert dirs.specs() == [GPU_SPEC_A]
    assert set(dirs.on_disk()) == {UID_A}


async def test_a_claim_with_no_devices_of_ours_is_prepared_with_nothing(dirs: Dirs) -> None:
    other = claim(REF_A, [GPU])
    for result in other["status"]["allocation"]["devices"]["results"]:
        result["driver"] = "other.example.com"
    plugin = dirs.plugin(Claims(other))
    assert await plugin.prepare([REF_A]) == {UID_A: PrepareResult()}
    assert dirs.specs() == []
    assert plugin.checkpoint.records == {}


async def test_a_device_not_attached_when_the_deadline_is_spent_is_an_error(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU], ready=False)))
    # One second left of the kubelet's deadline is the margin kept: no time to wait.
    result = (await plugin.prepare([REF_A], time_remaining_s=1.0))[UID_A]
    assert result.error.startswith(
        f"claim {REF_A}: device rack-1/gpu-0 is not attached to this node {NODE} and verified"
    )
    assert result.devices == ()
    assert plugin.checkpoint.records == {}


async def test_a_device_not_on_the_host_is_an_error_naming_it(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU, MISSING])))
    result = (await plugin.prepare([REF_A], time_remaining_s=1.0))[UID_A]
    assert result.error.startswith(f"claim {REF_A}: device gpu-9 (gpu) not found on this host")
    assert dirs.specs() == []
    assert plugin.checkpoint.records == {}


async def test_a_device_not_found_ends_the_claims_other_searches(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One device is not on the host while another's search is still going: the answer must
    # not leave that search running (the autouse leak check fails the test otherwise).
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU, MISSING])))
    ended: list[str] = []
    original = plugin._find

    async def find(identity: Any, deadline: float) -> Any:
        if identity.device == "gpu-0":
            try:
                await asyncio.Event().wait()  # a search that is slow to end
            finally:
                ended.append(identity.device)
        return await original(identity, deadline)

    monkeypatch.setattr(plugin, "_find", find)
    result = (await plugin.prepare([REF_A], time_remaining_s=0.5))[UID_A]
    assert "device gpu-9 (gpu) not found on this host" in result.error
    assert ended == ["gpu-0"]
    assert dirs.specs() == []


# --- unprepare ---------------------------------------------------------------------------------


async def test_unprepare_of_an_unknown_claim_succeeds_and_changes_nothing(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU])))
    await plugin.prepare([REF_A])
    before = (dirs.specs(), dirs.checkpoint.read_bytes())
    assert await plugin.unprepare([REF_B]) == {UID_B: ""}
    assert (dirs.specs(), dirs.checkpoint.read_bytes()) == before
    assert set(plugin.checkpoint.records) == {UID_A}


async def test_unprepare_on_an_empty_plugin_writes_nothing(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims())
    assert await plugin.unprepare([REF_A]) == {UID_A: ""}
    assert not dirs.checkpoint.exists()
    assert dirs.specs() == []


async def test_unprepare_removes_the_claims_specs_and_forgets_it(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU, NVME])))
    await plugin.prepare([REF_A])
    assert await plugin.unprepare([REF_A]) == {UID_A: ""}
    assert dirs.specs() == []
    assert dirs.on_disk() == {}
    assert await plugin.unprepare([REF_A]) == {UID_A: ""}


async def test_unprepare_removes_specs_with_the_uid_the_checkpoint_does_not_know(
    dirs: Dirs,
) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU])))
    await plugin.prepare([REF_A])
    dirs.spec_file(f"{DRIVER}-fpga_{UID_A}.json")
    dirs.spec_file(GPU_SPEC_B)
    dirs.spec_file(f"other.example.com-gpu_{UID_A}.json")
    assert await plugin.unprepare([REF_A]) == {UID_A: ""}
    assert dirs.specs() == sorted([GPU_SPEC_B, f"other.example.com-gpu_{UID_A}.json"])


async def test_unprepare_of_an_unknown_claim_still_removes_its_specs(dirs: Dirs) -> None:
    dirs.spec_file(GPU_SPEC_A)
    plugin = dirs.plugin(Claims())
    assert await plugin.unprepare([REF_A]) == {UID_A: ""}
    assert dirs.specs() == []


async def test_unprepare_reports_an_unlistable_cdi_directory_per_claim(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims())
    dirs.cdi.write_text("a file")
    answer = await plugin.unprepare([REF_A])
    assert answer[UID_A].startswith(f"claim {REF_A}: cannot list CDI specs in {dirs.cdi}: ")


# --- a failing spec write ----------------------------------------------------------------------


class FailingWriter:
    """Writes specs for real until it meets ``fail_on``, which it refuses as a full disk would."""

    def __init__(self, fail_on: str) -> None:
        self.fail_on = fail_on
        self.calls: list[str] = []

    def __call__(self, directory: Path, file_name: str, spec: Mapping[str, object]) -> Path:
        self.calls.append(file_name)
        if file_name == self.fail_on:
            path = directory / file_name
            raise cdi.CdiWriteError(
                f"cannot write CDI spec {path}: No space left on device", path, 28
            )
        return cdi.write_spec(directory, file_name, spec)


async def test_a_failed_spec_write_is_a_claim_error_and_leaves_it_preparing(dirs: Dirs) -> None:
    writer = FailingWriter(NVME_SPEC_A)
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU, NVME]), claim(REF_B, [GPU])), write_spec=writer)
    answer = await plugin.prepare([REF_A])
    assert answer == {
        UID_A: PrepareResult(
            error=f"claim {REF_A}: cannot write CDI spec {dirs.cdi / NVME_SPEC_A}: "
            "No space left on device"
        )
    }
    assert writer.calls == [GPU_SPEC_A, NVME_SPEC_A]
    # The intent was recorded before the writes: the spec that did get written is owned.
    expected = ClaimRecord(UID_A, "default", "claim-a", PREPARING, (GPU_SPEC_A, NVME_SPEC_A))
    assert plugin.checkpoint.records == {UID_A: expected}
    assert dirs.on_disk() == {UID_A: expected}
    assert dirs.specs() == [GPU_SPEC_A]


async def test_a_failed_write_leaves_what_a_restart_keeps_and_unprepare_removes(
    dirs: Dirs,
) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU, NVME])), write_spec=FailingWriter(NVME_SPEC_A))
    await plugin.prepare([REF_A])
    restarted = dirs.plugin(Claims())
    # The preparing record still owns the written spec: a restart keeps both.
    assert restarted.start() == []
    assert restarted.checkpoint.records[UID_A].state == PREPARING
    assert dirs.specs() == [GPU_SPEC_A]
    assert await restarted.unprepare([REF_A]) == {UID_A: ""}
    assert dirs.specs() == []
    assert dirs.on_disk() == {}


async def test_a_prepare_after_a_failed_write_finishes_the_claim(dirs: Dirs) -> None:
    claims = Claims(claim(REF_A, [GPU, NVME]))
    failing = dirs.plugin(claims, write_spec=FailingWriter(NVME_SPEC_A))
    await failing.prepare([REF_A])
    working = dirs.plugin(claims)
    working.start()
    result = (await working.prepare([REF_A]))[UID_A]
    assert result.error == ""
    assert dirs.specs() == [GPU_SPEC_A, NVME_SPEC_A]
    assert dirs.on_disk()[UID_A].state == PREPARED


async def test_a_failed_write_of_one_claim_does_not_stop_the_others(dirs: Dirs) -> None:
    writer = FailingWriter(GPU_SPEC_A)
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU]), claim(REF_B, [GPU])), write_spec=writer)
    answer = await plugin.prepare([REF_A, REF_B])
    assert answer[UID_A].error.startswith(f"claim {REF_A}: cannot write CDI spec ")
    assert answer[UID_B].error == ""
    assert {u: r.state for u, r in dirs.on_disk().items()} == {UID_A: PREPARING, UID_B: PREPARED}
    assert dirs.specs() == [GPU_SPEC_B]


async def test_a_checkpoint_that_cannot_be_written_is_a_claim_error(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU])))
    dirs.plugins.write_text("a file where the plugins directory should be")
    result = (await plugin.prepare([REF_A]))[UID_A]
    assert result.error.startswith(f"claim {REF_A}: cannot write checkpoint {dirs.checkpoint}: ")
    assert dirs.specs() == []
    assert plugin.checkpoint.records == {}


def test_a_rebuild_goes_by_spec_names_not_their_content(dirs: Dirs) -> None:
    dirs.checkpoint.parent.mkdir(parents=True)
    dirs.checkpoint.write_text("garbage")
    dirs.spec_file(GPU_SPEC_A, "not json")
    plugin = dirs.plugin(Claims())
    plugin.start()
    assert dirs.specs() == [GPU_SPEC_A]
    assert json.loads(dirs.checkpoint.read_text())["claims"][UID_A]["specs"] == [GPU_SPEC_A]


class Flaky(Claims):
    """Claims whose first ``failures`` reads fail the way an unreachable API server does."""

    def __init__(self, failures: int, *claims: dict[str, Any]) -> None:
        super().__init__(*claims)
        self.failures = failures

    async def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        if self.failures > 0:
            self.failures -= 1
            self.reads.append((namespace, name))
            raise ClaimReadFailed("read ResourceClaim: Cannot connect to host")
        return await super().__call__(namespace, name)


async def test_a_failed_read_is_tried_again_within_the_deadline(dirs: Dirs) -> None:
    claims = Flaky(3, claim(REF_A, [GPU]))
    plugin = dirs.plugin(claims)
    result = (await plugin.prepare([REF_A]))[UID_A]
    assert result.error == "" and len(result.devices) == 1
    assert len(claims.reads) == 4


async def test_a_read_that_keeps_failing_ends_at_the_deadline_with_its_reason(dirs: Dirs) -> None:
    plugin = dirs.plugin(Flaky(10**6, claim(REF_A, [GPU])))
    result = (await plugin.prepare([REF_A], time_remaining_s=1.3))[UID_A]
    assert result.error == f"claim {REF_A}: read ResourceClaim: Cannot connect to host"


async def test_a_claim_waiting_for_its_attach_does_not_hold_up_the_others(dirs: Dirs) -> None:
    plugin = dirs.plugin(Claims(claim(REF_A, [GPU], ready=False), claim(REF_B, [GPU])))
    waiting = asyncio.create_task(plugin.prepare([REF_A]))
    other = await asyncio.wait_for(plugin.prepare([REF_B]), timeout=4)
    assert other[UID_B].error == "" and not waiting.done()
    assert await asyncio.wait_for(plugin.unprepare([REF_B]), timeout=4) == {UID_B: ""}
    assert not waiting.done()
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


def test_an_error_for_the_kubelet_names_the_claim_and_fits_one_bounded_line() -> None:
    assert claim_message(REF_A, ValueError("bad\nthing")) == f"claim {REF_A}: bad thing"
    assert claim_message(REF_A, ValueError(f"claim {REF_A}: x")) == f"claim {REF_A}: x"
    assert claim_message(REF_A, TimeoutError()) == f"claim {REF_A}: TimeoutError"
    long = claim_message(REF_A, ValueError("y" * 10_000))
    assert len(long) == MAX_ERROR_CHARS and long.endswith("...")
