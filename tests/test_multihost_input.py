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

# The gloo runs (marked slow): 163 s wall, 167 CPU-s for the whole file on the 2-core reference machine at load
# average 5-7; 375 s at load 14.
TOL = 1e-5  # a dense ViT: the processes sum the same numbers as one process's devices, in another order
BATCH, STEPS = 16, 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(num_processes: int, *args: str, env: dict):
    port = free_port()
    return [start_cases(1, "share", "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(num_processes),
                        "--process-id", str(i), *args, env=env) for i in range(num_processes)]


def killed_report(process) -> dict:
    """The report a ``--kill`` process printed before it sent itself SIGKILL. A process whose peer died first may
    instead be ended by JAX's distributed client (SIGABRT: "another task died"), which runs no clean-up either."""
    out, err = process.communicate(timeout=600)
    assert process.returncode in (-signal.SIGKILL, -signal.SIGABRT), err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hosts")
    one, two = root / "one", root / "two"
    # Stage 2 compiles what stage 1 compiled (same programs, new processes): JAX's persistent cache, this test's own
    env = {"JAX_COMPILATION_CACHE_DIR": str(root / "jax_cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    reference = start_cases(4, "share_reference", "--workdir", str(one), env=env)
    four = start_group(4, "--workers", "0", env=env)
    # the training runs' batches built by a Grain worker in each process: the same losses and images read
    killed = start_group(2, "--workers", "1", "--workdirs", str(two), "--stop-after", "6", "--kill", env=env)
    stage1 = {"reference": report_of(reference, timeout=600), "four": [report_of(p, timeout=600) for p in four],
              "killed": [killed_report(p) for p in killed]}
    one_at_4, two_at_4 = root / "one_at_4", root / "two_at_4"
    shutil.copytree(one, one_at_4)
    shutil.rmtree(one_at_4 / "checkpoints" / "8")
    shutil.copytree(two, two_at_4)
    resumed = start_group(2, "--workers", "0", "--workdirs", str(two), str(one_at_4), env=env)
    single = start_cases(1, "share_one", "--workdir", str(two_at_4), env=env)
    stage2 = {"resumed": [report_of(p, timeout=600) for p in resumed], "single": report_of(single, timeout=600)}
    return {**stage1, **stage2}


def close(a: dict, b: dict, steps) -> float:
    return max(abs(a[str(s)] - b[str(s)]) for s in steps)


@pytest.mark.slow
def test_each_process_reads_its_share_of_the_one_process_batches(runs):
    digests = runs["reference"]["digests"]
    assert len(set(digests["1"][0])) == STEPS  # eight different global batches
    for group, p in (("four", 4), ("killed", 2)):
        for i, r in enumerate(runs[group]):
            assert (r["process"], r["processes"], r["rows"]) == (i, p, [i * BATCH // p, (i + 1) * BATCH // p])
            assert r["digests"] == digests[str(p)][i], (group, i)


@pytest.mark.slow
def test_images_read_per_process(runs):
    for r in runs["four"]:
        assert r["runs"][0]["images_read"] == STEPS * BATCH // 4
    for r in runs["killed"]:
        assert r["runs"][0]["images_read"] == 6 * BATCH // 2
    for r in runs["resumed"]:  # resumed at step 4: steps 5-8
        assert [run["images_read"] for run in r["runs"]] == [4 * BATCH // 2] * 2
    assert runs["reference"]["data=2"]["images_read"] == STEPS * BATCH  # one process reads whole batches


@pytest.mark.slow
def test_a_batch_that_does_not_split_over_the_processes_is_refused(runs):
    for group, p in (("four", 4), ("killed", 2)):
        for r in runs[group]:
            assert r["refused"].startswith(f"batch_size={2 * p + 1} does not split over {p} processes"), r["refused"]


@pytest.mark.slow
def test_processes_train_and_evaluate_like_one_process_with_their_devices(runs):
    reference = runs["reference"]
    for r in runs["four"]:
        run, want = r["runs"][0], reference["data=4"]
        assert sorted(map(int, run["losses"])) == list(range(1, STEPS + 1))
        assert close(run["losses"], want["losses"], range(1, STEPS + 1)) <= TOL
        assert run["test"]["examples"] == want["test"]["examples"] == 30
        assert abs(run["test"]["accuracy"] - want["test"]["accuracy"]) <= TOL
        assert abs(run["test"]["loss"] - want["test"]["loss"]) <= TOL


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["1 -> 2", "2 -> 1"])
def test_checkpoints_restore_across_process_counts(runs, direction):
    want = runs["reference"]["data=2"]
    restored = [r["runs"][1] for r in runs["resumed"]] if direction == "1 -> 2" else [runs["single"]]
    for run in restored:
        assert run["resumed_from"] == 4
        assert close(run["losses"], want["losses"], range(5, STEPS + 1)) <= TOL
        assert abs(run["test"]["loss"] - want["test"]["loss"]) <= TOL


# In this process (one device): the pieces the processes above use.


def test_pipeline_rows_are_that_slice_of_every_global_batch():
    from moe_course.data.pipeline import close_pipeline, train_pipeline
    from multidevice import tiny_digits

    dataset = tiny_digits()
    whole = train_pipeline(dataset, BATCH, seed=3, start_step=4, stop_step=7)
    share = train_pipeline(dataset, BATCH, seed=3, start_step=4, stop_step=7, rows=(4, 8))
    try:
        for full, part in zip(whole, share, strict=True):  # steps 4-6 cross the 5-step epoch
            assert all(np.array_equal(full[key][4:8], part[key]) for key in ("image", "label"))
        assert (whole.images, share.images) == (3 * BATCH, 3 * 4)
    finally:
        close_pipeline(whole)
        close_pipeline(share)
    with pytest.raises(ValueError, match=r"^rows=\(8, 20\) is not allowed; use \(start, stop\) with 0 <= start < "
                                         r"stop <= batch_size=16"):
        train_pipeline(dataset, BATCH, seed=0, rows=(8, 20))


def test_evaluation_shares_pad_into_the_one_process_batches():
    from moe_course.data.base import eval_batches
    from moe_course.train.evaluate import pad_batch
    from multidevice import tiny_digits

    dataset, size = tiny_digits(), 64  # 30 test images: shares of 16 hold 16, 14 (+2 padding), 0 and 0 of them
    whole = [pad_batch(b, size) for b in eval_batches(dataset, "test", size, order_seed=0)]
    shares = [[pad_batch(b, 16) for b in eval_batches(dataset, "test", size, order_seed=0, rows=(i * 16, i * 16 + 16))]
              for i in range(4)]
    assert [len(s) for s in shares] == [len(whole)] * 4 == [1] * 4
    for key in ("image", "label", "mask"):
        assert np.array_equal(np.concatenate([s[0][key] for s in shares]), whole[0][key]), key
    assert [float(s[0]["mask"].sum()) for s in shares] == [16, 14, 0, 0]


def test_process_rows_and_the_split_check():
    import jax

    from moe_course import parallel

    mesh = parallel.make_mesh("data=1", devices=jax.devices()[:1])
    assert parallel.process_rows(mesh, BATCH) == (0, BATCH)
    batch = {"image": np.arange(BATCH * 4, dtype=np.uint8).reshape(BATCH, 2, 2), "label": np.arange(BATCH)}
    placed = parallel.assemble_batch(batch, mesh, BATCH)
    assert all(np.array_equal(np.asarray(placed[k]), batch[k]) for k in batch)
    parallel.check_process_split("batch_size", 32, group_size=4, processes=2)
    with pytest.raises(ValueError, match=r"^eval_batch_size=36 does not split over 4 processes: it must be a "
                                         r"multiple of processes x group_size = 4 x 2 = 8"):
        parallel.check_process_split("eval_batch_size", 36, group_size=2, processes=4)
