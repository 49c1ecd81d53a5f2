"""Pod-scale input, evaluation and checkpoints, on gloo CPU processes on 127.0.0.1 (tests/multidevice.py's
``share*`` cases): each of P processes reads only its 1/P of every global batch, and P processes train,
evaluate, resume after kill -9 and restore each other's checkpoints as one process with P devices does.

Stage 1, side by side: one process with 4 devices (the reference runs on meshes data=4 and data=2, the latter
checkpointing at steps 4 and 8), 4 processes of one device (8 steps), 2 processes of one device that checkpoint
at step 4 and kill themselves with SIGKILL after step 6. Stage 2, side by side: the 2 processes resume their
run, then resume the reference's step-4 checkpoint (1 -> 2 processes); one process of one device resumes a copy
of the 2-process step-4 checkpoint (2 -> 1).
"""

import json
import shutil
import signal
import socket

import numpy as np
import pytest

from multidevice import report_of, start_cases

TOL = 1e-5  # a dense ViT: the processes sum the same numbers as one process's devices, in another order
BATCH, STEPS = 16, 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(num_processes: int, *args: str):
    port = free_port()
    return [start_cases(1, "share", "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(num_processes),
                        "--process-id", str(i), *args) for i in range(num_processes)]


def killed_report(process) -> dict:
    """The report a ``--kill`` process printed before it sent itself SIGKILL."""
    out, err = process.communicate(timeout=600)
    assert process.returncode == -signal.SIGKILL, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hosts")
    one, two = root / "one", root / "two"
    reference = start_cases(4, "share_reference", "--workdir", str(one))
    four = start_group(4, "--workers", "0")
    killed = start_group(2, "--workers", "1", "--workdirs", str(two), "--stop-after", "6", "--kill")
    stage1 = {"reference": report_of(reference, timeout=600), "four": [report_of(p, timeout=600) for p in four],
              "killed": [killed_report(p) for p in killed]}
    one_at_4, two_at_4 = root / "one_at_4", root / "two_at_4"
    shutil.copytree(one, one_at_4)
    shutil.rmtree(one_at_4 / "checkpoints" / "8")
    shutil.copytree(two, two_at_4)
    resumed = start_group(2, "--workers", "0", "--workdirs", str(two), str(one_at_4))
    single = start_cases(1, "share_one", "--workdir", str(two_at_4))
    stage2 = {"resumed": [report_of(p, timeout=600) for p in resumed], "single": report_of(single, timeout=600)}
    return {**stage1, **stage2}


def close(a: dict, b: dict, steps) -> float:
    return max(abs(a[str(s)] - b[str(s)]) for s in steps)


def test_each_process_reads_its_share_of_the_one_process_batches(runs):
    digests = runs["reference"]["digests"]
    assert len(set(digests["1"][0])) == STEPS  # eight different global batches
    for group, p in (("four", 4), ("killed", 2)):
        for i, r in enumerate(runs[group]):
            assert (r["process"], r["processes"], r["rows"]) == (i, p, [i * BATCH // p, (i + 1) * BATCH // p])
            assert r["digests"] == digests[str(p)][i], (group, i)  # --workers 1 for the 2 processes: the same


def test_images_read_per_process(runs):
    for r in runs["four"]:
        assert r["runs"][0]["images_read"] == STEPS * BATCH // 4
    for r in runs["killed"]:
        assert r["runs"][0]["images_read"] == 6 * BATCH // 2
    for r in runs["resumed"]:  # resumed at step 4: steps 5-8
        assert [run["images_read"] for run in r["runs"]] == [4 * BATCH // 2] * 2
    assert runs["reference"]["data=2"]["images_read"] == STEPS * BATCH  # one process reads whole batches


def test_a_batch_that_does_not_split_over_the_processes_is_refused(runs):
    for group, p in (("four", 4), ("killed", 2)):
        for r in runs[group]:
            assert r["refused"].startswith(f"batch_size={2 * p + 1} does not split over {p} processes"), r["refused"]


def test_processes_train_and_evaluate_like_one_process_with_their_devices(runs):
    reference = runs["reference"]
    for r in runs["four"]:
        run, want = r["runs"][0], reference["data=4"]
        assert sorted(map(int, run["losses"])) == list(range(1, STEPS + 1))
        assert close(run["losses"], want["losses"], range(1, STEPS + 1)) <= TOL
        assert run["test"]["examples"] == want["test"]["examples"] == 30
        assert abs(run["test"]["accuracy"] - want["test"]["accuracy"]) <= TOL
        assert abs(run["test"]["loss"] - want["test"]["loss"]) <= TOL
    assert close(reference["one_device"]["losses"], reference["data=2"]["losses"], range(1, STEPS + 1)) <= TOL
    assert abs(reference["one_device"]["test"]["loss"] - reference["data=2"]["test"]["loss"]) <= TOL


def test_kill_9_in_every_process_resumes_to_the_uninterrupted_run(runs):
    want = runs["reference"]["data=2"]
    for r in runs["killed"]:
        assert close(r["runs"][0]["losses"], want["losses"], range(1, 7)) <= TOL
    for r in runs["resumed"]:
        run = r["runs"][0]
        assert run["resumed_from"] == 4 and sorted(map(int, run["losses"])) == list(range(1, STEPS + 1))
        assert close(run["losses"], want["losses"], range(5, STEPS + 1)) <= TOL
        assert abs(run["test"]["accuracy"] - want["test"]["accuracy"]) <= TOL
        assert abs(run["test"]["loss"] - want["test"]["loss"]) <= TOL
    assert np.isfinite([r["runs"][0]["test"]["loss"] for r in runs["resumed"]]).all()


@pytest.mark.parametrize("direction", ["1 -> 2", "2 -> 1"])
def test_checkpoints_restore_across_process_counts(runs, direction):
    want = runs["reference"]["data=2"]
    restored = [r["runs"][1] for r in runs["resumed"]] if direction == "1 -> 2" else [runs["single"]]
    for run in restored:
        assert run["resumed_from"] == 4
        assert close(run["losses"], want["losses"], range(5, STEPS + 1)) <= TOL
        assert abs(run["test"]["loss"] - want["test"]["loss"]) <= TOL
