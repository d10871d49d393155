"""The catalogue's cost and memory terms (``ModeSpec.flows``, ``server_messages``,
``worker_syncs``, ``table_parts``) and the models' own widths, against hand-written
oracles: what each mode moves per step as docs/placement.md and bench/scaling.py state it."""

from pshybrid.models import DCN, DLRM, MODELS, WDL, DeepFM
from pshybrid.registry import MODES, Flow, padded
from pshybrid.schema import Schema


def test_flows_by_mode_in_order():
    E, P, s = 17, 1000, 4
    row, dense = E * s, padded(P) * s
    assert MODES["hybrid"].flows(E, P, s, True) == (
        Flow("pull", "rows", row), Flow("p2p", "rows", 8), Flow("p2p", "rows", row),
        Flow("allreduce", "dense", P * s))
    assert MODES["hybrid"].flows(E, P, s, False) == (
        Flow("pull", "rows", row), Flow("rma_acc", "rows", row), Flow("allreduce", "dense", P * s))
    assert MODES["ps"].flows(E, P, s, True) == (
        Flow("pull", "rows", row), Flow("p2p", "rows", 8), Flow("p2p", "rows", row),
        Flow("pull", "dense", dense), Flow("rma_acc", "dense", dense))
    assert MODES["allreduce"].flows(E, P, s, True) == (
        Flow("allgather", "rows", 8 + row), Flow("allreduce", "dense", P * s))
    assert MODES["auto"].flows(E, P, s, True) == ()
    assert dense == 1024 * 4


def test_step_bytes_and_messages():
    assert Flow("pull", "rows", 68).step_bytes(10.0, 30.0) == 680.0
    assert Flow("allgather", "rows", 76).step_bytes(10.0, 30.0) == 30.0 * 76  # every block
    assert Flow("allreduce", "dense", 4000).step_bytes(10.0, 30.0) == 4000
    assert [MODES[m].server_messages(ids) for m in ("hybrid", "ps") for ids in (True, False)] \
        == [3, 2, 5, 4]
    assert [MODES[m].worker_syncs for m in ("hybrid", "ps", "allreduce")] == [1, 0, 4]


def test_table_parts_per_role():
    assert MODES["allreduce"].table_parts(0) == (
        ("worker", "embedding table"), ("worker", "exchanged gradient rows"))
    hyb = (("server", "shard of the embedding table"), ("server", "rows and gradients of a step"))
    assert MODES["hybrid"].table_parts(2) == hyb
    assert MODES["ps"].table_parts(2) == hyb + (("server", "shard of the dense table"),
                                                ("worker", "pulled dense table"))


def test_models_state_their_widths():
    sch = Schema(13, (10,) * 26)  # d = 13 + 26 * 16 = 429 at dim 16
    assert [MODELS[m].cross_layers for m in ("wdl", "deepfm", "dcn", "dlrm")] == \
        [False, False, True, False]
    assert DCN.counted_params(sch, 16, 3) == 2 * 429 * 3
    assert DCN.extra_widths(sch, 16, 3) == 429 * 3 * 4
    assert DLRM.extra_widths(sch, 16, 3) == 27 * 16 * 2 + 27 * 26
    assert WDL.extra_widths(sch, 16, 3) == DeepFM.counted_params(sch, 16, 3) == 0


def test_an_allgather_flow_is_three_collectives():
    """ReplicatedSparse.exchange: the counts (8 B), the ids (8 B each), the rows; the
    planner and bench/scaling price one ring Allgather per block (test_scaling's
    test_allgather_receives_w_minus_1_blocks: three latencies)."""
    f = MODES["allreduce"].flows(17, 1000, 4, True)[0]
    assert f.gathered and f.blocks(100.0) == (8.0, 800.0, 100.0 * 68)
