"""The NCCL bench's parts that need no GPU: nccl-tests' bus-bandwidth factors, sizes, per-rank element counts,
the expected result of every collective, the launcher's environment handling, and the command with no GPU."""
from __future__ import annotations

import numpy as np
import pytest

from cukernels import comm


def test_bus_factors_are_nccl_tests():
    assert comm.bus_factor("all_reduce", 2) == 1.0
    assert comm.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert comm.bus_factor(op, 4) == pytest.approx(0.75)
    assert comm.bus_factor("send_recv", 8) == 1.0
    with pytest.raises(ValueError, match="op must be one of"):
        comm.bus_factor("broadcast_all", 2)


def test_sizes():
    assert comm.parse_size("8") == 8 and comm.parse_size("64K") == 65536 and comm.parse_size("1G") == 1 << 30
    assert comm.parse_size("16MB") == 16 << 20
    assert comm.sizes_between("8:64") == [8, 16, 32, 64]
    assert comm.sizes_between("1M,1G") == [1 << 20, 1 << 30]
    assert comm.sizes_between("8:1G")[-1] == 1 << 30 and len(comm.sizes_between("8:1G")) == 28
    for bad in ("x", "0", "-1K"):
        with pytest.raises(ValueError, match="size"):
            comm.parse_size(bad)
    with pytest.raises(ValueError, match="upper end"):
        comm.sizes_between("1G:1M")


def test_counts_per_rank():
    # 1 MiB of fp32 over 4 ranks: all-gather takes 64K elements per rank and returns 256K; all-to-all 256K both
    assert comm.counts("all_reduce", 1 << 20, 4, 4) == (262144, 262144)
    assert comm.counts("all_gather", 1 << 20, 4, 4) == (65536, 262144)
    assert comm.counts("reduce_scatter", 1 << 20, 4, 4) == (262144, 65536)
    assert comm.counts("all_to_all", 1 << 20, 4, 4) == (262144, 262144)
    assert comm.counts("send_recv", 8, 4, 2) == (2, 2)
    assert comm.counts("all_gather", 8, 4, 8) == (1, 8)  # never zero elements


def test_rendezvous_environment():
    assert comm.rendezvous_env({}) is None
    rv = comm.rendezvous_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node0",
                              "MASTER_PORT": "1234"})
    assert rv == {"rank": 3, "world": 8, "local_rank": 1, "addr": "node0", "port": 1234, "store_server": False,
                  "store_key": "cukernels.comm.nccl_id.0"}
    slurm = comm.rendezvous_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"})
    assert slurm["rank"] == 2 and slurm["world"] == 4 and slurm["local_rank"] == 0 and slurm["port"] == 29500
    with pytest.raises(ValueError, match="outside WORLD_SIZE"):
        comm.rendezvous_env({"RANK": "4", "WORLD_SIZE": "4"})


def test_store_server_under_torchrun_agent():
    """torchrun (TORCHELASTIC_USE_AGENT_STORE=True) already serves the TCPStore on MASTER_PORT: rank 0 must connect
    as a client there; without the agent store (plain Slurm, or torchrun told otherwise) rank 0 serves it."""
    plain = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29400"}
    assert comm.rendezvous_env(plain)["store_server"] is True
    assert comm.rendezvous_env({**plain, "RANK": "1"})["store_server"] is False
    agent = {**plain, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    rv = comm.rendezvous_env(agent)
    assert rv["store_server"] is False and rv["store_key"] == "cukernels.comm.nccl_id.2"  # fresh key per restart
    assert comm.rendezvous_env({**agent, "TORCHELASTIC_USE_AGENT_STORE": "False"})["store_server"] is True
    assert comm.rendezvous_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})["store_server"] is True
    assert not comm.store_server_here(0, {"TORCHELASTIC_USE_AGENT_STORE": "true"})


def test_store_roles_reach_tcpstore(monkeypatch):
    """What _unique_id_through_store hands TCPStore (a recording stand-in, no network): the server flag from the
    environment's decision, the per-restart key for both the set and the get."""
    import sys
    import types

    made, kv = [], {}

    class Store:
        def __init__(self, addr, port, world, is_master):
            made.append((addr, port, world, is_master))

        def set(self, key, value):
            kv[key] = value

        def get(self, key):
            return kv[key].encode() if isinstance(kv[key], str) else kv[key]

    nccl = types.SimpleNamespace(get_unique_id=lambda: (1, 2, 3))
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "torch.distributed", types.SimpleNamespace(TCPStore=Store))
    cuda = types.SimpleNamespace(nccl=nccl)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n0", "MASTER_PORT": "29400",
           "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert comm._unique_id_through_store(comm.rendezvous_env(env)) == (1, 2, 3)
    assert made == [("n0", 29400, 2, False)] and list(kv) == ["cukernels.comm.nccl_id.0"]


def test_device_index_wraps_the_local_rank():
    """Slurm may give each task only its own GPU while SLURM_LOCALID counts the node's tasks: local % visible."""
    assert comm.device_index(0, 8) == 0 and comm.device_index(5, 8) == 5
    assert comm.device_index(3, 1) == 0 and comm.device_index(5, 2) == 1
    for bad_local, count, words in ((0, 0, "no visible GPU"), (-1, 2, "local rank must be")):
        with pytest.raises(ValueError, match=words):
            comm.device_index(bad_local, count)


def test_tables_show_every_row(capsys):
    rows = [dict(op=op, bytes=b, dtype="fp32", in_place=False, ranks=2, time_us=10.0 * b / 8, algbw_gbs=1.0,
                 busbw_gbs=1.0, correct=op != "send_recv") for op in ("all_reduce", "send_recv") for b in (8, 1 << 20)]
    text = comm.table(rows)
    assert text.count("\n") == 5 and "WRONG" in text and "1M" in text
    seed = comm.seed_table(rows)
    assert "all_reduce" in seed and "send_recv" in seed and "1,048,576" in seed


def test_no_gpu_and_bad_arguments(monkeypatch, capsys):
    from cukernels import cli, device

    monkeypatch.setattr(device, "gpu_available", lambda: False)
    assert comm.main([]) == cli.EXIT_NO_GPU
    assert "No CUDA GPU" in capsys.readouterr().err
    assert comm.main(["--ops", "all_reduce,bogus"]) == cli.EXIT_USAGE
    assert "bogus" in capsys.readouterr().err
    assert comm.main(["--sizes", "1G:1M"]) == cli.EXIT_USAGE


def test_expected_results_follow_the_inputs(monkeypatch):
    """_expected is what the collectives must return for inputs pattern * (rank + 1): checked here against a NumPy
    model of each collective on the same patterns (the pattern source replaced by NumPy)."""
    import types

    fake = types.SimpleNamespace(
        random=types.SimpleNamespace(default_rng=lambda seed: np.random.default_rng(seed)),
        asnumpy=lambda a: np.asarray(a))
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    ranks, n = 4, 8
    pattern = np.random.default_rng(5).integers(-4, 5, size=n).astype(np.float32)
    inputs = [pattern * (r + 1) for r in range(ranks)]
    total = sum(inputs)
    for rank in range(ranks):
        assert np.array_equal(comm._expected("all_reduce", n, n, rank, ranks, 5), total)
        assert np.array_equal(comm._expected("all_gather", n, n * ranks, rank, ranks, 5),
                              np.concatenate(inputs))
        assert np.array_equal(comm._expected("reduce_scatter", n, n // ranks, rank, ranks, 5),
                              total[rank * 2:(rank + 1) * 2])
        block = n // ranks
        assert np.array_equal(comm._expected("all_to_all", n, n, rank, ranks, 5),
                              np.concatenate([inputs[s][rank * block:(rank + 1) * block] for s in range(ranks)]))
        assert np.array_equal(comm._expected("send_recv", n, n, rank, ranks, 5), inputs[(rank - 1) % ranks])
